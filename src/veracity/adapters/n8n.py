"""The n8n adapter: start through a production webhook, inspect and stop through n8n's API.

What Veracity needs of an n8n workflow (see also ``docs/`` and the example workflow):

1. A **Webhook** node (HTTP method POST) with *Respond* set to *Using 'Respond to
   Webhook' node* (``responseMode: "responseNode"``), and the workflow active, so that
   its production URL (``<base_url>/webhook/<path>``) answers.
2. Directly after it, a **Respond to Webhook** node answering JSON
   ``{{ { executionId: $execution.id } }}`` with status 200. n8n's default webhook answer
   carries no execution id; without this node every start is ambiguous.
3. The work itself. The trigger's body is ``{"execution_id", "params", "callback":
   {"complete_url", "fail_url", "token"}}``.
4. Last, an **HTTP Request** node POSTing ``{"result": ...}`` to ``callback.complete_url``
   with the header ``Authorization: Bearer <callback.token>``; and, on the error output of
   each work node (``onError: "continueErrorOutput"``), one POSTing ``{"error": ...}`` to
   ``callback.fail_url``.

The n8n facts this module relies on (checked against n8n's source and documentation):

- ``GET /api/v1/executions/{id}`` with the ``X-N8N-API-KEY`` header answers the execution
  with ``id``, ``status``, ``finished``, ``mode``, ``startedAt``, ``stoppedAt``,
  ``waitTill``; an unknown id is 404 ``{"message": "Not Found"}``, a non-numeric id 400,
  a wrong or missing key 401. ``finished`` is true only for ``success`` and is not used.
  Listing omits the runs n8n holds in memory (waiting ones too), so runs are only ever
  fetched by id.
- Statuses: ``new``, ``running``, ``waiting``, ``success``, ``error``, ``canceled``,
  ``crashed``, ``unknown``; see :func:`veracity.core.reconcile.classify_n8n`.
- Stopping: newer n8n has a public ``POST /api/v1/executions/{id}/stop`` (API-key scope
  ``execution:stop``); n8n 1.x has no such route, and its API router (OpenAPI validation,
  before the key is checked) answers an unknown route 404 ``{"message": "not found"}``
  (405 for a wrong method). There, the internal ``POST /rest/executions/{id}/stop`` works
  with the session cookie (``n8n-auth``) of ``POST /rest/login`` ``{emailOrLdapLoginId,
  password}``, sent with the same ``browser-id`` header used at login (n8n binds the
  session to it). Stopping a run that already ended answers 500 "Only running or waiting
  executions can be stopped" (409 in the newest public API), an unknown id 500 or 404.
  ``auto`` falls back to the session stop only on such a JSON 404 or a 405: an answer of
  the API itself (on 2.x a JSON 404 is an unknown id, whose session stop fails as well).
- Starting up (after a crash or a clean restart; seen on a real n8n 1.123, and in n8n's
  ``BaseCommand.init``, ``AbstractServer.init`` and ``start``): n8n listens before it is
  ready. ``/healthz`` answers ``{"status": "ok"}`` throughout. While its database
  migrations run, every other route answers 200 ``n8n is starting up. Please wait``
  (text/html). Then, for a few seconds (about 4 s on 1.123) until ``start`` mounts the
  webhooks, the REST API and the public API, every other route falls through to Express's
  default 404: an HTML page ``Cannot GET /api/v1/executions/{id}`` (``Cannot POST
  /webhook/...``, ``Cannot POST /rest/login``). Neither says anything about a run. So only
  a 404 whose body is the API's own JSON (an object with a ``message``) means an unknown
  id; any other 404, and that 200 text, is :attr:`EngineErrorKind.NOT_READY`: unknown,
  asked again, never flagged. A trigger so answered started nothing (unavailable); a stop
  so answered was not accepted and does not fall back to the session stop (whose routes
  are not mounted either). A public API disabled by configuration
  (``N8N_PUBLIC_API_DISABLED``) looks the same forever: the ``not_ready`` engine-error
  count says so.

Nothing the engine or the network does raises out of this adapter: answers that are not
JSON, lack fields or carry an unknown status are "unknown" inspections, failed stops or
ambiguous starts. After any stop attempt the caller must inspect the run again and decide
from what n8n then says: a stop request accepted is not a run finished.
"""

