"""The generation reconciler (docs/generations.md): a finite workflow, run periodically (a
``[[cron]]`` entry), that keeps one execution of a managed long-running workflow per logical
key on the current deployment.

:class:`Generations` registers the reconciler workflow on an App. Each run

1. reads the desired keys (a step: the function you give, e.g. reading a file);
2. runs :func:`reconcile_workers`, the control-plane activity, as a step through
   ``ctx.http`` and a ``[[http]]`` binding to the Veracity API (its token in the binding's
   header): it reads the reconciler's own deployment from its own execution record, lists
   every page of unfinished executions whose name starts with the prefix, decides with
   :func:`veracity.core.generations.plan` (pure), and cancels and pauses what the plan
   says, idempotently;
3. schedules (``ctx.schedule``) a managed execution on its own deployment for each desired
   key that has none, and returns ``kept N; started M``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

import httpx

from veracity.app import App
from veracity.core.ffqn import InvalidFfqn, validate_ffqn, validate_ffqn_prefix
from veracity.core.generations import (
    MissingKey,
    Observed,
    desired_keys,
    legacy_name,
    plan,
)
from veracity.worker.context import Context

__all__ = ["ControlPlaneError", "Generations", "MissingKey", "reconcile_workers"]

UNFINISHED = "pending,running,blocked,paused"
MAX_PAGE = 1000
TERMINAL = ("completed", "failed", "cancelled")

DesiredKeys = Callable[[], Iterable[str] | Awaitable[Iterable[str]]]


class ControlPlaneError(Exception):
    """The Veracity API refused or failed a request of the reconciler. A refusal (4xx:
    a token without the scope, a bad request) is not retried: asking again changes nothing;
    a server error or an outage is (``retryable``)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class _NotRetried(ValueError):
    retryable = False


def _fail(response: httpx.Response, what: str) -> ControlPlaneError:
    try:
        error = response.json().get("error") or {}
        detail = f"{error.get('code')}: {error.get('message')}"
    except ValueError:
        detail = response.text[:200]
    return ControlPlaneError(f"{what}: {response.status_code} {detail}",
                             retryable=response.status_code >= 500)


def _binding_origin(http: httpx.AsyncClient, binding: str) -> str:
    found = getattr(http, "bindings", None)
    for b in getattr(found, "items", ()):
        if b.name == binding:
            return str(b.origin)
    names = ", ".join(b.name for b in getattr(found, "items", ())) or "none"
    raise _NotRetried(f"the generation reconciler's [[http]] binding {binding!r} is not "
                      f"configured (the bindings are: {names})")


def _observed(item: dict[str, Any]) -> Observed:
    return Observed(
        id=str(item["id"]), ffqn=str(item["ffqn"]), deployment_id=str(item["deployment_id"]),
        params=item.get("params"), created_at=datetime.fromisoformat(item["created_at"]),
        status=str(item["status"]), cancel_requested=item.get("cancel_requested_at") is not None,
        pause_requested=item.get("pause_requested_at") is not None)


