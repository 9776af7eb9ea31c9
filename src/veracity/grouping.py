"""Group commit for single submissions (docs/scaling.md, "Many submissions at once").

Each ``POST /v1/executions`` is one submission, answered once its row and its first
history event are committed. When many arrive at once, writing each in a statement and a
commit of its own makes the database do the same fixed work (a round trip, a commit, a
flush of the write-ahead log) once per submission. :class:`SubmitGroups` writes the
submissions that arrived while an earlier write was under way together, in one
transaction (the store's ``execution_submit_many`` with ``all_or_nothing=False``), and
answers each caller once that transaction has committed:

- a submission that finds nothing being written and nothing waiting is written at once,
  alone (by ``execution_submit``), by its caller itself: one caller at a time waits for
  nothing it would not wait for anyway, and pays no hand-off to a task (measured: some
  50 µs of the caller's CPU per submission; bench/journal.md, "Single submissions and
  start-up"). Cancelling that caller cancels its write, as for any other statement; a
  caller that gives up while its submission waits for, or is carried by, a group's write
  does not stop that write;
- submissions stay independent: each is answered exactly as ``execution_submit`` answers
  it (an idempotency key reused with a different request is that caller's conflict, not
  the group's). A group the database refused (nothing of it was written) is written
  again one submission at a time, so that a submission the database refuses fails alone;
  a group that found the database unavailable fails, as each of its submissions would;
- nothing is answered before its transaction committed: a group gives up no durability.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from veracity.models import NewExecution, Submitted


def unavailable(exc: BaseException) -> bool:
    """What a store raises when its database cannot be reached or is busy (a pool's
    timeout included), which the API answers ``503 database_unavailable``. psycopg is
    not imported for it: a process on SQLite never loads it, and then none of its errors
    can be raised."""
    if isinstance(exc, sqlite3.OperationalError):
        return True
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.OperationalError)


class _Writes(Protocol):
    async def execution_submit(self, new: NewExecution) -> Submitted: ...

    async def execution_submit_many(self, items: Sequence[NewExecution], *,
                                    all_or_nothing: bool = True) -> list[Submitted]: ...


MAX_GROUP = 1000
"""The most submissions one transaction carries (the batch endpoint's limit)."""


class SubmitGroups:
    """Writes single submissions, grouping those that arrive while a write is under way.

    ``writers``: how many writes may be under way at once (each holds a database
    connection while it runs)."""

    def __init__(self, store: _Writes, *, writers: int = 1, limit: int = MAX_GROUP,
                 written: Callable[[int], None] | None = None) -> None:
        if writers < 1 or limit < 1:
            raise ValueError("writers and limit must be at least 1")
        self._written = written
        """Told how many submissions each write carried (committed or not)."""
        self._store = store
        self._writers = writers
        self._limit = limit
        self._waiting: list[tuple[NewExecution, asyncio.Future[Submitted]]] = []
        self._writing = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.groups = 0
        """Writes of more than one submission so far (for tests and metrics)."""
        self.regrouped = 0
        """Groups the database refused, written again one submission at a time."""

    async def submit(self, new: NewExecution) -> Submitted:
        """Write ``new`` (alone, or with others that arrive meanwhile) and answer it as
        ``execution_submit`` does, once it is committed."""
        if new.parent_id is not None or new.join_set is not None or new.retry_of is not None:
            return await self._store.execution_submit(new)  # only top-level ones group
        if self._writing < self._writers and not self._waiting:
            return await self._write_alone(new)
        answer: asyncio.Future[Submitted] = asyncio.get_running_loop().create_future()
        self._waiting.append((new, answer))
        if self._writing < self._writers:
            self._start()
        return await answer

    async def _write_alone(self, new: NewExecution) -> Submitted:
        """Write ``new`` in the caller's own task: those arriving meanwhile wait, and are
        written together once it is done."""
        self._writing += 1
        if self._written is not None:
            self._written(1)
        try:
            return await self._store.execution_submit(new)
        finally:
            self._writing -= 1
            if self._waiting and self._writing < self._writers:
                self._start()

    def _start(self) -> None:
        taken = self._waiting[:self._limit]
        del self._waiting[:self._limit]
        self._writing += 1
        task = asyncio.create_task(self._write(taken), name="veracity-submit-group")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, taken: list[tuple[NewExecution, asyncio.Future[Submitted]]]
                     ) -> None:
        if self._written is not None:
            self._written(len(taken))
        try:
            if len(taken) > 1 and await self._together(taken):
                return
            for new, answer in taken:
                await self._alone(new, answer)
        except Exception as exc:  # the database is unavailable: the rest hear why
            for _, answer in taken:
                if not answer.done():
                    answer.set_exception(exc)
        except BaseException:  # cancelled (the loop is closing): so are its callers
            for _, answer in taken:
                answer.cancel()
            raise
        finally:
            self._writing -= 1
            if self._waiting and self._writing < self._writers:
                self._start()

    async def _together(self, taken: list[tuple[NewExecution, asyncio.Future[Submitted]]]
                        ) -> bool:
        """Write a group in one transaction; False if the database refused it (then
        nothing of it was written)."""
        self.groups += 1
        try:
            answers = await self._store.execution_submit_many(
                [new for new, _ in taken], all_or_nothing=False)
        except Exception as exc:
            if unavailable(exc):
                raise
            self.regrouped += 1
            return False
        for (_, answer), submitted in zip(taken, answers, strict=True):
            if not answer.done():  # a caller that gave up (cancelled) is done already
                answer.set_result(submitted)
        return True

    async def _alone(self, new: NewExecution, answer: asyncio.Future[Submitted]) -> None:
        try:
            submitted = await self._store.execution_submit(new)
        except Exception as exc:
            if unavailable(exc):
                raise
            # refused: this caller's error alone
            if not answer.done():
                answer.set_exception(exc)
            return
        if not answer.done():
            answer.set_result(submitted)