from __future__ import annotations

import asyncio
import html
import http.cookiejar
import json as jsonlib
import re
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote, urlsplit

import aiohttp
import httpx

from veracity._tls import ssl_context
from veracity.adapters.base import (
    CallbackInfo,
    EngineErrorKind,
    Inspection,
    StartResult,
    StopResult,
)
from veracity.adapters.config import EngineConfig, StopMode
from veracity.core.reconcile import N8N_TERMINAL_STATUSES, EngineState, classify_n8n

__all__ = ["N8nEngine", "webhook_url"]

_N8N_ID = re.compile(r"[0-9]+")
_MESSAGE_LIMIT = 500
_STARTING_UP = b"n8n is starting up. Please wait"
"""n8n's answer (200, text/html) to every route but /healthz while it migrates."""
_HTML_PRE = re.compile(r"<pre>(.*?)</pre>", re.DOTALL | re.IGNORECASE)
_HTML_TAG = re.compile(r"<[^>]*>")


def webhook_url(base_url: str, webhook: str) -> str:
    """The URL a trigger is POSTed to: ``webhook`` if it is a full http(s) URL, else a path
    under ``base_url``. Raises ``ValueError`` for anything else."""
    text = webhook.strip()
    if not text:
        raise ValueError("empty webhook")
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook {webhook!r}: expected a path or an http(s) URL")
        return text
    return f"{base_url.rstrip('/')}/{text.lstrip('/')}"


