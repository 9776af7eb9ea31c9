"""``ctx.http``: the HTTP client of a step, held to the ``[[http]]`` bindings (docs/http.md).

One client per worker, shared by its executions. Every request it sends, redirects
included, is checked where it leaves the process (the transport): it must be made inside a
step (whose outcome is checkpointed, so a replay does not send it again), to the origin of
a binding (scheme, host and port) with one of that binding's methods. Only then are the
binding's headers, secrets filled in, added to a copy of the request that goes on the
wire: the request objects the step can see (``response.request``, the requests of
redirects, exception attributes) never hold a secret, and a redirect to another origin
gets that origin's headers or is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import httpx
from httpx._client import UseClientDefault
from httpx._types import AuthTypes

from veracity.bindings import Binding, Bindings, holds_secret, redact_text

__all__ = ["HttpClient", "HttpOutsideStep", "HttpRefused", "digestible", "step_scope"]


_DEFAULT_PORTS = {"http": 80, "https": 443}


class HttpRefused(Exception):
    """``ctx.http`` refused a request outside the bindings: nothing was sent. Never
    retried by a step's retry policy (``retryable = False``): asking again changes nothing."""

    retryable = False

    def __init__(self, method: str, url: str, reason: str) -> None:
        super().__init__(f"ctx.http refused {method} {url}: {reason}")
        self.method = method
        self.url = url
        self.reason = reason


class HttpOutsideStep(HttpRefused):
    """``ctx.http`` used outside a step (in the workflow's own code, or after its step
    ended): a request there would be sent again on every replay."""


class _StepScope:
    __slots__ = ("loop", "open")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.open = True


_STEP: ContextVar[_StepScope | None] = ContextVar("veracity_step", default=None)


@contextlib.contextmanager
def step_scope() -> Iterator[None]:
    """Marks the code run by one attempt of a step: ``ctx.http`` sends only from there.
    A task the step leaves behind inherits the mark, closed once the step has ended."""
    scope = _StepScope(asyncio.get_running_loop())
    token = _STEP.set(scope)
    try:
        yield
    finally:
        scope.open = False
        _STEP.reset(token)


def _shown(url: httpx.URL) -> str:
    """The URL as refusals name it: origin and path, without credentials or query."""
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"


def _outside_step() -> str | None:
    scope = _STEP.get()
    if scope is None or not scope.open:
        return ("ctx.http is used outside a step; make the request in a step function "
                "(await ctx.step(fn, ctx.http, ...)), whose result is checkpointed, so that "
                "a replay does not send it again")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not scope.loop:
        return "ctx.http is an async client: use it from an async step function"
    return None


class _Guard(httpx.AsyncBaseTransport):
    """Checks each request against the bindings and sends it with the binding's headers."""

    def __init__(self, bindings: Bindings) -> None:
        self.bindings = bindings
        self._wire: httpx.AsyncHTTPTransport | None = None  # made at the first request

    def binding_for(self, request: httpx.Request) -> Binding:
        """The binding that allows ``request``; else :class:`HttpRefused`, saying why."""
        method, url = request.method, _shown(request.url)
        outside = _outside_step()
        if outside is not None:
            raise HttpOutsideStep(method, url, outside)
        scheme = request.url.scheme
        port = request.url.port
        if port is None:
            port = _DEFAULT_PORTS.get(scheme, 0)
        host = request.url.raw_host.decode("ascii").lower()
        binding = self.bindings.for_origin(scheme, host, port)
        if binding is None:
            raise HttpRefused(method, url, f"the origin {scheme}://{host}:{port} is not "
                              f"bound; {self._known()}")
        if method not in binding.methods:
            raise HttpRefused(method, url, f"binding {binding.name} ({binding.origin}) allows "
                              f"{', '.join(binding.methods)}, not {method}; {self._known()}")
        return binding

    def _known(self) -> str:
        if not self.bindings.items:
            return "no [[http]] bindings are configured (docs/http.md)"
        return "the bindings are " + "; ".join(self.bindings.describe())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        binding = self.binding_for(request)
        headers = request.headers.copy()
        for name, value in binding.headers():
            headers[name] = value  # the binding's header wins over the step's own
        wire = httpx.Request(request.method, request.url, headers=headers,
                             stream=request.stream, extensions=request.extensions)
        if self._wire is None:
            self._wire = httpx.AsyncHTTPTransport(trust_env=False)
        try:
            return await self._wire.handle_async_request(wire)
        except Exception as exc:
            # The HTTP stack may quote a header in its errors (h11 quotes a value it finds
            # illegal; bound values are checked at start so that theirs never is): should
            # one quote a secret, the step's error must not carry it. The same error type,
            # the value redacted, and without the chain that quoted it.
            text = "".join(str(e) for e in _chain(exc))
            if not holds_secret(text):
                raise
            try:
                clean: Exception = type(exc)(redact_text(str(exc)))
            except Exception:
                clean = httpx.TransportError(redact_text(str(exc)))
            raise clean from None

    async def aclose(self) -> None:
        if self._wire is not None:
            await self._wire.aclose()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _no_cookies() -> http.cookiejar.CookieJar:
    # The client is shared by every execution of the worker: a cookie one response sets
    # must not ride along on another execution's requests. (A jar, not httpx.Cookies: the
    # client keeps a jar as it is, and would copy Cookies into a jar without the policy.)
    return http.cookiejar.CookieJar(
        policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


class HttpClient(httpx.AsyncClient):
    """``ctx.http``: an ``httpx.AsyncClient`` that sends only what the bindings allow,
    from inside a step. It belongs to the worker, which closes it."""

    def __init__(self, bindings: Bindings | None = None) -> None:
        self._guard = _Guard(bindings or Bindings())
        # trust_env=False: no proxy or .netrc credentials from the environment; requests go
        # where the bindings say, with the headers they say
        super().__init__(transport=self._guard, trust_env=False, cookies=_no_cookies(),
                         follow_redirects=False)

    @property
    def bindings(self) -> Bindings:
        return self._guard.bindings

    def __repr__(self) -> str:
        return f"<veracity HttpClient bindings: {'; '.join(self.bindings.describe()) or 'none'}>"

    async def send(
        self,
        request: httpx.Request,
        *,
        stream: bool = False,
        auth: AuthTypes | UseClientDefault | None = httpx.USE_CLIENT_DEFAULT,
        follow_redirects: bool | UseClientDefault = httpx.USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        try:
            return await super().send(request, stream=stream, auth=auth,
                                      follow_redirects=follow_redirects)
        except HttpRefused as exc:
            if exc.url != _shown(request.url):  # a redirect's request: say so
                raise type(exc)(exc.method, exc.url, f"{exc.reason} (reached by a redirect "
                                f"from {request.method} {_shown(request.url)})") from None
            raise

    async def aclose(self) -> None:
        raise RuntimeError("ctx.http belongs to the worker, which closes it; "
                           "a step must not close it")

    async def __aenter__(self) -> HttpClient:
        raise RuntimeError("ctx.http belongs to the worker: use it as it is, not in "
                           "'async with'")

    async def close_for_worker(self) -> None:
        """Close the connections (the worker, as it stops)."""
        await super().aclose()


def digestible(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A step's arguments without the HTTP client: the rest can still be compared on
    replay (the client is no JSON; with it among them nothing would be)."""
    return tuple(a for a in args if not isinstance(a, HttpClient))
