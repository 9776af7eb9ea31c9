"""The Python client of Veracity's HTTP API: :class:`Client` and :class:`AsyncClient`.

Submit executions (one, or up to 1,000 in one request), wait for them (long polls the
server: no busy loop), read their results, cancel, pause, send messages, list and read
histories — with typed exceptions that carry the API's error code (docs/client.md).
httpx does the HTTP; nothing of Veracity's server is imported, so a client starts fast.

    from veracity import Client

    with Client("http://127.0.0.1:8000") as client:
        execution = client.submit("shop:orders/process.run", "order-1", 2500)
        print(client.result(execution.id, timeout=60))
"""

from __future__ import annotations

import builtins
import math
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from veracity._frozen import quick_init
from veracity._tls import ssl_context

__all__ = [
    "DEFAULT_URL",
    "ApiError",
    "AsyncClient",
    "Client",
    "ClientExecution",
    "ConflictError",
    "DatabaseUnavailable",
    "ExecutionFailed",
    "Forbidden",
    "HistoryItem",
    "InvalidRequest",
    "NotFoundError",
    "PayloadTooLarge",
    "ServerBusy",
    "ServerUnreachable",
    "Submission",
    "Unauthorized",
    "WaitTimeout",
]

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = frozenset({"completed", "failed", "failed_transient", "cancelled"})
WAIT_STEP = 30.0
"""Seconds one long poll waits at most (the server answers at once when it ends)."""


# -- errors ------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answered by the API: ``status`` (HTTP), ``code`` (the API's error code,
    e.g. ``wrong_state``), ``message``, and ``details`` (anything else it said)."""

    def __init__(self, status: int, code: str, message: str,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details or {})


class InvalidRequest(ApiError):
    """400 or 422: the request itself is wrong (``details`` may list the fields)."""


class Unauthorized(ApiError):
    """401: no token, or one the server does not take."""


class Forbidden(ApiError):
    """403: the token lacks the scope the route needs."""


class NotFoundError(ApiError):
    """404: no such execution (or route)."""


class ConflictError(ApiError):
    """409: the request does not apply to the execution's state (``details["state"]``)."""


class PayloadTooLarge(ApiError):
    """413: the body, or a batch, is larger than the server takes."""


class DatabaseUnavailable(ApiError):
    """503: the server's database did not answer; try again shortly."""