class N8nEngine:
    """One n8n instance. :meth:`inspect`, the hot path (one call per running execution
    per reconciler tick), goes over one pooled :class:`aiohttp.ClientSession`, made on the
    first inspect inside the running loop; starts, stops and logins go over one pooled
    :class:`httpx.AsyncClient`. Both pools hold at most ``max_connections`` connections and
    :meth:`aclose` closes both.

    Every call is bounded by ``config.timeout`` as a whole (connect, send and read).
    ``transport`` is for tests: when given, every call, inspect included, goes through
    httpx over it (so the test sees every request).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 64,
    ) -> None:
        self._config = config
        self._max_connections = max_connections
        self._use_httpx_for_inspect = transport is not None
        self._aio: aiohttp.ClientSession | None = None  # made on first inspect, in the loop
        self._closed = False
        self._base = config.base_url.rstrip("/")
        # n8n binds a login session to the browser-id header sent at login; one per adapter.
        self._browser_id = str(uuid.uuid4())
        self._session: dict[str, str] = {}
        self._session_generation = 0
        self._login_lock = asyncio.Lock()
        # A jar that accepts no cookie: the session cookie is kept by hand and sent only to
        # /rest/, never to webhooks (whose workflows could read and store it).
        no_cookies = http.cookiejar.CookieJar(
            policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
        )
        self._client = httpx.AsyncClient(
            base_url=config.base_url,
            timeout=httpx.Timeout(config.timeout),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
            cookies=no_cookies,
            follow_redirects=False,
            headers={"Accept": "application/json", "User-Agent": "veracity"},
            verify=ssl_context() if transport is None else True,  # one per process
        )

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def config(self) -> EngineConfig:
        return self._config

    async def aclose(self) -> None:
        self._closed = True
        aio, self._aio = self._aio, None
        try:
            if aio is not None:
                await aio.close()
        finally:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- start ---------------------------------------------------------------------

    async def start(
        self,
        execution_id: str,
        params: Any,
        callback: CallbackInfo,
        *,
        target: str,
    ) -> StartResult:
        """POST the trigger to the workflow's production webhook.

        Started: 2xx with ``{"executionId": <n8n id>}`` (a JSON string or number).
        Refused: a 4xx other than 429 (the run does not exist), with n8n's message.
        Unavailable: no connection could be made, 429, or n8n still starting up (its 200
        "starting up" text, or a 404 that is not its JSON): nothing was started.
        Ambiguous: a timeout, a broken connection, a 3xx or 5xx, or a 2xx without a usable
        id — the run may exist, and must never be triggered again.
        """
        try:
            url = webhook_url(self._config.base_url, target)
        except ValueError as exc:
            return StartResult.refused(str(exc))
        body = {
            "execution_id": execution_id,
            "params": params,
            "callback": {
                "complete_url": callback.complete_url,
                "fail_url": callback.fail_url,
                "token": callback.token,
            },
        }
        try:
            response = await self._request("POST", url, json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return StartResult.unavailable(f"no connection to n8n: {_describe(exc)}")
        except (TimeoutError, httpx.TimeoutException):
            return StartResult.ambiguous(
                f"no answer within {self._config.timeout:g}s after sending: the run may exist"
            )
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            return StartResult.refused(f"invalid webhook URL {url!r}: {exc}")
        except httpx.HTTPError as exc:
            return StartResult.ambiguous(
                f"connection lost after sending ({_describe(exc)}): the run may exist"
            )

        code = response.status_code
        not_ready = _not_ready(code, response.content)
        if not_ready is not None:
            # n8n answers before its webhooks are mounted: nothing was started.
            return StartResult.unavailable(
                f"{not_ready}: the webhook answered {code}: {_message(response)}", code
            )
        if response.is_success:
            external_id = _execution_id(_json_or_none(response))
            if external_id is None:
                return StartResult.ambiguous(
                    f"the webhook answered {code} without a usable executionId (is a Respond "
                    "to Webhook node answering {executionId: $execution.id} first?): "
                    f"{_message(response)}",
                    code,
                )
            return StartResult.started(external_id, code)
        if code == 429:
            return StartResult.unavailable(f"n8n is busy (429): {_message(response)}", code)
        if 400 <= code < 500:
            return StartResult.refused(_message(response), code)
        return StartResult.ambiguous(
            f"the webhook answered {code}: {_message(response)}; the run may exist", code
        )

    # -- inspect -------------------------------------------------------------------

    async def inspect(self, external_id: str) -> Inspection:
        """GET ``/api/v1/executions/{id}``; anything untrustworthy is an unknown state."""
        if not external_id:
            return Inspection.unknown(EngineErrorKind.BAD_REQUEST, "empty external id")
        if not self._use_httpx_for_inspect:
            return await self._aio_inspect(external_id)
        try:
            response = await self._request(
                "GET", _api_path(external_id), headers=self._api_headers()
            )
        except (TimeoutError, httpx.TimeoutException):
            return self._inspect_timeout()
        except httpx.HTTPError as exc:
            return Inspection.unknown(EngineErrorKind.UNREACHABLE, _describe(exc))
        return _inspection(external_id, response)

    async def _aio_inspect(self, external_id: str) -> Inspection:
        """:meth:`inspect` over aiohttp, answering exactly what the httpx path answers."""
        session = self._aio_session()
        url = self._base + _api_path(external_id)
        try:
            async with asyncio.timeout(self._config.timeout):
                async with session.get(
                    url, headers=self._api_headers(), allow_redirects=False
                ) as answer:
                    code = answer.status
                    body = await answer.read()
                    content_type = answer.headers.get("Content-Type")
                    reason = answer.reason or ""
        except TimeoutError:  # asyncio's, and aiohttp's ServerTimeoutError and kin
            return self._inspect_timeout()
        except (aiohttp.ClientError, OSError) as exc:
            return Inspection.unknown(EngineErrorKind.UNREACHABLE, _describe(exc))
        if 200 <= code < 300 and _not_ready(code, body) is None:
            return _answer_inspection(external_id, code, _loads_or_none(body))
        # Rare: an httpx response for n8n's message, decided exactly as the httpx path does.
        response = httpx.Response(
            code,
            headers={} if content_type is None else {"Content-Type": content_type},
            content=body,
            extensions={"reason_phrase": reason.encode("ascii", errors="ignore")},
        )
        return _inspection(external_id, response)

    def _aio_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the n8n engine is closed")
        if self._aio is None:
            # Synchronous from check to assignment: concurrent first inspects share one.
            self._aio = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0),
                timeout=aiohttp.ClientTimeout(total=self._config.timeout),
                headers={"Accept": "application/json", "User-Agent": "veracity"},
                cookie_jar=aiohttp.DummyCookieJar(),
                raise_for_status=False,
            )
        return self._aio

    def _inspect_timeout(self) -> Inspection:
        return Inspection.unknown(
            EngineErrorKind.TIMEOUT, f"no answer within {self._config.timeout:g}s"
        )

    # -- stop ----------------------------------------------------------------------

    async def stop(self, external_id: str) -> StopResult:
        """Ask n8n to stop the run: the public stop, the session stop, or (``auto``) the
        public one and, when n8n answers 404 (1.x has no such endpoint), the session one.

        ``ok`` means n8n accepted the request, nothing more: inspect again afterwards.
        """
        if not external_id:
            return StopResult(False, "empty external id")
        mode = self._config.stop
        if mode is StopMode.SESSION:
            return await self._session_stop(external_id)
        public, no_such_endpoint = await self._public_stop(external_id)
        if mode is StopMode.AUTO and no_such_endpoint:
            if not self._config.has_login:
                return StopResult(
                    False,
                    f"{public.reason}; no session stop either: set login_email_env and "
                    f"login_password_env in {self._config.entry} for n8n 1.x",
                    "public",
                    public.status_code,
                )
            return await self._session_stop(external_id)
        return public

    async def _public_stop(self, external_id: str) -> tuple[StopResult, bool]:
        """The public stop's result, and whether n8n's API said it has no such endpoint (a
        JSON 404, or 405): only then may ``auto`` try the session stop."""
        path = _api_path(external_id) + "/stop"
        try:
            response = await self._request("POST", path, headers=self._api_headers())
        except (TimeoutError, httpx.TimeoutException):
            return StopResult(False, self._timeout_reason("public stop"), "public"), False
        except httpx.HTTPError as exc:
            reason = f"public stop: unreachable: {_describe(exc)}"
            return StopResult(False, reason, "public"), False
        code = response.status_code
        failed = _failed_answer("public stop", response)
        if failed is not None:  # n8n is starting up: no fallback, its /rest/ is not up either
            return StopResult(False, failed, "public", code), False
        if response.is_success:
            return StopResult(True, "stop accepted", "public", code), False
        reason = f"public stop answered {code}: {_message(response)}"
        return StopResult(False, reason, "public", code), code in (404, 405)

    async def _session_stop(self, external_id: str) -> StopResult:
        path = f"/rest/executions/{quote(external_id, safe='')}/stop"
        stale: int | None = None
        for attempt in (1, 2):
            generation, failure = await self._ensure_session(stale)
            if failure is not None:
                return failure
            try:
                response = await self._request("POST", path, headers=self._session_headers())
            except (TimeoutError, httpx.TimeoutException):
                return StopResult(False, self._timeout_reason("session stop"), "session")
            except httpx.HTTPError as exc:
                return StopResult(False, f"session stop: unreachable: {_describe(exc)}", "session")
            self._keep_session_cookies(response)
            if response.status_code == 401 and attempt == 1:
                stale = generation  # the session expired or was revoked: log in again, once
                continue
            failed = _failed_answer("session stop", response)
            if failed is not None:
                return StopResult(False, failed, "session", response.status_code)
            if response.is_success:
                return StopResult(True, "stop accepted", "session", response.status_code)
            return StopResult(
                False,
                f"session stop answered {response.status_code}: {_message(response)}",
                "session",
                response.status_code,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _ensure_session(self, stale: int | None) -> tuple[int, StopResult | None]:
        """A live login session: reuse it, or log in when there is none or when ``stale``
        (the generation that just got 401) is still the current one."""
        async with self._login_lock:
            have = bool(self._session)
            if have and (stale is None or stale != self._session_generation):
                return self._session_generation, None
            failure = await self._login()
            return self._session_generation, failure

    async def _login(self) -> StopResult | None:
        email, password = self._config.login_email, self._config.login_password
        if not email or not password:
            return StopResult(
                False,
                f"session stop needs a login: set login_email_env and login_password_env "
                f"in {self._config.entry}",
                "session",
            )
        try:
            response = await self._request(
                "POST",
                "/rest/login",
                json={"emailOrLdapLoginId": email, "password": password},
                headers={"browser-id": self._browser_id},
            )
        except (TimeoutError, httpx.TimeoutException):
            return StopResult(False, self._timeout_reason("login"), "session")
        except httpx.HTTPError as exc:
            return StopResult(False, f"login: unreachable: {_describe(exc)}", "session")
        failed = _failed_answer("login", response)
        if failed is not None:
            return StopResult(False, failed, "session", response.status_code)
        if not response.is_success:
            return StopResult(
                False,
                f"login answered {response.status_code}: {_message(response)}",
                "session",
                response.status_code,
            )
        # Replaced only once the new session exists: a concurrent stop keeps a usable cookie.
        fresh = {cookie.name: cookie.value for cookie in response.cookies.jar if cookie.value}
        if not fresh:
            return StopResult(
                False, "login answered without a session cookie", "session", response.status_code
            )
        self._session = fresh
        self._session_generation += 1
        return None

    def _keep_session_cookies(self, response: httpx.Response) -> None:
        # n8n re-issues its cookie when the session nears expiry: keep the newest.
        for cookie in response.cookies.jar:
            if cookie.value:
                self._session[cookie.name] = cookie.value

    # -- plumbing ------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        async with asyncio.timeout(self._config.timeout):
            return await self._client.request(method, url, json=json, headers=headers)

    def _api_headers(self) -> dict[str, str]:
        return {"X-N8N-API-KEY": self._config.api_key}

    def _session_headers(self) -> dict[str, str]:
        cookie = "; ".join(f"{name}={value}" for name, value in self._session.items())
        return {"browser-id": self._browser_id, "Cookie": cookie}

    def _timeout_reason(self, what: str) -> str:
        return f"{what}: no answer within {self._config.timeout:g}s"


def _api_path(external_id: str) -> str:
    return f"/api/v1/executions/{quote(external_id, safe='')}"


def _inspection(external_id: str, response: httpx.Response) -> Inspection:
    code = response.status_code
    not_ready = _not_ready(code, response.content)
    if not_ready is not None:
        return Inspection.unknown(
            EngineErrorKind.NOT_READY, f"{code}: {not_ready}: {_message(response)}"
        )
    if not response.is_success:
        return _failed_inspection(code, _message(response))
    return _answer_inspection(external_id, code, _json_or_none(response))


def _not_ready(code: int, body: bytes) -> str | None:
    """Why an answer is n8n starting up rather than an answer of its API; None if it is
    not. (See the module docstring: both answers say nothing about any run.)"""
    if 200 <= code < 300 and body.strip() == _STARTING_UP:
        return "n8n is starting up (migrating its database)"
    if code == 404 and not _api_answer(body):
        return "n8n's API is not answering yet (starting up?)"
    return None


def _api_answer(body: bytes) -> bool:
    """The body is an answer of n8n's API itself: a JSON object with a ``message``."""
    data = _loads_or_none(body)
    return isinstance(data, dict) and isinstance(data.get("message"), str)


