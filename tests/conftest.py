"""Real databases for every test.

PostgreSQL: ``VERACITY_TEST_DATABASE_URL`` (default ``postgresql://postgres@127.0.0.1:5432/
postgres``); if nothing answers there but PostgreSQL's server binaries exist, a throwaway
cluster is started for the session; otherwise the run stops with one line saying how to get
PostgreSQL. The PostgreSQL tests are never skipped silently.

Isolation: a template database is migrated once per session (per xdist worker process) and
each test gets a database in exactly its state (``pg_url``): a clone of it, or a database an
earlier test of this process used, renamed and reset (tests/_pg.py, ``DatabasePool``). SQLite
tests get their own copy of a file migrated once per session (``sqlite_url``).
``backend`` (parametrized: postgresql, sqlite) runs a test once per backend and names it;
``database_url`` is the fresh database of that backend.

Temporary folders (``tmp_path``: SQLite files, worker logs) go to ``/dev/shm`` when it is a
tmpfs with room and neither ``TMPDIR`` nor ``--basetemp`` says otherwise: the SQLite files are
as real, but a commit's fsync no longer waits for a disk that other work may be keeping busy.

Under pytest-xdist (``make test``), tests marked ``slow`` (they start several processes and
wait on them with deadlines of seconds) all go to one worker (``xdist_group``), so no two of
them run at once, while the other workers go on with the other tests beside them. A test
marked ``slow(alone=True)`` would also keep the other workers from starting a test until it
has ended (``RunLock``), as in a serial run; ``slow(alone="sqlite")`` does so for the test's
SQLite run only. Only the two stalled-worker tests are marked so, for SQLite (a worker
frozen inside a write or its recovery tick holds SQLite's write lock or the tick's file
lock until it resumes: a known limit of that backend, docs/workers.md "Recovery"); the
others' deadlines leave room for a busy machine (README: Tests).

The soak (tests/test_soak.py), two minutes of a subprocess, is started in the background by
the xdist controller as soon as a worker has collected its test; the test, started last,
collects its result (tests/_soak.py).

Processes: the ``veracity`` processes the tests start (``subprocess.Popen``/``run`` of this
virtualenv's ``veracity`` script) are forked by a zygote, one per pytest process, that
imported Veracity once (tests/_zygote.py): each is still a separate process with its own pid,
signalled and waited for as before, but it no longer spends most of its CPU importing.
Everything else, and whatever the zygote cannot reproduce (``preexec_fn``, ``pass_fds``,
``LD_PRELOAD``, ...), execs as before; so do a test marked ``real_exec``'s processes, and
with ``VERACITY_TEST_EXEC=1`` every process.

Fixtures are synchronous (the async store calls run in ``asyncio.run`` on a helper thread) so
they never touch pytest-asyncio's per-test event loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import tempfile
import uuid
import zlib
from collections.abc import Coroutine, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests import _soak, _zygote
from tests._pg import (
    DEFAULT_URL,
    URL_ENV,
    ClusterError,
    DatabasePool,
    TempCluster,
    create_database,
    drop_database,
    find_pg_bin_dir,
    server_answers,
    tmpfs_with_room,
    with_database,
)
from veracity.clock import ManualClock

T = TypeVar("T")

NO_POSTGRES = (
    "PostgreSQL is needed for the tests: set VERACITY_TEST_DATABASE_URL, start one at "
    "127.0.0.1:5432, or install PostgreSQL's server binaries (apt-get install postgresql)"
)


SLOW_GROUP = "slow"
"""The xdist_group of every test marked ``slow``."""


def pytest_configure(config: pytest.Config) -> None:
    chosen = any(os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP"))
    if config.option.basetemp is None and not chosen:
        tmpfs = tmpfs_with_room()
        if tmpfs is not None:
            tempfile.tempdir = str(tmpfs)  # where tmp_path_factory puts its numbered folders
    _zygote.install()  # unless VERACITY_TEST_EXEC=1


def pytest_unconfigure(config: pytest.Config) -> None:
    _zygote.uninstall()  # and wait for the zygote: its CPU time is this process's children's
    if _background_soak is not None:  # the xdist controller's, if the run ended before it
        _background_soak.stop()


_background_soak: _soak.Background | None = None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    """In the xdist controller: once a worker has collected the soak's test, start the soak
    in the background, in the run's base folder (tests/_soak.py), before any test starts."""
    global _background_soak
    if _background_soak is not None or not any(i.startswith(_soak.TEST_ID) for i in ids):
        return
    if find_pg_bin_dir() is None:
        return  # the test itself says what is missing
    factory: pytest.TempPathFactory = node.config._tmp_path_factory  # the workers' parent
    _background_soak = _soak.Background(factory.getbasetemp() / _soak.FOLDER)