class ServerBusy(ApiError):
    """503 without the API's error body: the server has as many connections as it takes
    (``server.max_connections``) and refused this one; try again shortly."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFoundError,
    409: ConflictError, 413: PayloadTooLarge, 415: InvalidRequest, 422: InvalidRequest,
    503: DatabaseUnavailable,
}


class ServerUnreachable(Exception):
    """The server did not answer at all (refused, unreachable, timed out)."""


class WaitTimeout(TimeoutError):
    """:meth:`Client.wait` or :meth:`Client.result` ran out of time; ``execution`` is its
    state then."""

    def __init__(self, execution: ClientExecution) -> None:
        super().__init__(f"execution {execution.id} is still {execution.status}")
        self.execution = execution


class ExecutionFailed(Exception):
    """:meth:`Client.result` of an execution that did not complete: ``execution`` holds
    its status and error."""

    def __init__(self, execution: ClientExecution) -> None:
        super().__init__(f"execution {execution.id} ended {execution.status}: "
                         f"{execution.error!r}")
        self.execution = execution


# -- values ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submission:
    """One submission of a batch (:meth:`Client.submit_many`)."""

    ffqn: str
    params: Sequence[Any] = ()
    idempotency_key: str | None = None
    scheduled_at: datetime | None = None
    paused: bool = False

    def body(self) -> dict[str, Any]:
        # a text is no array of parameters: sent as it is, for the server to refuse
        params = self.params if isinstance(self.params, str | bytes) else list(self.params)
        body: dict[str, Any] = {"ffqn": self.ffqn, "params": params}
        if self.idempotency_key is not None:
            body["idempotency_key"] = self.idempotency_key
        if self.scheduled_at is not None:
            body["scheduled_at"] = self.scheduled_at.isoformat()
        if self.paused:
            body["paused"] = True
        return body


def batch_item(submission: Submission | Mapping[str, Any] | Any) -> Any:
    """One item of a batch's body: a :class:`Submission`'s, or a mapping of its fields
    (``scheduled_at`` a datetime or ISO 8601 text); anything else as it is, for the
    server to refuse by its index."""
    if isinstance(submission, Submission):
        return submission.body()
    if not isinstance(submission, Mapping):
        return submission
    body = dict(submission)
    if isinstance(body.get("scheduled_at"), datetime):
        body["scheduled_at"] = body["scheduled_at"].isoformat()
    return body


def _deadline(timeout: float | None) -> float | None:
    """When a wait of ``timeout`` seconds ends (None: never). A negative or NaN timeout is
    refused as the API refuses such a wait (``invalid_wait``), before any request."""
    if timeout is None:
        return None
    if not _seconds(timeout) or timeout < 0:
        raise InvalidRequest(422, "invalid_wait", f"timeout must be a number of seconds, 0 "
                             f"or more, or None (no limit), not {timeout!r}")
    return time.monotonic() + timeout


def _next_step(deadline: float | None) -> float:
    """Seconds the next long poll asks the server to wait."""
    return WAIT_STEP if deadline is None else min(WAIT_STEP,
                                                  max(0.0, deadline - time.monotonic()))


EARLY_PAUSE = 0.1
"""Seconds a wait pauses before asking again when the server answered a long poll early
without the execution having ended (a server that is stopping answers at once)."""


def _pause_after(asked: float, began: float) -> float:
    """Seconds to pause before the next long poll: some, when the server answered in less
    than half the time asked without the execution having ended."""
    elapsed = time.monotonic() - began
    return min(EARLY_PAUSE, asked - elapsed) if elapsed < asked / 2 else 0.0


def _seconds(value: object) -> bool:
    """A finite number (not a bool): a number of seconds, its sign aside."""
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def _check_timeout(timeout: float) -> float:
    if not _seconds(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a number of seconds above 0, not {timeout!r}")
    return float(timeout)


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


@quick_init  # a faster __init__ (veracity/_frozen.py): a batch's answer makes 1,000
@dataclass(frozen=True, slots=True)
class ClientExecution:
    """An execution as the API answers it (README: "An execution is ...")."""

    id: str
    ffqn: str
    status: str
    params: list[Any] | None = None
    result: Any = None
    error: Any = None
    attempt: int = 1
    deployment_id: str = ""
    parent_id: str | None = None
    idempotency_key: str | None = None
    scheduled_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    waiting_reason: str | None = None
    retry_of: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Every field the API answered, as it answered it."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ClientExecution:
        # each field read by name, not by filtering the answer's 33 keys: a batch's answer
        # makes 1,000 of these (tests/client/test_values.py)
        get = data.get
        return cls(
            id=data["id"], ffqn=data["ffqn"], status=data["status"], params=get("params"),
            result=get("result"), error=get("error"), attempt=get("attempt", 1),
            deployment_id=get("deployment_id", ""), parent_id=get("parent_id"),
            idempotency_key=get("idempotency_key"),
            scheduled_at=_time(get("scheduled_at")), created_at=_time(get("created_at")),
            updated_at=_time(get("updated_at")), waiting_reason=get("waiting_reason"),
            retry_of=get("retry_of"), raw=dict(data))


def _batch_answer(response: httpx.Response) -> list[ClientExecution]:
    """The executions of POST /v1/executions/batch's answer. Its 1,000 items are parsed
    by pydantic_core (a dependency of the package already; imported here, when first
    needed, so that ``import veracity`` stays light): some three times as fast as
    ``json.loads``."""
    from pydantic_core import from_json

    return [ClientExecution.of(item) for item in from_json(response.content)["items"]]


@dataclass(frozen=True, slots=True)
class HistoryItem:
    seq: int
    kind: str
    at: datetime
    data: Any

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> HistoryItem:
        return cls(int(data["seq"]), str(data["kind"]), datetime.fromisoformat(data["at"]),
                   data.get("data"))


# -- the shared parts --------------------------------------------------------------------------


def _settings(url: str | None, token: str | None) -> tuple[str, dict[str, str]]:
    base = (url or os.environ.get("VERACITY_URL") or DEFAULT_URL).rstrip("/")
    token = token if token is not None else os.environ.get("VERACITY_TOKEN")
    headers = {"User-Agent": "veracity-client", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return base, headers


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        error = response.json()["error"]
        code, message = str(error.pop("code")), str(error.pop("message"))
        details: dict[str, Any] = error
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", response.text[:500], {}
    kind = _BY_STATUS.get(response.status_code, ApiError)
    if response.status_code == 503 and code == "http_error":  # not the API's own answer
        kind, code = ServerBusy, "server_busy"
    raise kind(response.status_code, code, message, details)


def _list_params(status: str | Sequence[str] | None, ffqn_prefix: str | None,
                 deployment_id: str | None, flagged: bool | None,
                 created_after: datetime | None, created_before: datetime | None,
                 page_size: int) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": page_size}
    if status:
        params["status"] = status if isinstance(status, str) else ",".join(status)
    if ffqn_prefix:
        params["ffqn_prefix"] = ffqn_prefix
    if deployment_id:
        params["deployment_id"] = deployment_id
    if flagged is not None:
        params["flagged"] = "true" if flagged else "false"
    if created_after is not None:  # a time without its offset is refused by the server
        params["created_after"] = created_after.isoformat()
    if created_before is not None:
        params["created_before"] = created_before.isoformat()
    return params


def _submission(ffqn: str, params: Sequence[Any], idempotency_key: str | None,
                scheduled_at: datetime | None, paused: bool) -> dict[str, Any]:
    return Submission(ffqn, params, idempotency_key, scheduled_at, paused).body()


# -- the clients -------------------------------------------------------------------------------


def _verify(transport: object) -> ssl.SSLContext | bool:
    # the process's one context (veracity._tls), unless a transport of the caller's is used
    return ssl_context() if transport is None else True


class Client:
    """A blocking client. ``url`` defaults to ``VERACITY_URL`` (else
    ``http://127.0.0.1:8000``), ``token`` to ``VERACITY_TOKEN``; ``timeout`` bounds each
    request (a long poll waits longer, by its own length). Use it as a context manager, or
    call :meth:`close`."""

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 timeout: float = 10.0, transport: httpx.BaseTransport | None = None) -> None:
        base, headers = _settings(url, token)
        self.url = base
        self.timeout = _check_timeout(timeout)
        self._http = httpx.Client(base_url=base, headers=headers, timeout=timeout,
                                  transport=transport, verify=_verify(transport))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, *, timeout: float | None = None,
              raw: bool = False, **kw: Any) -> Any:
        try:
            response = self._http.request(method, path,
                                          timeout=timeout if timeout else self.timeout, **kw)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{method} {self.url}{path}: {exc!r}") from exc
        _raise_for(response)
        return response if raw else response.json()

    def submit(self, ffqn: str, *params: Any, idempotency_key: str | None = None,
               scheduled_at: datetime | None = None, paused: bool = False) -> ClientExecution:
        """Submit one execution; the same ``idempotency_key`` again answers the same one."""
        return ClientExecution.of(self._call("POST", "/v1/executions", json=_submission(
            ffqn, params, idempotency_key, scheduled_at, paused)))

    def submit_many(self, submissions: Sequence[Submission | Mapping[str, Any]]
                    ) -> list[ClientExecution]:
        """Up to 1,000 submissions in one request and one transaction, answered in order
        (each with its own idempotency key's semantics); a bad one refuses them all."""
        body = [batch_item(s) for s in submissions]
        answer = self._call("POST", "/v1/executions/batch", json={"items": body},
                          raw=True)
        return _batch_answer(answer)

    def get(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(self._call("GET", f"/v1/executions/{execution_id}"))

    def wait(self, execution_id: str, timeout: float | None = None) -> ClientExecution:
        """The execution once it has ended; long polls (the server answers as soon as it
        ends). :class:`WaitTimeout` after ``timeout`` seconds (None: no limit)."""
        deadline = _deadline(timeout)
        while True:
            step, began = _next_step(deadline), time.monotonic()
            execution = ClientExecution.of(self._call(
                "GET", f"/v1/executions/{execution_id}", params={"wait": f"{step:.3f}s"},
                timeout=step + self.timeout))
            if execution.terminal:
                return execution
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(execution)
            if pause := _pause_after(step, began):
                time.sleep(pause)

    def result(self, execution_id: str, timeout: float | None = None) -> Any:
        """The execution's result once it completed; :class:`ExecutionFailed` if it ended
        otherwise, :class:`WaitTimeout` if it has not ended within ``timeout``."""
        execution = self.wait(execution_id, timeout)
        if execution.status != "completed":
            raise ExecutionFailed(execution)
        return execution.result

    def cancel(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(self._call("PUT", f"/v1/executions/{execution_id}/cancel"))

    def pause(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(self._call("PUT", f"/v1/executions/{execution_id}/pause"))

    def unpause(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(self._call("PUT", f"/v1/executions/{execution_id}/unpause"))

    def retry(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(self._call("PUT", f"/v1/executions/{execution_id}/retry"))

    def send(self, execution_id: str, topic: str, payload: Any = None) -> dict[str, Any]:
        """Send a message for ``ctx.recv(topic)``; the message as stored."""
        answer: dict[str, Any] = self._call(
            "POST", f"/v1/executions/{execution_id}/messages",
            json={"topic": topic, "payload": payload})
        return answer

    def list(self, *, status: str | Sequence[str] | None = None, ffqn_prefix: str | None = None,
             deployment_id: str | None = None, flagged: bool | None = None,
             created_after: datetime | None = None, created_before: datetime | None = None,
             page_size: int = 200) -> Iterator[ClientExecution]:
        """Every matching execution, newest first, page by page as it is iterated;
        ``created_after`` and ``created_before`` are times with their offset, each
        exclusive (an execution created at that very time is left out)."""
        params = _list_params(status, ffqn_prefix, deployment_id, flagged, created_after,
                              created_before, page_size)
        while True:
            page = self._call("GET", "/v1/executions", params=params)
            for item in page["items"]:
                yield ClientExecution.of(item)
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    def history(self, execution_id: str) -> builtins.list[HistoryItem]:
        """The execution's whole history, oldest first."""
        items: builtins.list[HistoryItem] = []
        params: dict[str, Any] = {"limit": 10_000}
        while True:
            page = self._call("GET", f"/v1/executions/{execution_id}/history", params=params)
            items += [HistoryItem.of(item) for item in page["items"]]
            if not page["next_cursor"]:
                return items
            params["cursor"] = page["next_cursor"]


class _Lanes:
    """Requests to one server over up to ``limit`` keep-alive connections, each with an
    httpx client of its own that carries one request at a time.

    One httpx client with many connections costs more CPU per request the more connections
    and waiting requests it has: its pool (httpcore 1.0) walks every connection and every
    waiting request on each request, and asks each idle connection's socket whether the
    server closed it. Measured on the project's 2-core machine (a live server on
    PostgreSQL, 2,000 submissions by 16 tasks at once, six runs each, 2026-12-02): the
    client's CPU per call 1.48 to 1.60 ms with one httpx client, 0.64 to 0.75 ms with a
    client per connection; 603 to 657 against 1,061 to 1,305 submissions/s
    (bench/journal.md, "The Python client's connections")."""

    def __init__(self, make: Callable[[], httpx.AsyncClient], limit: int) -> None:
        import asyncio  # here: a script that only uses the blocking Client does not load it

        self._make = make
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[httpx.AsyncClient] = []
        self._opened: list[httpx.AsyncClient] = []
        self._closing: set[asyncio.Future[None]] = set()
        self._closed = False

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        if self._closed:  # as httpx says it of a closed client
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        async with self._slots:
            lane = self._idle.pop() if self._idle else self._open()
            try:
                response = await lane.request(method, path, **kw)
            except BaseException:
                # a request cut short (cancelled, timed out, its connection lost) can leave
                # its lane's one connection slot taken for good (httpcore 1.0: encode/
                # httpcore#1093), and every later request on it waiting for that slot:
                # the lane is closed, never used again
                self._discard(lane)
                raise
            self._idle.append(lane)  # the whole answer was read: free again
            return response

    def _open(self) -> httpx.AsyncClient:
        lane = self._make()
        self._opened.append(lane)
        return lane

    def _discard(self, lane: httpx.AsyncClient) -> None:
        import asyncio

        self._opened.remove(lane)
        closing = asyncio.ensure_future(lane.aclose())  # not cancelled with the request
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        import asyncio

        self._closed = True
        opened, self._opened, self._idle = self._opened, [], []
        for lane in opened:
            await lane.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


MAX_CONNECTIONS = 100
"""Connections an :class:`AsyncClient` opens to its server at most (as httpx's default);
more calls at once wait for one of them."""


class AsyncClient:
    """The same as :class:`Client`, for asyncio code."""

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 timeout: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        base, headers = _settings(url, token)
        self.url = base
        self.timeout = _check_timeout(timeout)
        self._http: httpx.AsyncClient | _Lanes
        if transport is not None:  # the caller's (tests: httpx.MockTransport): as given
            self._http = httpx.AsyncClient(base_url=base, headers=headers, timeout=timeout,
                                           transport=transport, verify=_verify(transport))
        else:
            one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            verify = _verify(None)
            self._http = _Lanes(lambda: httpx.AsyncClient(
                base_url=base, headers=headers, timeout=timeout, verify=verify, limits=one),
                MAX_CONNECTIONS)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, *, timeout: float | None = None,
                    raw: bool = False, **kw: Any) -> Any:
        try:
            response = await self._http.request(
                method, path, timeout=timeout if timeout else self.timeout, **kw)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{method} {self.url}{path}: {exc!r}") from exc
        _raise_for(response)
        return response if raw else response.json()

    async def submit(self, ffqn: str, *params: Any, idempotency_key: str | None = None,
                     scheduled_at: datetime | None = None, paused: bool = False
                     ) -> ClientExecution:
        return ClientExecution.of(await self._call("POST", "/v1/executions", json=_submission(
            ffqn, params, idempotency_key, scheduled_at, paused)))

    async def submit_many(self, submissions: Sequence[Submission | Mapping[str, Any]]
                          ) -> list[ClientExecution]:
        body = [batch_item(s) for s in submissions]
        answer = await self._call("POST", "/v1/executions/batch", json={"items": body},
                          raw=True)
        return _batch_answer(answer)

    async def get(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(await self._call("GET", f"/v1/executions/{execution_id}"))

    async def wait(self, execution_id: str, timeout: float | None = None) -> ClientExecution:
        import asyncio

        deadline = _deadline(timeout)
        while True:
            step, began = _next_step(deadline), time.monotonic()
            execution = ClientExecution.of(await self._call(
                "GET", f"/v1/executions/{execution_id}", params={"wait": f"{step:.3f}s"},
                timeout=step + self.timeout))
            if execution.terminal:
                return execution
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(execution)
            if pause := _pause_after(step, began):
                await asyncio.sleep(pause)

    async def result(self, execution_id: str, timeout: float | None = None) -> Any:
        execution = await self.wait(execution_id, timeout)
        if execution.status != "completed":
            raise ExecutionFailed(execution)
        return execution.result

    async def cancel(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(
            await self._call("PUT", f"/v1/executions/{execution_id}/cancel"))

    async def pause(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(
            await self._call("PUT", f"/v1/executions/{execution_id}/pause"))

    async def unpause(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(
            await self._call("PUT", f"/v1/executions/{execution_id}/unpause"))

    async def retry(self, execution_id: str) -> ClientExecution:
        return ClientExecution.of(
            await self._call("PUT", f"/v1/executions/{execution_id}/retry"))

    async def send(self, execution_id: str, topic: str, payload: Any = None
                   ) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(
            "POST", f"/v1/executions/{execution_id}/messages",
            json={"topic": topic, "payload": payload})
        return answer

    async def list(self, *, status: str | Sequence[str] | None = None,
                   ffqn_prefix: str | None = None, deployment_id: str | None = None,
                   flagged: bool | None = None, created_after: datetime | None = None,
                   created_before: datetime | None = None, page_size: int = 200
                   ) -> AsyncIterator[ClientExecution]:
        params = _list_params(status, ffqn_prefix, deployment_id, flagged, created_after,
                              created_before, page_size)
        while True:
            page = await self._call("GET", "/v1/executions", params=params)
            for item in page["items"]:
                yield ClientExecution.of(item)
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    async def history(self, execution_id: str) -> builtins.list[HistoryItem]:
        items: builtins.list[HistoryItem] = []
        params: dict[str, Any] = {"limit": 10_000}
        while True:
            page = await self._call("GET", f"/v1/executions/{execution_id}/history",
                                    params=params)
            items += [HistoryItem.of(item) for item in page["items"]]
            if not page["next_cursor"]:
                return items
            params["cursor"] = page["next_cursor"]