def _failed_answer(what: str, response: httpx.Response) -> str | None:
    """The reason a stop or login answer is n8n starting up; None if it is not."""
    not_ready = _not_ready(response.status_code, response.content)
    if not_ready is None:
        return None
    return f"{what}: {not_ready} ({response.status_code}: {_message(response)})"


def _failed_inspection(code: int, message: str) -> Inspection:
    """The inspection of a non-2xx answer ``code`` carrying ``message`` (a 404 here is the
    API's own: :func:`_not_ready` has taken the others)."""
    kind = {
        404: EngineErrorKind.NOT_FOUND,
        400: EngineErrorKind.BAD_REQUEST,
        401: EngineErrorKind.UNAUTHORIZED,
        403: EngineErrorKind.UNAUTHORIZED,
    }.get(code)
    if kind is None:
        kind = EngineErrorKind.SERVER_ERROR if code >= 500 else EngineErrorKind.HTTP_ERROR
    return Inspection.unknown(kind, f"{code}: {message}")


def _answer_inspection(external_id: str, code: int, data: Any) -> Inspection:
    """The inspection of a 2xx answer ``code`` whose body decoded to ``data`` (``None``:
    not JSON)."""
    if not isinstance(data, dict):
        shown = "not JSON" if data is None else f"JSON {type(data).__name__}, not an object"
        return Inspection.unknown(EngineErrorKind.BAD_JSON, f"{code}: the answer is {shown}")
    if "id" in data and not _same_id(data["id"], external_id):
        return Inspection.unknown(
            EngineErrorKind.INCONSISTENT, f"asked for {external_id}, got id {data['id']!r}"
        )
    status = data.get("status")
    if not isinstance(status, str):
        what = "no status" if status is None else f"status {status!r} is not a string"
        return Inspection.unknown(EngineErrorKind.MISSING_FIELDS, what)
    stopped_at, wait_till = data.get("stoppedAt"), data.get("waitTill")
    for field_name, value in (("stoppedAt", stopped_at), ("waitTill", wait_till)):
        if value is not None and not isinstance(value, str):
            return Inspection.unknown(
                EngineErrorKind.MISSING_FIELDS,
                f"{field_name} {value!r} is not a string",
                status=status,
            )
    state = classify_n8n(status, stopped_at)
    if state is EngineState.UNKNOWN:
        if status in N8N_TERMINAL_STATUSES:
            kind, detail = EngineErrorKind.INCONSISTENT, f"status {status!r} without stoppedAt"
        else:
            kind, detail = EngineErrorKind.UNKNOWN_STATUS, f"status {status!r}"
        return Inspection(
            state,
            status=status,
            stopped_at=stopped_at,
            wait_till=wait_till,
            error=kind,
            detail=detail,
        )
    return Inspection(state, status=status, stopped_at=stopped_at, wait_till=wait_till)


