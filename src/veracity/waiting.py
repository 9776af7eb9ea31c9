"""Waiting for executions to end (``GET /v1/executions/{id}?wait=``, ``veracity get
--follow``), for any number of waiters at once, without polling per request.

One :class:`EndWaits` per process holds the waiters by execution id and, while any
wait, one listener: the store's end signals (PostgreSQL notifications on channel
``veracity_ended``; on SQLite, the commits of this process). On each signal it asks the
database once which of the awaited executions have ended, and wakes their waiters. It
also asks every ``recheck`` seconds whatever the signals say, which covers what they
cannot see: a lost notification connection, or, on SQLite, a worker in another process.
The listener stops ``linger`` seconds after the last waiter left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

from veracity.store.protocol import ReadStore

log = logging.getLogger("veracity.waiting")

RECHECK = 1.0
"""Seconds between checks of the awaited executions without a signal."""
LINGER = 10.0
"""Seconds the listener stays after the last waiter left (the next long poll of a
client that waits in a loop finds it ready)."""
CLOSE_WAIT = 5.0
"""Seconds :meth:`EndWaits.close` lets the released listener end by itself."""


class EndWaits:
    def __init__(self, store: ReadStore, *, recheck: float = RECHECK,
                 linger: float = LINGER) -> None:
        self.store = store
        self.recheck = recheck
        self.linger = linger
        self._waiters: dict[uuid.UUID, set[asyncio.Future[None]]] = {}
        self._kick = asyncio.Event()
        self._listening = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def waiting(self) -> int:
        """How many waits are under way."""
        return sum(len(f) for f in self._waiters.values())

    async def wait(self, execution_id: uuid.UUID, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the execution to end: True once it has
        (the caller reads it again), False at the timeout or when :meth:`release`
        answers every waiter early (a server shutting down)."""
        if self._closed or timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(execution_id, set()).add(future)
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
            # cancellation that arrives as what it waits for completes (a Ctrl-C of `get
            # --follow` would then wait on)
            async with asyncio.timeout_at(loop.time() + timeout):
                self._start()
                # signals first, then the check: an end that commits in between is signalled
                await self._listening.wait()
                if execution_id in await self.store.execution_ended_among([execution_id]):
                    return True
                await future
            return not self._closed
        except TimeoutError:
            return False
        finally:
            futures = self._waiters.get(execution_id)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._waiters[execution_id]
            if not self._waiters:
                self._kick.set()  # the listener starts counting its linger

    def release(self) -> None:
        """Answer every waiter now (with the state it has) and take no new wait: the
        server is stopping."""
        self._closed = True
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)
        self._kick.set()

    async def close(self) -> None:
        self.release()
        if self._task is not None:
            # released, the listener ends by itself and closes its connection; cancelled
            # only if it does not (a cancel in the middle of its cleanup could leak it)
            done, _ = await asyncio.wait({self._task}, timeout=CLOSE_WAIT)
            if not done:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._listening.clear()
            self._task = asyncio.create_task(self._run(), name="veracity-end-waits")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                try:
                    async with self.store.ended_signals(self._kick.set) as alive:
                        self._listening.set()
                        if await self._serve(alive):
                            return  # nobody waited for a while
                    log.warning("end signals lost; listening again",
                                extra={"domain": "waiting"})
                except Exception as exc:
                    log.warning("end signals unavailable (%s); checking every %gs for a "
                                "while", exc, self.recheck, extra={"domain": "waiting"})
                    self._listening.set()
                    # on the clock alone for a while, then listen again
                    if await self._serve(None, until=loop.time() + 5 * self.recheck):
                        return
        finally:
            self._listening.set()  # no waiter waits for a listener that is gone

    async def _serve(self, alive: Callable[[], bool] | None, *,
                     until: float | None = None) -> bool:
        """Check on each signal and every ``recheck`` seconds. True once nobody has
        waited for ``linger`` seconds (or on close); False when the signals are lost
        (``alive()`` false) or at ``until``."""
        idle_since: float | None = None
        loop = asyncio.get_running_loop()
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.recheck)
            self._kick.clear()
            if not self._waiters:
                idle_since = idle_since if idle_since is not None else loop.time()
                if loop.time() - idle_since >= self.linger:
                    return True
                continue
            idle_since = None
            try:
                await self._check()
            except Exception as exc:  # the database did not answer: the waiters time out
                log.warning("cannot check awaited executions: %s", exc,
                            extra={"domain": "waiting"})
            if alive is not None and not alive():
                return False
            if until is not None and loop.time() >= until:
                return False
        return True

    async def _check(self) -> None:
        ids = list(self._waiters)
        ended = await self.store.execution_ended_among(ids)
        for ident in ended:
            for future in self._waiters.get(ident, ()):
                if not future.done():
                    future.set_result(None)
