"""``ctx.http``: the HTTP client of a step, held to the ``[[http]]`` bindings (docs/http.md).

One client per worker, shared by its executions. Every request it sends, redirects
included, is checked where it leaves the process (the transport): it must be made inside a
step (whose outcome is checkpointed, so a replay does not send it again), to the origin of
a binding (scheme, host and port) with one of that binding's methods. Only then are the
binding's headers, secrets filled in, added to a copy of the request that goes on the
wire: the request objects the step can see (``response.request``, the requests of
redirects, exception attributes) never hold a secret, and a redirect to another origin
gets that origin's headers or is refused.

The client itself (``HttpClient``, in ``_http_client``, with httpx) loads when a worker
first hands one to an execution: a worker starts, and claims, without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from veracity.worker._http_client import HttpClient

__all__ = ["HttpClient", "HttpOutsideStep", "HttpRefused", "digestible", "step_scope"]



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


def __getattr__(name: str) -> Any:
    if name == "HttpClient":
        from veracity.worker._http_client import HttpClient

        return HttpClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def digestible(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A step's arguments without the HTTP client: the rest can still be compared on
    replay (the client is no JSON; with it among them nothing would be)."""
    client = sys.modules.get("veracity.worker._http_client")
    if client is None:  # no client was ever made, so none is among them
        return args
    return tuple(a for a in args if not isinstance(a, client.HttpClient))
