"""The application registry: which workflows this deployment can run.

``App`` is what users build in their own module and name with ``app = "module:attr"``;
the server uses it to reject unknown workflow names and (from the workers issue on) the
workers use it to find the function behind a name.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

from veracity.core.deployments import Upgrade
from veracity.core.ffqn import InvalidFfqn, validate_ffqn
from veracity.core.retry import NO_RETRY, RetryPolicy
from veracity.errors import ConfigError

WorkflowFn = Callable[..., Awaitable[Any]]
F = TypeVar("F", bound=WorkflowFn)


@dataclass(frozen=True, slots=True)
class WorkflowDef:
    ffqn: str
    fn: WorkflowFn
    timeout: timedelta | None = None
    retry: RetryPolicy = NO_RETRY
    """Retries of the whole workflow after its own error (or its timeout): each retry runs
    it afresh. Default: none."""
    upgrade: Upgrade = Upgrade.PINNED
    """Which deployment's workers run its executions (docs/deployments.md)."""


class App:
    """A set of workflows, registered with :meth:`workflow`."""

    def __init__(self, name: str = "veracity") -> None:
        self.name = name
        self._workflows: dict[str, WorkflowDef] = {}

    def workflow(
        self, ffqn: str, *, timeout: float | timedelta | None = None,
        retry: RetryPolicy | None = None,
        upgrade: str = "pinned",
    ) -> Callable[[F], F]:
        """Register an async function as the workflow named ``ffqn``.

        ``ffqn`` is ``namespace:package/interface.function``; end it in ``-cancellable``
        if the workflow may be cancelled from outside. ``timeout`` bounds one run.
        ``retry`` retries the whole workflow when it fails with its own error or its
        timeout (each retry starts afresh, after the policy's delay); default: no retry.
        Steps have their own policy (``ctx.step_with``).
        ``upgrade`` (docs/deployments.md): ``"pinned"`` (the default), its executions are
        run only by workers of the deployment they belong to; ``"auto"``, a worker of any
        deployment claims them, and they move onto its deployment (their histories must
        replay on the new code).
        """
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError("retry must be a veracity.RetryPolicy")
        try:
            validate_ffqn(ffqn)
        except InvalidFfqn as exc:
            raise ValueError(str(exc)) from None
        try:
            mode = Upgrade(upgrade)
        except ValueError:
            raise ValueError(f"upgrade must be 'pinned' or 'auto', not {upgrade!r}") from None
        if isinstance(timeout, int | float):
            if timeout <= 0:
                raise ValueError("timeout must be positive")
            timeout = timedelta(seconds=timeout)

        def register(fn: F) -> F:
            if not inspect.iscoroutinefunction(cast(Any, fn)):
                raise TypeError(f"workflow {ffqn!r} must be an async function (async def)")
            if ffqn in self._workflows:
                raise ValueError(f"workflow {ffqn!r} is registered twice")
            self._workflows[ffqn] = WorkflowDef(ffqn, fn, timeout, retry or NO_RETRY, mode)
            return fn

        return register

    @property
    def workflows(self) -> Mapping[str, WorkflowDef]:
        return dict(self._workflows)

    def __contains__(self, ffqn: object) -> bool:
        return ffqn in self._workflows

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._workflows))

    def get(self, ffqn: str) -> WorkflowDef | None:
        return self._workflows.get(ffqn)

    @property
    def upgrading(self) -> list[str]:
        """The workflows registered with ``upgrade="auto"``."""
        return sorted(f for f, wf in self._workflows.items() if wf.upgrade is Upgrade.AUTO)

    def code_digest(self) -> str:
        """A digest of the registered workflows' names and source code: the default
        deployment id, so a code change starts a new deployment generation."""
        h = hashlib.sha256()
        for ffqn in sorted(self._workflows):
            fn = self._workflows[ffqn].fn
            try:
                source = inspect.getsource(fn)
            except (OSError, TypeError):
                source = f"{fn.__module__}.{fn.__qualname__}"
            h.update(ffqn.encode())
            h.update(b"\0")
            h.update(source.encode())
            h.update(b"\0")
        return "d-" + h.hexdigest()[:16]


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the App it names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"app {spec!r}: expected 'module:attribute'")
    # as uvicorn and celery do: the app's module is found in the current folder
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way while importing
        raise ConfigError(f"app {spec!r}: cannot import {module_name}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"app {spec!r}: {module_name} has no attribute {attr}") from None
    if not isinstance(obj, App):
        raise ConfigError(f"app {spec!r} is a {type(obj).__name__}, not a veracity.App")
    return obj
