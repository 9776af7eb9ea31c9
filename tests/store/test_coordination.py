"""Store conformance: single-runner locks for periodic services (docs/states.md, guarantee 6) and
wake-up notifications for workers. Runs unchanged against every backend."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

from tests.store._support import RawSQL, StoreFactory, new_execution
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim
from veracity.store import Store
from veracity.store._common import lock_key
from veracity.store.postgres import PostgresStore

TTL = timedelta(seconds=60)


async def test_single_runner_admits_one_holder_at_a_time(
    store: Store, open_extra_store: StoreFactory
) -> None:
    other = await open_extra_store()
    async with store.single_runner("recovery") as first:
        assert bool(first) is True
        async with other.single_runner("recovery") as second:
            assert bool(second) is False  # busy: skip the tick, never wait
        async with store.single_runner("recovery") as same_instance:
            assert bool(same_instance) is False
        async with other.single_runner("cron") as another_name:
            assert bool(another_name) is True
    async with other.single_runner("recovery") as after_release:
        assert bool(after_release) is True


async def test_single_runner_releases_when_the_tick_raises(
    store: Store, open_extra_store: StoreFactory
) -> None:
    other = await open_extra_store()
    with pytest.raises(RuntimeError, match="tick failed"):
        async with store.single_runner("reconciler") as held:
            assert bool(held) is True
            raise RuntimeError("tick failed")
    async with other.single_runner("reconciler") as next_tick:
        assert bool(next_tick) is True


async def test_single_runner_skipped_tick_does_not_release_the_holders_lock(
    store: Store, open_extra_store: StoreFactory
) -> None:
    other, third = await open_extra_store(), await open_extra_store()
    async with store.single_runner("cron") as held:
        assert bool(held) is True
        async with other.single_runner("cron") as skipped:
            assert bool(skipped) is False
        # the skipped tick ended; the lock is still the first holder's
        async with third.single_runner("cron") as third_try:
            assert bool(third_try) is False


async def test_single_runner_lock_is_held_for_the_whole_tick_however_long(
    store: Store, open_extra_store: StoreFactory, clock: ManualClock
) -> None:
    """Ticks never overlap: a tick that runs long keeps its lock until it ends."""
    other = await open_extra_store()
    async with store.single_runner("recovery") as held:
        assert bool(held) is True
        clock.advance(timedelta(hours=1))
        async with other.single_runner("recovery") as second:
            assert bool(second) is False


async def test_a_lock_taken_says_it_is_held_and_a_skipped_one_says_not(
    store: Store, open_extra_store: StoreFactory
) -> None:
    """Guards RunnerLock.held: a service that asks mid-tick whether it still holds its
    lock (the reconciler, before it acts) hears yes while it does, on every backend, and
    no when its tick was skipped; else a healthy tick would stop acting, or a skipped one
    act."""
    other = await open_extra_store()
    async with store.single_runner("reconciler") as held:
        assert bool(held) is True
        assert await held.held() is True
        async with other.single_runner("reconciler") as skipped:
            assert bool(skipped) is False
            assert await skipped.held() is False
        assert await held.held() is True


def test_lock_keys_are_the_same_in_every_release() -> None:
    """Guards lock_key: servers of different releases running side by side (a rolling
    upgrade) must contend for the same PostgreSQL advisory lock, so a service's key is a
    fixed 64-bit number, never derived differently."""
    assert lock_key("recovery") == -7668335242777143293
    assert lock_key("reconciler") == 7444466721469719602


@contextlib.asynccontextmanager
async def _next_wakeup(store: Store) -> AsyncIterator[asyncio.Future[Any]]:
    """Listen on a fresh subscription, take its first yield (it comes as soon as it listens,
    before any notification), and give the future of the next one."""
    notifications = store.pending_notifications()
    await asyncio.wait_for(anext(notifications), 10)  # listening now (it yields None)
    waiting = asyncio.ensure_future(anext(notifications))
    try:
        yield waiting
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await notifications.aclose()  # type: ignore[attr-defined]


async def _wakes_up(store: Store, make_work: Callable[[int], Awaitable[None]]) -> bool:
    """Do work until a wake-up arrives."""
    async with _next_wakeup(store) as waiting:
        for i in range(100):
            await make_work(i)
            done, _ = await asyncio.wait({waiting}, timeout=0.1)
            if done:
                return waiting.result() is None
        return False


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_pending_notifications_say_when_they_listen_and_nothing_more_unasked(
    store: Store,
) -> None:
    """A worker claims once, then listens: work that became pending in between could not be
    heard, so the subscription yields once as soon as it listens (the worker looks again),
    and after that only for a notification."""
    assert store.supports_notifications
    await store.execution_submit(new_execution("app.n"))  # pending before anyone listens
    notifications = store.pending_notifications()
    try:
        await asyncio.wait_for(anext(notifications), 10)  # at once: no notification needed
        nothing = asyncio.ensure_future(anext(notifications))
        done, _ = await asyncio.wait({nothing}, timeout=0.5)
        assert not done, "a wake-up without a notification"
        nothing.cancel()
        await asyncio.gather(nothing, return_exceptions=True)
    finally:
        await notifications.aclose()  # type: ignore[attr-defined]


async def test_pending_notifications_wake_workers_on_new_pending_work(store: Store) -> None:
    if not store.supports_notifications:
        with pytest.raises(NotImplementedError):
            await anext(aiter(store.pending_notifications()))
        return

    async def submit(i: int) -> None:
        assert (await store.execution_submit(new_execution("app.n", [i]))).created

    assert await _wakes_up(store, submit)


async def test_pending_notifications_wake_workers_on_a_release(store: Store) -> None:
    if not store.supports_notifications:
        with pytest.raises(NotImplementedError):
            await anext(aiter(store.pending_notifications()))
        return
    await store.execution_submit(new_execution("app.n"))  # before anyone listens

    async def claim_and_release(i: int) -> None:
        (c,) = await store.execution_claim("w", ["app.n"], limit=1, lease_ttl=TTL)
        tr = await store.execution_release_if_owned(Claim(c.id, "w", c.lease_epoch), "again")
        assert tr.applied

    assert await _wakes_up(store, claim_and_release)


PG_ONLY = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


async def _heard_after(store: Store, work: Callable[[], Awaitable[None]]) -> bool:
    """Do ``work`` once (its transactions commit before it returns), and say whether a
    wake-up came within half a second."""
    async with _next_wakeup(store) as waiting:
        await work()
        done, _ = await asyncio.wait({waiting}, timeout=0.5)
        return bool(done) and waiting.result() is None


@PG_ONLY
async def test_a_batch_of_pending_submissions_wakes_workers(store: Store) -> None:
    """One statement inserts the whole batch; its trigger, run once for the statement
    (migration 0018), notifies because a row it inserted is pending."""
    async def batch() -> None:
        done = await store.execution_submit_many(
            [new_execution("app.n", [i]) for i in range(3)])
        assert all(s.created for s in done)

    assert await _heard_after(store, batch)


@PG_ONLY
async def test_an_insert_that_leaves_nothing_pending_wakes_no_worker(store: Store) -> None:
    """Paused submissions, and a submission whose key names an execution already (it
    inserts nothing), give a worker nothing to claim: no notification."""
    first = await store.execution_submit(new_execution("app.n", idempotency_key="k"))

    async def paused() -> None:
        done = await store.execution_submit_many([
            dataclasses.replace(new_execution("app.n", [i]), paused=True) for i in range(2)])
        assert [s.execution.status for s in done] == [Status.PAUSED] * 2

    async def known_key() -> None:
        again = await store.execution_submit(new_execution("app.n", idempotency_key="k"))
        assert not again.created and again.execution.id == first.execution.id

    assert not await _heard_after(store, paused)
    assert not await _heard_after(store, known_key)


@PG_ONLY
async def test_an_update_that_makes_a_row_pending_still_wakes_workers(store: Store) -> None:
    """Migration 0018 left the row-level trigger to updates: an unpause makes the row
    pending again and notifies."""
    (held,) = await store.execution_submit_many(
        [dataclasses.replace(new_execution("app.n"), paused=True)])

    async def unpause() -> None:
        assert (await store.execution_unpause(held.execution.id)).changed

    assert await _heard_after(store, unpause)


@PG_ONLY
async def test_an_insert_notifies_once_per_statement_not_once_per_row(
    store: Store, database_url: str
) -> None:
    """The catalog's account of migration 0018: inserts into veracity_executions run one
    statement-level trigger (with the inserted rows as a transition table); the row-level
    one fires on updates of status only."""
    rows = RawSQL(database_url).execute(
        "SELECT tgname, (tgtype & 1) = 1 AS per_row, (tgtype & 4) = 4 AS on_insert,"
        " (tgtype & 16) = 16 AS on_update FROM pg_trigger"
        " WHERE tgrelid = 'veracity_executions'::regclass"
        " AND tgname IN ('veracity_executions_pending', 'veracity_executions_pending_inserted')"
        " ORDER BY tgname")
    assert rows == [("veracity_executions_pending", True, False, True),
                    ("veracity_executions_pending_inserted", False, True, False)]


# -- SQLite: the lock is a flock on a file beside the database -------------------------------


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_lock_is_released_even_while_its_file_is_open_elsewhere(
    store: Store, open_extra_store: StoreFactory, database_url: str
) -> None:
    """Guards the explicit unlock of SqliteStore.single_runner: a flock belongs to the open
    file, so closing our descriptor frees it only if no other descriptor shares it (a child
    process that inherited it, say). The tick's end unlocks first, so the next tick can
    run at once whoever still has the file open."""
    other = await open_extra_store()
    lock_file = Path(database_url.removeprefix("sqlite:///") + ".recovery.lock")
    async with store.single_runner("recovery") as held:
        assert bool(held) is True
        (fd,) = [int(n) for n in os.listdir("/proc/self/fd")
                 if os.path.realpath(f"/proc/self/fd/{n}") == str(lock_file.resolve())]
        child = subprocess.Popen(["sleep", "30"], pass_fds=[fd])
    try:
        async with other.single_runner("recovery") as next_tick:
            assert bool(next_tick) is True, "the lock stayed with the inherited descriptor"
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_lock_file_is_writable_by_its_owner_only(
    store: Store, database_url: str
) -> None:
    """Guards the mode SqliteStore.single_runner creates its lock file with: read-write
    for its owner, read-only for the rest (as the umask allows), never executable."""
    lock_file = Path(database_url.removeprefix("sqlite:///") + ".reconciler.lock")
    async with store.single_runner("reconciler") as held:
        assert bool(held) is True
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(lock_file.stat().st_mode) == 0o644 & ~umask


# -- PostgreSQL: the lock lives as long as its session ---------------------------------------


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_lock_that_cannot_be_unlocked_is_freed_by_closing_its_connection(
    raw: RawSQL, open_extra_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Guards the cleanup of PostgresStore.single_runner: when the unlock statement fails
    on a session that is still alive (so still holds the advisory lock), the tick ends
    without raising and the lock's connection is closed, which ends the session and frees
    the lock at once. A connection kept open would hold the lock, idle, and every later
    tick of that service on every server would be skipped.

    The unlock is made to fail inside PostgreSQL: this store's connections resolve
    ``pg_advisory_unlock`` to a function of the test's database that raises."""
    raw.execute(
        "CREATE FUNCTION public.pg_advisory_unlock(bigint) RETURNS boolean LANGUAGE plpgsql "
        "AS $$ BEGIN RAISE EXCEPTION 'unlock refused by the test'; END $$"
    )
    failing = await open_extra_store(_with_options(raw.url, "-c search_path=public,pg_catalog"))
    other = await open_extra_store()
    with caplog.at_level(logging.WARNING, logger="veracity.store"):
        async with failing.single_runner("recovery") as held:
            assert bool(held) is True
            (holder,) = _advisory_lock_holders(raw)
            async with other.single_runner("recovery") as busy:
                assert bool(busy) is False
    # the unlock statement did fail (the tick's exit swallowed it and said so) ...
    assert "could not release the recovery lock; closing its connection" in caplog.text
    # ... and the session that held the lock has ended: nobody holds it any more
    await _until_session_ended(raw, holder)
    assert _advisory_lock_holders(raw) == []
    async with other.single_runner("recovery") as next_tick:
        assert bool(next_tick) is True


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_failed_lock_attempt_closes_its_connection(
    raw: RawSQL, open_extra_store: StoreFactory
) -> None:
    """Guards the error path of PostgresStore.single_runner: when taking the lock fails
    (the statement errors, or the task is cancelled while it waits for the answer), the
    connection opened for the lock is closed before the error goes on, not left open to the
    server. A service that ticks every few seconds would otherwise leak a session per tick
    until PostgreSQL refuses connections."""
    raw.execute(
        "CREATE FUNCTION public.pg_try_advisory_lock(bigint) RETURNS boolean LANGUAGE plpgsql "
        "AS $$ BEGIN RAISE EXCEPTION 'lock refused by the test'; END $$"
    )
    failing = await open_extra_store(_with_options(raw.url, "-c search_path=public,pg_catalog"))
    with pytest.raises(psycopg.Error, match="lock refused by the test") as caught:
        async with failing.single_runner("recovery"):
            pytest.fail("a tick whose lock could not be taken must not start")
    # (``caught`` keeps the failed call's frames, and so any connection they hold, alive)
    await _until_no_backend_ran(raw, "pg_try_advisory_lock")
    assert caught.value is not None


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_the_lock_outlives_a_server_that_ends_idle_transactions(
    raw: RawSQL, open_extra_store: StoreFactory
) -> None:
    """Guards the lock connection's autocommit (PostgresStore.single_runner): between its
    statements the lock's session holds no open transaction, so a server that ends
    sessions idle in a transaction (``idle_in_transaction_session_timeout``, common in
    production) does not end it, and with it the lock, in the middle of a tick."""
    strict = await open_extra_store(
        _with_options(raw.url, "-c idle_in_transaction_session_timeout=100"))
    other = await open_extra_store()
    async with strict.single_runner("recovery") as held:
        assert bool(held) is True
        await asyncio.sleep(0.5)  # five times the server's limit
        assert await held.held() is True
        async with other.single_runner("recovery") as second:
            assert bool(second) is False


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_holder_that_runs_keeps_its_lock_past_the_silence_limit(
    raw: RawSQL, open_extra_store: StoreFactory, clock: ManualClock
) -> None:
    """Guards the lock session's pings (PostgresStore.single_runner): the server ends a
    lock's session after ``lock_silence`` without a statement, so a tick that runs longer
    than that without a word to its lock connection would lose its lock to the next tick
    elsewhere, and two ticks would overlap. Here the tick waits four times the limit."""
    for bad in (0, 0.05, -1, 3601, float("nan")):  # refused before anything is opened
        with pytest.raises(ValueError, match=r"lock_silence must be between 0\.1 and 3600 s"):
            await PostgresStore.open("postgresql://nowhere.invalid/x", clock=clock,
                                     lock_silence=bad)
    store = await PostgresStore.open(raw.url, clock=clock, pool_size=1, lock_silence=0.3)
    other = await open_extra_store()
    try:
        async with store.single_runner("recovery") as held:
            assert bool(held) is True
            await asyncio.sleep(1.2)
            assert await held.held() is True
            async with other.single_runner("recovery") as second:
                assert bool(second) is False
    finally:
        await store.close()


