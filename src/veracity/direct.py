"""Submitting straight to the database: :class:`AsyncDatabaseClient` (docs/client.md).

Application code that shares the database with Veracity's servers and workers (as
PGQueuer's, Procrastinate's or DBOS's client does) can submit and wait without a hop
through the HTTP API: the same checks as the API (known workflow, parameters against its
signature, payload size, idempotency keys), the same statements, the same group commit of
submissions that arrive together (veracity/grouping.py), and the same answers and typed
errors as :class:`veracity.AsyncClient`, from the same configuration as ``veracity
server`` (``veracity.toml``, ``VERACITY_*``).

    from veracity import AsyncDatabaseClient

    async with AsyncDatabaseClient() as client:  # VERACITY_DATABASE_URL, VERACITY_APP
        execution = await client.submit("shop:orders/process.run", "order-1", 2500)
        print(await client.result(execution.id, timeout=60))
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python

from veracity.api.schemas import ExecutionOut, submit_items
from veracity.app import App
from veracity.client import (
    _BY_STATUS,
    TERMINAL,
    ApiError,
    ClientExecution,
    DatabaseUnavailable,
    ExecutionFailed,
    PayloadTooLarge,
    Submission,
    WaitTimeout,
    _deadline,
    _next_step,
    batch_item,
)
from veracity.config import load_settings
from veracity.control import MAX_BATCH, ExecutionService, SubmitItem
from veracity.errors import ConfigError, VeracityError
from veracity.grouping import unavailable
from veracity.models import Execution
from veracity.runtime import Runtime, open_runtime, redact_url

__all__ = ["AsyncDatabaseClient"]


def _client_execution(execution: Execution, waiting_reason: str | None = None
                      ) -> ClientExecution:
    """The execution as the API would answer it: ``raw`` is the API's JSON, and the fields
    are what :meth:`ClientExecution.of` would read from it, its times taken from the
    execution itself instead of parsed back from that JSON (that took a sixth of the
    client's CPU with 16 callers at once: bench/journal.md, "Single submissions and
    start-up")."""
    data = to_jsonable_python(ExecutionOut.plain(execution))
    data["waiting_reason"] = waiting_reason
    return ClientExecution(
        id=data["id"], ffqn=execution.ffqn, status=data["status"], params=data["params"],
        result=data["result"], error=data["error"], attempt=execution.attempt,
        deployment_id=execution.deployment_id, parent_id=data["parent_id"],
        idempotency_key=execution.idempotency_key, scheduled_at=execution.scheduled_at,
        created_at=execution.created_at, updated_at=execution.updated_at,
        waiting_reason=waiting_reason, retry_of=data["retry_of"], raw=data)


class AsyncDatabaseClient:
    """:class:`veracity.AsyncClient`'s submission methods (``submit``, ``submit_many``,
    ``get``, ``wait``, ``result``), on the database itself instead of a server's API.

    ``database_url`` (default: the configuration's ``database_url``, as ``veracity server``
    reads it) and ``app`` (an :class:`veracity.App` or ``"module:attribute"``; default the
    configuration's ``app``): the workflows a submission is checked against. ``config``: a
    configuration file, as ``veracity --config``. Open it with ``async with`` (or
    :meth:`open`, then :meth:`aclose`); one client holds one connection pool: make one and
    share it.

    Errors are the HTTP client's, with the status and code the API would have answered
    (:class:`veracity.client.InvalidRequest`, ``ConflictError``, ``NotFoundError``,
    ``PayloadTooLarge``, ``DatabaseUnavailable``)."""

    def __init__(self, database_url: str | None = None, *, app: App | str | None = None,
                 config: str | Path | None = None) -> None:
        overrides: dict[str, object] = {"database_url": database_url}
        if isinstance(app, str):
            overrides["app"] = app
        self.settings = load_settings(config, overrides=overrides)
        self._app = app if isinstance(app, App) else None
        self._runtime: Runtime | None = None

    async def open(self) -> AsyncDatabaseClient:
        """Connect (once; later calls do nothing). A database that does not answer is
        :class:`veracity.client.DatabaseUnavailable` (after the connection's timeout); one
        without Veracity's tables, or reached through a connection pooler that does not
        keep sessions (docs/scaling.md, "Connection poolers"), a
        :class:`veracity.errors.ConfigError`."""
        if self._runtime is None:
            # a missing SQLite file is said so, not created (it would hold no tables)
            runtime = await self._do(open_runtime(self.settings, app=self._app,
                                                  create=False))
            try:  # one read: a database without Veracity's tables is said so now
                await self._do(runtime.store.execution_get(uuid.UUID(int=0)))
                # and its waits are woken by notifications: a pooler in transaction mode
                # drops them (docs/scaling.md, "Connection poolers")
                await runtime.store.check_session()
            except Exception as exc:
                await runtime.close()
                cause = exc.__cause__ or exc
                if type(cause).__name__ == "UndefinedTable" or "no such table" in str(cause):
                    raise ConfigError(
                        f"{redact_url(self.settings.database_url)} holds no Veracity "
                        "database: run `veracity migrate`, or start the server once (it "
                        "migrates)") from None
                raise
            self._runtime = runtime
        return self

    async def __aenter__(self) -> AsyncDatabaseClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.close()

    @property
    def _service(self) -> ExecutionService:
        if self._runtime is None:
            raise RuntimeError("the client is not open: use `async with "
                               "AsyncDatabaseClient(...)` or `await client.open()`")
        return self._runtime.service

    async def _do(self, coro: Any) -> Any:
        try:
            return await coro
        except VeracityError as exc:
            kind = _BY_STATUS.get(exc.status, ApiError)
            raise kind(exc.status, exc.code, exc.message, exc.details) from None
        except Exception as exc:
            if unavailable(exc):  # as the API answers it: 503
                raise DatabaseUnavailable(503, "database_unavailable",
                                          f"the database did not answer: {exc}") from exc
            raise

    async def submit(self, ffqn: str, *params: Any, idempotency_key: str | None = None,
                     scheduled_at: datetime | None = None, paused: bool = False
                     ) -> ClientExecution:
        """As :meth:`veracity.AsyncClient.submit`: a new execution, or the one its
        idempotency key named already."""
        execution, _ = await self._do(self._service.submit(
            ffqn, list(params), idempotency_key=idempotency_key, scheduled_at=scheduled_at,
            paused=paused))
        return _client_execution(execution)

    async def submit_many(self, submissions: Sequence[Submission | Mapping[str, Any]]
                          ) -> list[ClientExecution]:
        """As :meth:`veracity.AsyncClient.submit_many`: up to 1,000 in one transaction,
        answered in order; nothing is written if any is refused. Each item is checked as
        the batch endpoint checks it (a bad one: ``invalid_batch``, naming its index)."""
        if len(submissions) > MAX_BATCH:
            raise PayloadTooLarge(413, "payload_too_large",
                                  f"a batch takes at most {MAX_BATCH:,} submissions; this "
                                  f"one has {len(submissions):,}")
        items, refused = submit_items([batch_item(s) for s in submissions])
        service = self._service
        done = await self._do(self._submit_checked(service, items, refused))
        return [_client_execution(execution) for execution, _ in done]

    @staticmethod
    async def _submit_checked(service: ExecutionService, items: list[SubmitItem],
                              refused: dict[int, VeracityError]
                              ) -> list[tuple[Execution, bool]]:
        return await service.submit_prepared(service.prepare_many(items, refused))

    async def get(self, execution_id: str) -> ClientExecution:
        service = self._service
        execution = await self._do(service.get(execution_id))
        waiting = await self._do(service.waiting_reasons([execution]))
        return _client_execution(execution, waiting.get(execution.id))

    async def wait(self, execution_id: str, timeout: float | None = None) -> ClientExecution:
        """As :meth:`veracity.AsyncClient.wait`: woken by the database's end signals (on
        PostgreSQL its notifications), not by polling; :class:`veracity.WaitTimeout` with
        the execution as it is then, if it has not ended within ``timeout`` seconds."""
        deadline = _deadline(timeout)  # a negative or NaN one: invalid_wait, as the API's
        service = self._service
        while True:
            execution = await self._do(service.wait(execution_id, _next_step(deadline)))
            if str(execution.status) in TERMINAL:
                return _client_execution(execution)
            if deadline is not None and time.monotonic() >= deadline:
                waiting = await self._do(service.waiting_reasons([execution]))
                raise WaitTimeout(_client_execution(execution, waiting.get(execution.id)))

    async def result(self, execution_id: str, timeout: float | None = None) -> Any:
        """The completed execution's result; :class:`veracity.ExecutionFailed` if it
        ended otherwise."""
        execution = await self.wait(execution_id, timeout)
        if execution.status != "completed":
            raise ExecutionFailed(execution)
        return execution.result