async def _list(http: httpx.AsyncClient, base: str, prefix: str, page_size: int
                ) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query: dict[str, Any] = {"ffqn_prefix": prefix, "status": UNFINISHED,
                                 "limit": page_size}
        if cursor is not None:
            query["cursor"] = cursor
        response = await http.get(f"{base}/v1/executions", params=query)
        if response.status_code != 200:
            raise _fail(response, f"listing the executions of {prefix}")
        page = response.json()
        items.extend(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return items


async def _whole(http: httpx.AsyncClient, base: str, item: dict[str, Any]) -> dict[str, Any]:
    """A list item leaves out large params: the execution itself has them."""
    if item.get("params") is not None or "params" not in (item.get("elided") or {}):
        return item
    response = await http.get(f"{base}/v1/executions/{item['id']}")
    if response.status_code != 200:
        raise _fail(response, f"reading execution {item['id']}")
    whole: dict[str, Any] = response.json()
    return whole


async def _cancel(http: httpx.AsyncClient, base: str, execution_id: str) -> None:
    """Cancel; an execution already ended, or already cancelled, counts as done."""
    response = await http.put(f"{base}/v1/executions/{execution_id}/cancel")
    if response.status_code != 200:
        raise _fail(response, f"cancelling execution {execution_id}")


async def _pause(http: httpx.AsyncClient, base: str, execution_id: str) -> None:
    """Pause; an execution already paused or ended counts as done."""
    response = await http.put(f"{base}/v1/executions/{execution_id}/pause")
    if response.status_code == 200:
        return
    if response.status_code == 409:
        error = response.json().get("error") or {}
        if error.get("code") == "wrong_state" and error.get("state") in TERMINAL:
            return
    raise _fail(response, f"pausing execution {execution_id}")


async def reconcile_workers(
    http: httpx.AsyncClient, execution_id: str, desired: list[str], *, managed: str,
    binding: str, ffqn_prefix: str | None = None, key_index: int = 0,
    page_size: int = MAX_PAGE, concurrency: int = 16,
) -> dict[str, Any]:
    """The control-plane activity: run it as a step, ``ctx.step(reconcile_workers,
    ctx.http, str(ctx.execution_id), keys, managed=..., binding=...)``.

    Reads the deployment of execution ``execution_id`` (the reconciler's own) through the
    API at the origin of ``binding``, lists every unfinished execution whose name starts
    with ``ffqn_prefix`` (default: the managed name without ``-cancellable``, which both the
    managed and the legacy name start with), decides with
    :func:`veracity.core.generations.plan`, and cancels and pauses accordingly
    (``concurrency`` requests at once). A managed execution without its key stops it
    before anything is changed (:class:`MissingKey`).

    Returns ``{"deployment_id", "kept": {key: id}, "start": [key, ...], "cancelled": n,
    "paused": n}``."""
    base = _binding_origin(http, binding)
    prefix = ffqn_prefix or legacy_name(managed)
    response = await http.get(f"{base}/v1/executions/{execution_id}")
    if response.status_code != 200:
        raise _fail(response, f"reading the reconciler's own execution {execution_id}")
    current = str(response.json()["deployment_id"])
    items = await _list(http, base, prefix, page_size)
    wanted = {managed}
    items = [await _whole(http, base, i) if i["ffqn"] in wanted else i for i in items]
    decided = plan([_observed(i) for i in items], desired, current_deployment=current,
                   managed_ffqn=managed, key_index=key_index)

    gate = asyncio.Semaphore(concurrency)

    async def gated(action: Awaitable[None]) -> None:
        async with gate:
            await action

    await asyncio.gather(*(gated(_cancel(http, base, r.id)) for r in decided.cancel),
                         *(gated(_pause(http, base, i)) for i in decided.pause))
    return {"deployment_id": current, "kept": decided.keep, "start": list(decided.start),
            "cancelled": len(decided.cancel), "paused": len(decided.pause)}


class Generations:
    """The generation reconciler of one managed workflow.

    ``reconciler``: the name to register the reconciler workflow under (finite; run it from
    a ``[[cron]]`` entry). ``managed``: the managed workflow, ending in ``-cancellable``.
    ``binding``: the ``[[http]]`` binding to the Veracity API (its origin is where the
    activity sends its requests, its header the API token). ``desired_keys``: a function,
    plain or async, returning the keys that should each have one execution (read on every
    run, as a step). ``key_index``: the position of the key in the managed workflow's
    params. ``start_params``: the params a new execution is started with (default:
    ``[key]``). ``start``: the workflow started for a key that has no managed execution
    (default: the managed one); a cleanup supervisor that runs the managed workflow as its
    child, say (docs/generations.md).
    """

    def __init__(
        self, *, reconciler: str, managed: str, binding: str, desired_keys: DesiredKeys,
        key_index: int = 0, start_params: Callable[[str], list[Any]] | None = None,
        ffqn_prefix: str | None = None, page_size: int = MAX_PAGE, concurrency: int = 16,
        start: str | None = None,
    ) -> None:
        for name in (reconciler, managed, start or managed):
            try:
                validate_ffqn(name)
            except InvalidFfqn as exc:
                raise ValueError(str(exc)) from None
        self.legacy = legacy_name(managed)
        if ffqn_prefix is not None:
            try:
                validate_ffqn_prefix(ffqn_prefix)
            except InvalidFfqn as exc:
                raise ValueError(str(exc)) from None
            if not managed.startswith(ffqn_prefix):
                raise ValueError(f"ffqn_prefix {ffqn_prefix!r} does not match the managed "
                                 f"workflow {managed!r}")
        if key_index < 0:
            raise ValueError("key_index must not be negative")
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(f"page_size must be 1 to {MAX_PAGE}")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.reconciler = reconciler
        self.managed = managed
        self.start = start or managed
        self.binding = binding
        self.desired_keys = desired_keys
        self.key_index = key_index
        self.start_params = start_params or (lambda key: [key])
        self.ffqn_prefix = ffqn_prefix
        self.page_size = page_size
        self.concurrency = concurrency

    async def _desired(self) -> list[str]:
        keys = self.desired_keys()
        if inspect.isawaitable(keys):
            keys = await keys
        try:
            return desired_keys(keys)
        except ValueError as exc:
            raise _NotRetried(str(exc)) from None

    async def run(self, ctx: Context) -> str:
        """The reconciler workflow's body (registered by :meth:`register`)."""
        keys = await ctx.step_with(self._desired, name="desired_keys")
        outcome = await ctx.step_with(
            reconcile_workers, ctx.http, str(ctx.execution_id), keys, name="reconcile_workers",
            managed=self.managed, binding=self.binding, ffqn_prefix=self.ffqn_prefix,
            key_index=self.key_index, page_size=self.page_size, concurrency=self.concurrency)
        for key in outcome["start"]:
            ctx.schedule(self.start, *self.start_params(key))
        return f"kept {len(outcome['kept'])}; started {len(outcome['start'])}"

    def register(self, app: App) -> Callable[[Context], Awaitable[str]]:
        """Register the reconciler workflow on ``app``; returns its function."""

        async def reconcile(ctx: Context) -> str:
            return await self.run(ctx)

        reconcile.__qualname__ = f"reconcile[{self.reconciler}]"
        app.workflow(self.reconciler)(reconcile)
        return reconcile