_FROZEN_HOLDER = """
import asyncio, sys
from veracity.clock import ManualClock
from veracity.store.postgres import PostgresStore

async def main() -> None:
    store = await PostgresStore.open(sys.argv[1], clock=ManualClock(), pool_size=1,
                                     lock_silence=0.5)
    async with store.single_runner("recovery") as held:
        print("held", bool(held), flush=True)
        while await held.held():
            await asyncio.sleep(0.05)
        print("lost", flush=True)
    print("tick over", flush=True)
    await store.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_frozen_holder_loses_its_lock_after_the_silence_limit(
    raw: RawSQL, open_extra_store: StoreFactory
) -> None:
    """A process frozen in the middle of its tick (SIGSTOP here; a paused VM, a long
    stop-the-world pause) holds its advisory lock only until the server ends its silent
    session (``idle_session_timeout`` = ``lock_silence``, 0.5 s here): then the next tick
    elsewhere takes the lock, and expired leases are recovered without waiting for the
    frozen process (docs/workers.md, "Recovery"). Continued, the frozen holder hears that
    its lock is gone and ends its tick without an error."""
    holder = subprocess.Popen([sys.executable, "-c", _FROZEN_HOLDER, raw.url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 15)
        assert line == "held True\n", (line, holder.stderr and holder.stderr.read())
        (holder_backend,) = _advisory_lock_holders(raw)
        os.kill(holder.pid, signal.SIGSTOP)
        other = await open_extra_store()
        async with other.single_runner("recovery") as busy:
            assert bool(busy) is False  # frozen, not yet silent for long: still its lock

        async def taken() -> bool:
            async with other.single_runner("recovery") as lock:
                return bool(lock)

        for _ in range(100):  # the limit is 0.5 s; give it up to 10 s on a loaded machine
            if await taken():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the frozen holder's lock was never freed")
        await _until_session_ended(raw, holder_backend)  # the server ended its session
        async with other.single_runner("recovery") as mine:
            assert bool(mine) is True
            os.kill(holder.pid, signal.SIGCONT)
            out, err = await asyncio.to_thread(holder.communicate, timeout=15)
            assert holder.returncode == 0, err
            assert out == "lost\ntick over\n", (out, err)
            assert await mine.held() is True  # the holder's return took nothing from us
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_lock_connection_to_a_server_that_never_answers_gives_up_after_the_timeout(
    raw: RawSQL, clock: ManualClock
) -> None:
    """Guards the lock connection's ``connect_timeout`` (PostgresStore.single_runner): a
    database server that accepts connections and then never answers (frozen, or a network
    that swallows its packets) fails the tick after the store's connect timeout, with
    psycopg's ``ConnectionTimeout``, instead of hanging the service's loop. The server
    here is a loopback relay to the test's database that, once frozen, accepts and never
    answers; the store is opened through it with a 2-second timeout (libpq's least)."""
    relay = _FreezableRelay(urlsplit(raw.url))
    await relay.start()
    store = await PostgresStore.open(relay.url(raw.url), clock=clock, pool_size=1,
                                     connect_timeout=2)
    try:
        async with store.single_runner("recovery") as held:  # answered: the lock is taken
            assert bool(held) is True
        relay.frozen = True
        with pytest.raises(psycopg.errors.ConnectionTimeout):
            # four times the timeout: a lock connection that ignored it (libpq's default
            # waits forever; this store's default is 10 s) would still be waiting here
            async with asyncio.timeout(8):
                async with store.single_runner("recovery"):
                    pytest.fail("a tick whose lock connection never opened must not start")
        assert relay.silent_connections >= 1
    finally:
        relay.frozen = False
        await store.close()
        await relay.close()


class _FreezableRelay:
    """A TCP relay on loopback to a PostgreSQL server; when ``frozen``, a new connection is
    accepted and then never answered."""

    def __init__(self, target: SplitResult) -> None:
        self.target = (target.hostname or "127.0.0.1", target.port or 5432)
        self.frozen = False
        self.silent_connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        """Every connection's writer, both sides: all closed and waited for at the end, or
        the test's event loop closes over live transports (a ResourceWarning, later)."""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    def url(self, url: str) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        return urlunsplit(parts._replace(netloc=netloc))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.frozen:
            self.silent_connections += 1
            await reader.read()  # never answers; returns when the client hangs up
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.add(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        for task in (asyncio.create_task(pipe(reader, up_writer)),
                     asyncio.create_task(pipe(up_reader, writer))):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # every socket of both sides closed here, none left to the garbage collector
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in self._writers), return_exceptions=True)
        await self._server.wait_closed()


def _with_options(url: str, options: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query, keep_blank_values=True), ("options", options)]
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def _advisory_lock_holders(raw: RawSQL) -> list[int]:
    """The backends of this database holding an advisory lock."""
    rows = raw.execute(
        "SELECT DISTINCT l.pid FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) "
        "WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()"
    )
    return [int(r[0]) for r in rows]


async def _until_session_ended(raw: RawSQL, pid: int) -> None:
    """Wait for a backend whose client closed its connection to exit (it exits on the
    client's Terminate message, a moment after ``close()`` returns)."""
    for _ in range(500):
        if not raw.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ?", [pid]):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} still runs: the lock's connection was not closed")


async def _until_no_backend_ran(raw: RawSQL, statement: str) -> None:
    """Wait until no backend of this database shows ``statement`` as its last one."""
    for _ in range(500):
        if not raw.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query LIKE ?", [f"%{statement}%"]
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"a connection that ran {statement} is still open")