LONG_FIRST = (
    "tests/test_outage.py::test_a_database_outage[60s]",  # ~65 s, waiting
    "tests/test_schemathesis.py::",  # ~13 s each, busy: beside the waiting ones
    "tests/generations/test_example_readme.py::",  # ~20 s, waiting
    "tests/test_outage.py::",
)
"""Tests started before the others (in this order), the longest measured: under xdist a
minute-long test that starts near the end of the run makes the run a minute longer."""


LAST = (_soak.TEST_ID,)
"""Tests started after all the others: the soak's, which under xdist only collects the result
of the soak started in the background at the start of the run (tests/_soak.py)."""


def _start_rank(item: pytest.Item) -> tuple[int, int]:
    if runs_alone(item):
        # last of the slow group: an exclusive test waits for every test already running,
        # and early in the run those are the longest (the 60 s outage), the cores idle
        return len(LONG_FIRST) + 2, 0
    for rank, prefix in enumerate(LONG_FIRST):
        if item.nodeid.startswith(prefix):
            return rank, 0
    if item.nodeid.startswith(LAST):
        return len(LONG_FIRST) + 1, 0
    # then module by module, the modules in a fixed order that mixes the folders (a digest of
    # the module's path): tests that mostly wait (reconciler/, worker/: on leases, engines,
    # processes) go beside tests that keep the CPU busy (store/, api/, core/), instead of
    # every xdist worker waiting at once while the cores idle, then all competing for them
    module = item.nodeid.split("::", 1)[0]
    return len(LONG_FIRST), zlib.crc32(module.encode()) if _UNDER_XDIST else 0


_UNDER_XDIST = "PYTEST_XDIST_WORKER" in os.environ


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # the longest first, then the modules mixed, the soak's last (a stable sort: a module's
    # tests keep their order). pytest-xdist's loadgroup hands out the slow group (the most
    # tests) first, then the other tests in this order
    items.sort(key=_start_rank)
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group(SLOW_GROUP))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under ``--dist loadgroup`` (in an xdist worker), a slow test whose group did not take
    fails: xdist sends a test's group to its scheduler as a ``@group`` suffix of the node id,
    which pytest 9.2's node ids silently lose; slow tests would then run side by side."""
    if not getattr(item.config.option, "loadgroup", False):
        return
    if item.get_closest_marker("slow") is not None and not item.nodeid.endswith(f"@{SLOW_GROUP}"):
        pytest.fail(
            f"xdist_group({SLOW_GROUP!r}) did not take: this pytest and pytest-xdist do not "
            "group tests (see the pytest pin in pyproject.toml)",
            pytrace=False,
        )


class RunLock:
    """A readers-writer lock shared by the xdist workers of one run (``flock`` on two files
    in *folder*): a test holds it shared, a slow test exclusively. An exclusive holder first
    takes the turnstile, which new shared holders must pass, so it waits only for the tests
    already running."""

    def __init__(self, folder: Path) -> None:
        self.turnstile = folder / "veracity-tests.turnstile"
        self.lock = folder / "veracity-tests.lock"

    @contextlib.contextmanager
    def hold(self, *, exclusive: bool) -> Iterator[None]:
        with self.turnstile.open("a") as turnstile, self.lock.open("a") as lock:
            if exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_EX)
                fcntl.flock(lock, fcntl.LOCK_EX)
            else:
                fcntl.flock(turnstile, fcntl.LOCK_SH)  # waits while a slow test waits or runs
                fcntl.flock(turnstile, fcntl.LOCK_UN)
                fcntl.flock(lock, fcntl.LOCK_SH)
            yield  # closing the files releases both


def _run_lock(config: pytest.Config) -> RunLock | None:
    """The run's lock in an xdist worker (its basetemp is ``<the run's>/popen-gwN``), else
    ``None``: a single process runs one test at a time anyway."""
    if not hasattr(config, "workerinput") or config.option.basetemp is None:
        return None
    return RunLock(Path(config.option.basetemp).parent)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: waiting is not the test's time
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    lock = _run_lock(item.config)
    with contextlib.ExitStack() as stack:
        if lock is not None:
            stack.enter_context(lock.hold(exclusive=runs_alone(item)))
        if item.get_closest_marker("real_exec") is not None:
            stack.enter_context(_zygote.real_exec())  # its fixtures' processes too
        return (yield)


