"""Veracity behind a real PgBouncer, in session mode and in transaction mode: the facts of
docs/scaling.md, "Connection poolers (PgBouncer and the like)".

Each test starts its own ``pgbouncer`` process (``PgBouncer``: a config file in the test's
folder, a free loopback port, ``auth_type = any`` in front of the test's PostgreSQL, every
other setting PgBouncer's default unless the test says so) and ends it at teardown. Measured
with PgBouncer 1.18.0 (Debian 12's) and PostgreSQL 15.

What they pin:

- **session mode**: `veracity migrate`, a server and a worker work as on PostgreSQL
  itself: hand-offs, LISTEN/NOTIFY wake-ups and long polls woken by the end's
  notification, psycopg's prepared statements, one single-runner lock holder at a time (and
  the silent holder's lock ended by ``idle_session_timeout``); every Veracity connection
  holds a server connection (the pool must have one for each, or the extra ones wait).
- **transaction mode**: `veracity migrate` works; a server, a worker, the CLI's other
  commands and ``AsyncDatabaseClient`` refuse to start (the notification their start
  sends to their own connection never arrives: PostgresStore.check_session). What
  running would break, shown with psycopg and the store on their own: psycopg's prepared
  statements (``prepared statement "_pg3_0" already exists``, and a statement prepared
  by another client run in place of one's own, with a wrong answer), LISTEN
  (notifications are dropped), the single-runner lock (two holders at once; a lock left
  held by a server connection other clients use), the sessions' settings (``jit``,
  ``plan_cache_mode`` and ``idle_session_timeout`` leak to other clients).

The ``pgbouncer`` binary is needed: where it is missing the tests fail saying to install it
(``apt-get install pgbouncer``); they are never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row

from tests._pg import create_database, drop_database, free_port, with_database
from tests.worker._procs import (
    Processes,
    WorkerProcess,
    veracity_bin,
    wait_until,
    worker_env,
)
from veracity.clock import DatabaseClock
from veracity.store._common import lock_key
from veracity.store.postgres import PostgresStore
from veracity.store.postgres.store import ENDED_CHANNEL, MIGRATIONS, NOTIFY_CHANNEL, _q

INSTALL = (
    "pgbouncer is needed for tests/pooler (docs/scaling.md, \"Connection poolers\"): "
    "install it (apt-get install pgbouncer; the binary is /usr/sbin/pgbouncer on Debian) "
    "and run the tests again"
)
MODES = ["session", "transaction"]
PREPARED = re.compile(r'prepared statement \\?"_pg3_\d+\\?" (?:already exists|does not exist)')
"""psycopg's prepared statements meeting another client's on a server connection."""
NOT_LINKED = "got packet 'A' from server when not linked"
"""PgBouncer's log line for a notification that reached a server connection no client had."""


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer")
    if found is None:
        candidates = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer")
        found = next((p for p in candidates if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.fail(INSTALL, pytrace=False)
    return found


class PgBouncer:
    """One ``pgbouncer`` process in front of the test's PostgreSQL server."""

    def __init__(self, binary: str, folder: Path, server_url: str, mode: str,
                 pool_size: int) -> None:
        self.binary = binary
        self.folder = folder
        self.mode = mode
        self.pool_size = pool_size
        self.server = conninfo_to_dict(server_url)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = folder / f"pgbouncer-{mode}.log"

    def _config(self) -> str:
        s = self.server
        target = f"host={s.get('host') or '/var/run/postgresql'} port={s.get('port') or 5432}"
        target += f" user={s.get('user') or 'postgres'}"
        if s.get("password"):
            target += f" password={s['password']}"
        return (
            "[databases]\n"
            f"* = {target}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            # no password between the test and PgBouncer; the server login is the line above
            "auth_type = any\n"
            f"pool_mode = {self.mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 200\n"
        )

    def start(self) -> PgBouncer:
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # the free port may be taken before PgBouncer binds it
            self.port = free_port()
            config = self.folder / f"pgbouncer-{self.mode}-{self.port}.ini"
            config.write_text(self._config())
            # PgBouncer refuses to run as root; it reads its config before it drops to -u
            user = ["-u", "nobody"] if os.geteuid() == 0 else []
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen([self.binary, *user, str(config)],
                                             stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=log)
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    self.admin("SHOW VERSION")
                    return self
                except psycopg.OperationalError:
                    time.sleep(0.05)
            self.stop()
        raise AssertionError(f"pgbouncer did not start:\n{self.log()}")

    def url(self, dbname: str) -> str:
        user = self.server.get("user") or "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, command: str) -> list[dict[str, Any]]:
        """A command on PgBouncer's admin console (``SHOW POOLS``), its rows as dicts."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=2,
                             prepare_threshold=None) as conn:
            cur = conn.execute(command)
            names = [d.name for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def pool(self, dbname: str) -> dict[str, Any]:
        rows = [r for r in self.admin("SHOW POOLS") if r["database"] == dbname]
        assert len(rows) == 1, rows
        return rows[0]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # PgBouncer's immediate shutdown
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class Bouncers:
    """The PgBouncer processes of one test, in front of its database (``dbname``)."""

    def __init__(self, folder: Path, server_url: str, db_url: str) -> None:
        self.folder = folder
        self.server_url = server_url
        self.db_url = db_url
        self.dbname = str(conninfo_to_dict(db_url)["dbname"])
        self.started: list[PgBouncer] = []

    def start(self, mode: str, *, pool_size: int = 20) -> PgBouncer:
        bouncer = PgBouncer(pgbouncer_binary(), self.folder, self.server_url, mode, pool_size)
        self.started.append(bouncer)
        return bouncer.start()

    def stop_all(self) -> None:
        for bouncer in self.started:
            bouncer.stop()


@pytest.fixture
def bouncers(pg_url: str, pg_server_url: str, tmp_path: Path) -> Iterator[Bouncers]:
    """Starts PgBouncers in front of the test's database (``pg_url``, set up before and
    given back after them: no server connection of theirs is left on it)."""
    started = Bouncers(tmp_path, pg_server_url, pg_url)
    try:
        yield started
    finally:
        started.stop_all()
        for bouncer in started.started:
            print(f"--- {bouncer.log_path.name}\n{bouncer.log()[-4000:]}")


@contextlib.asynccontextmanager
async def stores(*urls: str, **kwargs: Any) -> AsyncIterator[list[PostgresStore]]:
    opened: list[PostgresStore] = []
    try:
        for url in urls:
            opened.append(await PostgresStore.open(url, clock=DatabaseClock(), pool_size=1,
                                                   **kwargs))
        yield opened
    finally:
        for store in opened:
            await store.close()


async def fetch_one(conn: psycopg.AsyncConnection[Any], query: str,
                    params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row (whatever the connection's row factory)."""
    cur = conn.cursor(row_factory=tuple_row)
    row = await (await cur.execute(query, params)).fetchone()
    assert row is not None
    return row[0]


def advisory_lock_holders(direct_url: str) -> list[int]:
    with psycopg.connect(direct_url, autocommit=True) as conn:
        rows = conn.execute(  # this database's only: other tests run beside this one
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database ="
            " (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY pid"
        ).fetchall()
    return [row[0] for row in rows]


# -- both modes ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_veracity_migrate_works_through_both_pool_modes(
    mode: str, bouncers: Bouncers, pg_server_url: str
) -> None:
    """`veracity migrate`, twice at once, on an empty database through PgBouncer: its one
    transaction keeps one server connection, and its lock is a transaction's
    (``pg_advisory_xact_lock``), so both modes run it; every migration is applied once."""
    name = f"veracity_pooler_{uuid.uuid4().hex[:12]}"
    create_database(pg_server_url, name)
    try:
        bouncer = bouncers.start(mode)
        env = worker_env(bouncer.url(name))
        runs = [subprocess.Popen([veracity_bin(), "migrate"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outcomes = [run.communicate(timeout=60) for run in runs]
        assert [run.returncode for run in runs] == [0, 0], outcomes
        versions = [m.version for m in MIGRATIONS]
        assert any(f"applied migrations {', '.join(map(str, versions))} to" in out
                   for out, _ in outcomes), outcomes
        with psycopg.connect(with_database(pg_server_url, name), autocommit=True) as conn:
            rows = conn.execute("SELECT version FROM veracity_migrations ORDER BY 1").fetchall()
        assert [row[0] for row in rows] == versions
    finally:
        bouncers.stop_all()
        drop_database(pg_server_url, name)


@pytest.mark.parametrize("mode", MODES)
async def test_psycopg_prepared_statements_fail_through_transaction_mode_only(
    mode: str, bouncers: Bouncers
) -> None:
    """psycopg prepares a statement on the server once a connection has run it 5 times.
    Two Veracity stores each running one statement 10 times: through session mode each
    client has its own server connection; through transaction mode the second store's
    prepare lands on the server connection where the first one's lives, and fails
    (``prepared statement "_pg3_0" already exists``)."""
    url = bouncers.start(mode).url(bouncers.dbname)
    async with stores(url, url) as (first, second):
        for _ in range(10):
            await first.db_now()
        if mode == "session":
            for _ in range(10):
                await second.db_now()
            return
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement,
                           match='prepared statement "_pg3_0" already exists'):
            for _ in range(10):
                await second.db_now()


@pytest.mark.parametrize("mode", MODES)
async def test_transaction_mode_runs_another_clients_prepared_statement_in_place_of_ones_own(
    mode: str, bouncers: Bouncers
) -> None:
    """Worse than the errors: client A prepares ``_pg3_0`` on server connection S1; client B,
    while S1 is busy, prepares its own ``_pg3_0`` on S2; B's next run of it lands on S1 and
    runs A's statement with B's parameters. Through transaction mode ``SELECT 3 * 100``
    answers 4 (A's ``3 + 1``), without an error; through session mode, 300."""
    url = bouncers.start(mode).url(bouncers.dbname)
    add, multiply = "SELECT %s::int + 1", "SELECT %s::int * 100"
    async with (await psycopg.AsyncConnection.connect(url, autocommit=True) as a,
                await psycopg.AsyncConnection.connect(url, autocommit=True) as b,
                await psycopg.AsyncConnection.connect(url, autocommit=True) as busy):
        for i in range(6):
            await fetch_one(a, add, (i,))  # prepared by now, on the server connection it used
        await busy.execute("BEGIN")
        await busy.execute("SELECT 1")  # holds that server connection (the most recent one)
        for i in range(6):
            await fetch_one(b, multiply, (i,))  # prepared too, on another server connection
        await busy.execute("COMMIT")
        answer = await fetch_one(b, multiply, (3,))
    assert answer == (300 if mode == "session" else 4)


@pytest.mark.parametrize("mode", MODES)
async def test_listen_notify_works_through_session_mode_and_is_lost_through_transaction_mode(
    mode: str, bouncers: Bouncers
) -> None:
    """A worker's LISTEN for pending executions and a server's for ended ones (the store's
    own connections), each followed by a NOTIFY sent to PostgreSQL directly: through session
    mode both are heard at once; through transaction mode neither is, within a second (the
    LISTEN ran on a server connection that went back to the pool, and PgBouncer drops the
    notification arriving there: its log says "got packet 'A' from server when not
    linked")."""
    bouncer = bouncers.start(mode)
    url = bouncer.url(bouncers.dbname)
    ended = asyncio.Event()
    async with stores(url) as (store,), store.ended_signals(ended.set) as listening:
        pending = cast(AsyncGenerator[Any, None], store.pending_notifications())
        try:
            assert await anext(pending) is None  # listening now
            with psycopg.connect(bouncers.db_url, autocommit=True) as direct:
                direct.execute(f"NOTIFY {NOTIFY_CHANNEL}")
                direct.execute(f"NOTIFY {ENDED_CHANNEL}")
            if mode == "session":
                assert await asyncio.wait_for(anext(pending), 5) is None
                await asyncio.wait_for(ended.wait(), 5)
                assert listening()
                return
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(pending), 1)
            assert not ended.is_set()
        finally:
            await pending.aclose()
    await wait_until(lambda: NOT_LINKED in bouncer.log(), 5, what="PgBouncer's log line",
                     describe=bouncer.log)


@pytest.mark.parametrize("mode", MODES)
async def test_session_settings_stay_with_their_client_in_session_mode_only(
    mode: str, bouncers: Bouncers
) -> None:
    """A worker's store sets ``TIME ZONE 'UTC'``, ``jit = off`` and ``plan_cache_mode =
    force_generic_plan`` on each of its connections. Through transaction mode the last two
    stay on the server connection they ran on, and another client (not Veracity) gets them
    there, while the store's next statement on another server connection runs without
    them; only the time zone follows its client (PgBouncer tracks ``TimeZone``). Through
    session mode each client keeps its own."""
    url = bouncers.start(mode).url(bouncers.dbname)
    async with (stores(url, generic_plans=True) as (store,),
                await psycopg.AsyncConnection.connect(url, autocommit=True) as other):
        seen = (await fetch_one(other, "SHOW jit"), await fetch_one(other, "SHOW plan_cache_mode"))
        assert seen == (("on", "auto") if mode == "session" else ("off", "force_generic_plan"))
        await other.execute("BEGIN")
        await other.execute("SELECT 1")  # holds the server connection the settings ran on
        async with store._pool.connection() as conn:
            mine = tuple([await fetch_one(conn, f"SHOW {name}")
                          for name in ("TimeZone", "jit", "plan_cache_mode")])
        await other.execute("COMMIT")
    assert mine == (("UTC", "off", "force_generic_plan") if mode == "session"
                    else ("UTC", "on", "auto"))


# -- session mode ----------------------------------------------------------------------------


async def test_session_mode_admits_one_lock_holder_and_resets_the_lock_session(
    bouncers: Bouncers,
) -> None:
    """Lease recovery's and the reconciler's single-runner lock through session mode: a
    second process is refused while the first holds it, and once the first's tick is over
    the lock is free and its session's ``idle_session_timeout`` gone (PgBouncer's
    ``DISCARD ALL`` when the lock's client leaves)."""
    url = bouncers.start("session").url(bouncers.dbname)
    async with stores(url, url) as (first, second):
        async with first.single_runner("recovery") as held:
            assert held.acquired
            async with second.single_runner("recovery") as refused:
                assert not refused.acquired
        assert advisory_lock_holders(bouncers.db_url) == []
        async with second.single_runner("recovery") as next_tick:
            assert next_tick.acquired
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
            assert await fetch_one(other, "SHOW idle_session_timeout") == "0"


async def test_session_mode_ends_a_silent_lock_holders_session_and_frees_its_lock(
    bouncers: Bouncers,
) -> None:
    """A holder that stops talking (frozen: here a client that took the lock the way a tick
    does, 2 s of silence allowed, and then says nothing) loses its lock through session
    mode as on PostgreSQL itself: the server ends the silent session, the lock is free for
    the next tick elsewhere, and the frozen client's connection is gone (docs/workers.md,
    "Recovery")."""
    url = bouncers.start("session").url(bouncers.dbname)
    # the other store is open first, and the silence allowed is 2 s: the first ask comes
    # well within it however busy the machine
    async with stores(url) as (other,):
        async def taken() -> bool:
            async with other.single_runner("recovery") as lock:
                return lock.acquired

        frozen = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            cur = await frozen.execute(_q("lock_try"), {"key": lock_key("recovery"),
                                                       "silence_ms": "2000"})
            assert (await cur.fetchone()) == ("2s", True)
            assert not await taken()
            await wait_until(taken, 10, interval=0.1, what="the silent holder's lock")
            with pytest.raises(psycopg.OperationalError):
                await frozen.execute("SELECT 1")
        finally:
            await frozen.close()


async def test_session_mode_needs_a_server_connection_for_every_veracity_connection(
    bouncers: Bouncers,
) -> None:
    """Session mode saves no connection: each client holds one server connection for as
    long as it is connected. With a pool of 2, a store's pooled connection and its LISTEN
    take both, and a recovery tick's lock connection waits (PgBouncer: ``cl_waiting``)
    until one of them leaves."""
    bouncer = bouncers.start("session", pool_size=2)
    url = bouncer.url(bouncers.dbname)
    async with stores(url) as (store,), contextlib.AsyncExitStack() as listening:
        await listening.enter_async_context(store.ended_signals(lambda: None))

        async def tick() -> bool:
            async with store.single_runner("recovery") as lock:
                return lock.acquired

        ticking = asyncio.create_task(tick())
        await wait_until(lambda: bouncer.pool(bouncers.dbname)["cl_waiting"] == 1, 5,
                         what="a client waiting for a server connection")
        pool = bouncer.pool(bouncers.dbname)
        assert (pool["cl_active"], pool["sv_active"]) == (2, 2)
        assert not ticking.done()
        await listening.aclose()  # the LISTEN leaves: its server connection is free
        assert await asyncio.wait_for(ticking, 5)


# -- transaction mode ------------------------------------------------------------------------


async def test_transaction_mode_lets_two_processes_hold_the_single_runner_lock_at_once(
    bouncers: Bouncers,
) -> None:
    """The lock lives in the server connection its ``pg_try_advisory_lock`` ran on, not in
    the client's: the second process's try lands on that same server connection (PgBouncer
    hands out the most recently used one) and is granted, so two recovery ticks run at once;
    and the lock's ``idle_session_timeout`` is left on that server connection for any
    client."""
    url = bouncers.start("transaction").url(bouncers.dbname)
    async with (stores(url, url) as (first, second),
                await psycopg.AsyncConnection.connect(url, autocommit=True) as other):
        async with first.single_runner("recovery") as held:
            assert held.acquired
            async with second.single_runner("recovery") as also:
                assert also.acquired  # two holders
            assert await fetch_one(other, "SHOW idle_session_timeout") == "3s"


async def test_transaction_mode_leaves_a_released_lock_held_by_another_clients_connection(
    bouncers: Bouncers,
) -> None:
    """A tick's release runs on whichever server connection is free: while another client
    (not Veracity) is in a transaction on the one that holds the lock, the release runs
    elsewhere and frees nothing, and the lock stays held by the server connection that
    client is using: the next tick of another process is refused, while no tick runs. It
    is freed only when PostgreSQL ends that server connection for the lock's
    ``idle_session_timeout`` (0.5 s here), left on it, once it is idle: PgBouncer then logs
    "server conn crashed?"."""
    bouncer = bouncers.start("transaction")
    url = bouncer.url(bouncers.dbname)
    async with (stores(url, url, lock_silence=0.5) as (store, second),
                await psycopg.AsyncConnection.connect(url, autocommit=True) as other):
        async with store.single_runner("recovery") as held:
            assert held.acquired
            (holder,) = advisory_lock_holders(bouncers.db_url)
            await other.execute("BEGIN")
            assert await fetch_one(other, "SELECT pg_backend_pid()") == holder
        # the tick is over and released its lock, which the other client's backend holds
        assert advisory_lock_holders(bouncers.db_url) == [holder]
        async with second.single_runner("recovery") as refused:
            assert not refused.acquired  # no tick runs, and none may
        await other.execute("COMMIT")
        await wait_until(lambda: advisory_lock_holders(bouncers.db_url) == [], 10,
                         interval=0.1, what="the lock's server connection to end")
    assert "server conn crashed?" in bouncer.log()


# -- a server and a worker -------------------------------------------------------------------


async def start_stack(procs: Processes, url: str, env: dict[str, str] | None = None
                      ) -> tuple[WorkerProcess, WorkerProcess, str]:
    """A ``veracity server`` (no worker in it) and a ``veracity worker`` on ``url``, the
    test workflows (tests.workflows), polls every second."""
    port = free_port()
    extra = {"VERACITY_POLL_INTERVAL": "1", **(env or {})}
    server = procs.worker(url, "server", argv=[veracity_bin(), "server", "--no-worker"],
                          env={"VERACITY_PORT": str(port), **extra})
    api = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=api) as client:
        async def healthy() -> bool:
            assert server.alive, server.describe()
            try:
                return (await client.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_until(healthy, 30, what="the server", describe=procs.describe)
    worker = procs.worker(url, "worker", env=extra)
    await worker.registered(30)
    return server, worker, api


async def offer_out(db_url: str) -> bool:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        return bool(await fetch_one(conn, "SELECT count(*) FROM veracity_offers"))


SPAN = "test:span/run.fn"
"""A workflow of tests.workflows that runs for the seconds it is given."""


@pytest.mark.slow
async def test_session_mode_runs_a_server_and_a_worker_with_hand_offs_and_woken_long_polls(
    bouncers: Bouncers, procs: Processes, tmp_path: Path
) -> None:
    """Through session mode a server and a worker at their defaults work as on PostgreSQL
    itself: each submission to the idle worker is handed off (answered ``running``), and
    its long poll (``?wait=5s``) answers once the execution ends, woken by the end's
    notification (well within the server's 1 s recheck); every client connection holds a
    server connection (no saving)."""
    bouncer = bouncers.start("session")
    url = bouncer.url(bouncers.dbname)
    server, worker, api = await start_stack(procs, url)
    late: list[float] = []
    async with httpx.AsyncClient(base_url=api, timeout=30) as client:
        for _ in range(3):
            await wait_until(lambda: offer_out(bouncers.db_url), 10, what="the worker's offer",
                             describe=procs.describe)
            posted = await client.post("/v1/executions", json={
                "ffqn": SPAN, "params": [str(tmp_path / "marks"), 0.3]})
            assert posted.status_code == 201, posted.text
            assert posted.json()["status"] == "running"  # handed off
            began = time.monotonic()
            got = await client.get(f"/v1/executions/{posted.json()['id']}",
                                   params={"wait": "5s"})
            assert got.json()["status"] == "completed", got.text
            late.append(time.monotonic() - began - 0.3)
    assert statistics.median(late) < 0.25, late
    pool = bouncer.pool(bouncers.dbname)
    assert pool["cl_waiting"] == 0
    assert pool["cl_active"] == pool["sv_active"] >= 6, pool
    assert server.alive and worker.alive, procs.describe()


REFUSED = "did not arrive within"
"""What a server's or a worker's start says through a pooler that does not keep sessions
(PostgresStore.check_session)."""


async def exits(process: WorkerProcess, within: float, procs: Processes) -> int:
    await wait_until(lambda: not process.alive, within, interval=0.1,
                     what=f"{process.name} to exit", describe=procs.describe)
    code = process.returncode
    assert code is not None
    return code


@pytest.mark.slow
async def test_a_server_and_a_worker_refuse_to_start_through_transaction_mode(
    bouncers: Bouncers, procs: Processes
) -> None:
    """Through transaction mode a server and a worker each check at start that a
    notification sent from their pool reaches a connection of theirs that listens for it;
    it never does (the listening client is not linked to a server connection while it
    waits: the LISTEN test above), so each exits 1 with one line naming the cause, before
    binding its port or claiming anything: the prepared statements run with another client's
    parameters, the stranded hand-offs and the doubled locks that running would bring
    (tests above) never happen. Through session mode both start (the test before)."""
    url = bouncers.start("transaction").url(bouncers.dbname)
    server = procs.worker(url, "server", argv=[veracity_bin(), "server", "--no-worker"],
                          env={"VERACITY_PORT": str(free_port())})
    worker = procs.worker(url, "worker")
    assert await exits(server, 30, procs) == 1
    assert await exits(worker, 30, procs) == 1
    for process in (server, worker):  # one line each, saying why and where to read
        text = process.stderr_text()
        assert text.startswith("error: ") and text.count("\n") == 1, process.describe()
        assert REFUSED in text and "transaction mode" in text, process.describe()
        assert "Connection poolers" in text, process.describe()
    async with await psycopg.AsyncConnection.connect(bouncers.db_url, autocommit=True) as conn:
        assert await fetch_one(conn, "SELECT count(*) FROM veracity_workers") == 0
        assert await fetch_one(conn, "SELECT count(*) FROM veracity_offers") == 0


async def test_the_database_client_refuses_to_open_through_transaction_mode(
    bouncers: Bouncers
) -> None:
    """``AsyncDatabaseClient`` makes the same check when it opens (its waits are woken by
    notifications, its statements prepared): a ConfigError naming the cause."""
    from veracity import AsyncDatabaseClient
    from veracity.errors import ConfigError

    url = bouncers.start("transaction").url(bouncers.dbname)
    with pytest.raises(ConfigError, match=REFUSED):
        async with AsyncDatabaseClient(url, app="tests.workflows:app"):
            pass
    session = bouncers.start("session").url(bouncers.dbname)
    async with AsyncDatabaseClient(session, app="tests.workflows:app") as client:
        assert (await client.submit("test:echo/run.fn", 1)).status == "pending"


async def test_the_cli_refuses_to_run_through_transaction_mode_but_migrate(
    bouncers: Bouncers
) -> None:
    """A command that reads or writes executions or tokens checks its session first, as a
    server does: through transaction mode its statements, once prepared, could run another
    client's, and `prune`'s single-runner lock and `--wait`'s notifications break. Each
    refuses in one `error:` line (exit 1), having changed nothing; `migrate` works (its
    test above). Through session mode the same commands run."""
    url = bouncers.start("transaction").url(bouncers.dbname)
    env = worker_env(url)
    commands = [["list"], ["submit", "test:echo/run.fn", "1"], ["prune", "--older-than", "7d"],
                ["token", "list"], ["get", str(uuid.uuid4())]]
    # all at once: each waits the check's 5 s for the notification that never comes
    running = [subprocess.Popen([veracity_bin(), *argv], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for argv in commands]
    for argv, proc in zip(commands, running, strict=True):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (argv, err)
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert REFUSED in err and "Connection poolers" in err, err
    async with await psycopg.AsyncConnection.connect(bouncers.db_url, autocommit=True) as conn:
        assert await fetch_one(conn, "SELECT count(*) FROM veracity_executions") == 0
    session = worker_env(bouncers.start("session").url(bouncers.dbname))
    for argv in commands[:4]:
        done = subprocess.run([veracity_bin(), *argv], env=session, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, (argv, done.stderr)