def _same_id(value: object, external_id: str) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | str):
        return str(value) == external_id
    return False


def _execution_id(data: object) -> str | None:
    """n8n's id from the Respond to Webhook answer, normalised to a string of digits."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict):
        return None
    value = data.get("executionId")
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        return None
    return text if _N8N_ID.fullmatch(text) else None


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _loads_or_none(body: bytes) -> Any:
    """The body as JSON, decoded as :meth:`httpx.Response.json` does; ``None`` if not JSON."""
    try:
        return jsonlib.loads(body)
    except ValueError:
        return None


def _message(response: httpx.Response) -> str:
    """n8n's own message from an answer, shortened; the reason phrase if there is none."""
    data = _json_or_none(response)
    text: str | None = None
    if isinstance(data, dict):
        for key in ("message", "error"):
            if isinstance(data.get(key), str) and data[key].strip():
                text = data[key].strip()
                break
        if text is not None and isinstance(data.get("hint"), str) and data["hint"].strip():
            text = f"{text} ({data['hint'].strip()})"
    if text is None:
        try:
            text = response.text.strip()
        except (UnicodeDecodeError, LookupError):
            text = ""
        if text.startswith("<"):  # an HTML page (Express's 404): its message, not its markup
            pre = _HTML_PRE.search(text)
            text = " ".join(
                html.unescape(_HTML_TAG.sub(" ", pre.group(1) if pre else text)).split()
            )
    if not text:
        text = response.reason_phrase or f"HTTP {response.status_code}"
    if len(text) > _MESSAGE_LIMIT:
        text = text[:_MESSAGE_LIMIT] + "…"
    return text


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