def runs_alone(item: pytest.Item) -> bool:
    """A test marked ``slow(alone=True)`` runs alone, and one marked
    ``slow(alone="sqlite")`` in its SQLite run (see the module's docstring)."""
    marker = item.get_closest_marker("slow")
    alone = False if marker is None else marker.kwargs.get("alone", False)
    if isinstance(alone, str):
        callspec = getattr(item, "callspec", None)
        return callspec is not None and callspec.params.get("backend") == alone
    return bool(alone)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run *coro* with ``asyncio.run`` on a helper thread: the calling thread's event loop
    state (pytest-asyncio's) is left alone, whether or not a loop is running there."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="veracity-fixture") as pool:
        return pool.submit(asyncio.run, coro).result()


async def _migrate(url: str) -> list[int]:
    from veracity.store import open_store  # lazy: collection must not depend on the store

    store = await open_store(url, pool_size=1)
    try:
        return await store.migrate()
    finally:
        await store.close()


def migrate(url: str) -> list[int]:
    """Apply the store's migrations to the database at *url*."""
    return run_async(_migrate(url))


def _say(config: pytest.Config, message: str) -> None:
    """Print a line even while output is captured (used when a throwaway cluster starts)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if capman is not None and reporter is not None:
        with capman.global_and_fixture_disabled():
            reporter.write("\n")
            reporter.write_line(message)


@pytest.fixture(scope="session")
def pg_server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A PostgreSQL server URL (maintenance database) for the whole session."""
    url = os.environ.get(URL_ENV) or DEFAULT_URL
    if server_answers(url):
        yield url
        return
    bin_dir = find_pg_bin_dir()
    if bin_dir is None:
        pytest.exit(NO_POSTGRES, returncode=3)
    cluster = TempCluster(bin_dir)
    try:
        cluster.start()
    except ClusterError as exc:
        pytest.exit(f"{NO_POSTGRES} (nothing answers at {url}; {exc})", returncode=3)
    try:
        _say(
            request.config,
            f"veracity tests: nothing answers at {url}; started a throwaway PostgreSQL "
            f"cluster at {cluster.url} (from {bin_dir})",
        )
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_template(pg_server_url: str) -> Iterator[str]:
    """Name of a database migrated once per session, cloned for every test."""
    name = f"veracity_tmpl_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    create_database(pg_server_url, name)
    try:
        migrate(with_database(pg_server_url, name))
        yield name
    finally:
        drop_database(pg_server_url, name)


@pytest.fixture(scope="session")
def pg_pool(pg_server_url: str, pg_template: str) -> Iterator[DatabasePool]:
    """The migrated databases this process hands to its tests, one at a time."""
    pool = DatabasePool(pg_server_url, pg_template)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def pg_url(pg_server_url: str, pg_pool: DatabasePool) -> Iterator[str]:
    """URL of a migrated PostgreSQL database for this test only, in exactly the state of
    the freshly migrated template (a new clone, or a used database reset: ``DatabasePool``);
    no other test uses it, or can reach it, while this one runs."""
    name = pg_pool.acquire()
    try:
        yield with_database(pg_server_url, name)
    finally:
        pg_pool.release(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per session (closed: no -wal or -shm file beside it)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "veracity.db"
    migrate(f"sqlite:///{path}")
    leftovers = sorted(p.name for p in path.parent.iterdir() if p != path)
    assert not leftovers, f"the migrated template left {leftovers} beside it"
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    """URL of a migrated SQLite file for this test only: a byte-for-byte copy of the file
    migrated once per session."""
    path = tmp_path / "veracity.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["postgresql", "sqlite"], ids=["postgresql", "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    """``"postgresql"`` or ``"sqlite"``: the backend this test instance runs with. Any test
    using it (directly or through ``database_url``) runs once per backend; a test that
    needs a database of its own (e.g. unmigrated) can branch on it without building
    ``database_url``."""
    name: str = request.param
    return name


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database URL for ``backend`` (``pg_url`` or ``sqlite_url``,
    resolved lazily so a SQLite-only run never needs PostgreSQL)."""
    url: str = request.getfixturevalue("pg_url" if backend == "postgresql" else "sqlite_url")
    return url


@pytest.fixture
def clock() -> ManualClock:
    """A manual clock for the test, shared by every store it opens with ``clock=``."""
    return ManualClock()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Any]:
    """Worker processes of this test (tests.worker._procs.Processes): all ended at
    teardown, their logs printed (pytest shows them when the test failed)."""
    from tests.worker._procs import Processes

    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.cleanup()
        print(p.describe())
