"""``ctx.http``'s client (veracity.worker.http): an httpx client whose transport checks
every request against the ``[[http]]`` bindings, from inside a step, and adds the
binding's headers to a copy that goes on the wire (docs/http.md)."""

from __future__ import annotations

import http.cookiejar
from collections.abc import Iterator

import httpx
from httpx._client import UseClientDefault
from httpx._types import AuthTypes

from veracity._tls import ssl_context
from veracity.bindings import Binding, Bindings, holds_secret, redact_text
from veracity.worker.http import HttpOutsideStep, HttpRefused, _outside_step

__all__ = ["HttpClient"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _shown(url: httpx.URL) -> str:
    """The URL as refusals name it: origin and path, without credentials or query."""
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"


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
            self._wire = httpx.AsyncHTTPTransport(verify=ssl_context(trust_env=False),
                                                  trust_env=False)
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


