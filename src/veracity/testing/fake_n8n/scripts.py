"""What a run does: :class:`Work` and :class:`Wait` steps, then the :class:`Script`'s outcome,
with the misbehaviours it scripts around the run, and their JSON forms (the control API's).
Also n8n's Wait-node facts: :data:`WAIT_INDEFINITELY` and :data:`PARK_THRESHOLD_SECONDS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

WAIT_INDEFINITELY = datetime(3000, 1, 1, tzinfo=UTC)
"""n8n's ``waitTill`` for a run that waits for a webhook."""

PARK_THRESHOLD_SECONDS = 65.0
"""n8n's Wait node keeps shorter waits in memory (status running) and parks longer ones."""

Outcome = Literal["success", "error", "crash", "forget", "keep_running"]
Respond = Literal["id", "default", "refuse", "hang"]
CallbackMode = Literal["once", "lose", "duplicate"]
_OUTCOMES: tuple[str, ...] = ("success", "error", "crash", "forget", "keep_running")
_RESPONDS: tuple[str, ...] = ("id", "default", "refuse", "hang")
_CALLBACK_MODES: tuple[str, ...] = ("once", "lose", "duplicate")


@dataclass(frozen=True)
class Work:
    """The run is busy (status running, stoppedAt null) for ``seconds`` (None: forever)."""

    seconds: float | None = 0.2


@dataclass(frozen=True)
class Wait:
    """A Wait node.

    ``seconds=None`` waits for a webhook (``waitTill`` year 3000) until :meth:`FakeN8n.resume`
    or ``POST /webhook-waiting/{id}``. ``park``: None behaves like n8n (park when the wait is
    65 s or longer); True/False force it. A parked run reads waiting with stoppedAt set; after the
    resume it reads running with the old stoppedAt for ``stale_stopped_for`` seconds.
    """

    seconds: float | None = None
    park: bool | None = None
    stale_stopped_for: float = 2.0

    def parks(self) -> bool:
        if self.seconds is None:
            return True
        if self.park is not None:
            return self.park
        return self.seconds >= PARK_THRESHOLD_SECONDS


Step = Work | Wait


@dataclass(frozen=True)
class Script:
    """What one run does, and how the fake misbehaves around it.

    Run: ``queued_for`` seconds in status new, then ``steps``, then ``outcome``: ``success``
    (calls the complete URL with ``result``), ``error`` (calls the fail URL with ``error`` and,
    when not None, ``transient``), ``crash`` (status crashed, no callback), ``forget`` (the run
    vanishes: 404 from then on, no callback) or ``keep_running`` (never ends by itself).

    Trigger: ``respond`` = ``id`` (``{"executionId": "<id>"}``), ``default`` (n8n's default
    ``{"message": "Workflow was started"}``), ``refuse`` (``refuse_status`` with ``refuse_body``,
    no run is created; the default is what a Webhook node's header auth answers) or ``hang``
    (the run starts, the answer never comes until the fake shuts down). ``respond_delay`` delays
    the answer after the run has started (longer than the caller's timeout: the run exists, the
    caller never learns its id).

    Callbacks: ``callback`` = ``once``, ``lose`` (never called) or ``duplicate`` (called twice).
    Stops: the first ``stop_failures`` stop requests answer 500 and change nothing; the next
    ``ignore_stops`` answer OK (claiming canceled) while the run keeps running.
    Execution GET: ``get_error`` answers that HTTP status instead; ``get_delay`` answers late;
    ``get_hang`` never answers (until shutdown); ``get_raw_body`` answers 200 with that text;
    ``report_status`` reports that ``status`` instead of the true one.
    """

    steps: tuple[Step, ...] = (Work(0.2),)
    outcome: Outcome = "success"
    result: Any = None
    error: Any = "scripted failure"
    transient: bool | None = None
    queued_for: float = 0.0
    respond: Respond = "id"
    respond_delay: float = 0.0
    refuse_status: int = 403
    refuse_body: Any = "Authorization data is wrong!"
    callback: CallbackMode = "once"
    ignore_stops: int = 0
    stop_failures: int = 0
    get_error: int | None = None
    get_delay: float = 0.0
    get_hang: bool = False
    get_raw_body: str | None = None
    report_status: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.steps, tuple):
            object.__setattr__(self, "steps", tuple(self.steps))
        for step in self.steps:
            if not isinstance(step, Work | Wait):
                raise ValueError(f"not a step: {step!r}")
            seconds = step.seconds
            if seconds is not None and (seconds < 0 or math.isnan(seconds)):
                raise ValueError(f"negative duration in {step!r}")
        if self.outcome not in _OUTCOMES:
            raise ValueError(f"outcome must be one of {_OUTCOMES}, not {self.outcome!r}")
        if self.respond not in _RESPONDS:
            raise ValueError(f"respond must be one of {_RESPONDS}, not {self.respond!r}")
        if self.callback not in _CALLBACK_MODES:
            raise ValueError(f"callback must be one of {_CALLBACK_MODES}, not {self.callback!r}")
        for name in ("queued_for", "respond_delay", "get_delay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.ignore_stops < 0 or self.stop_failures < 0:
            raise ValueError("ignore_stops and stop_failures must not be negative")

    @classmethod
    def succeed(cls, after: float = 0.2, result: Any = None, **kw: Any) -> Script:
        return cls(steps=(Work(after),), outcome="success", result=result, **kw)

    @classmethod
    def fail(cls, after: float = 0.2, error: Any = "scripted failure", **kw: Any) -> Script:
        return cls(steps=(Work(after),), outcome="error", error=error, **kw)

    @classmethod
    def forever(cls, **kw: Any) -> Script:
        return cls(steps=(), outcome="keep_running", **kw)

    def to_json(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        for step in self.steps:
            if isinstance(step, Work):
                steps.append({"work": step.seconds})
            else:
                steps.append(
                    {
                        "wait": step.seconds,
                        "park": step.park,
                        "stale_stopped_for": step.stale_stopped_for,
                    }
                )
        out: dict[str, Any] = {"steps": steps}
        for name in _SCRIPT_FIELDS:
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Script:
        """Build a script from JSON.

        ``{"steps": [{"work": 0.2}, {"wait": 0.3, "park": true, "stale_stopped_for": 0.5},
        {"wait": null}], "outcome": "success", ...}`` plus any other field of :class:`Script`
        by name. ``{"work": null}`` works forever; ``{"wait": null}`` waits for a webhook.
        """
        if not isinstance(data, Mapping):
            raise ValueError("a script is a JSON object")
        unknown = set(data) - {"steps", *_SCRIPT_FIELDS}
        if unknown:
            raise ValueError(f"unknown script fields: {sorted(unknown)}")
        kwargs: dict[str, Any] = {k: data[k] for k in _SCRIPT_FIELDS if k in data}
        if "steps" in data:
            raw_steps = data["steps"]
            if not isinstance(raw_steps, list):
                raise ValueError("steps is a list")
            kwargs["steps"] = tuple(_step_from_json(s) for s in raw_steps)
        return cls(**kwargs)


_SCRIPT_FIELDS: tuple[str, ...] = (
    "outcome",
    "result",
    "error",
    "transient",
    "queued_for",
    "respond",
    "respond_delay",
    "refuse_status",
    "refuse_body",
    "callback",
    "ignore_stops",
    "stop_failures",
    "get_error",
    "get_delay",
    "get_hang",
    "get_raw_body",
    "report_status",
)


def _step_from_json(raw: Any) -> Step:
    if not isinstance(raw, Mapping):
        raise ValueError(f"a step is a JSON object, not {raw!r}")
    if "work" in raw:
        if set(raw) != {"work"}:
            raise ValueError(f"unknown keys in {raw!r}")
        return Work(_opt_float(raw["work"]))
    if "wait" in raw:
        if set(raw) - {"wait", "park", "stale_stopped_for"}:
            raise ValueError(f"unknown keys in {raw!r}")
        park = raw.get("park")
        if park is not None and not isinstance(park, bool):
            raise ValueError("park is a boolean")
        stale = raw.get("stale_stopped_for", 2.0)
        return Wait(_opt_float(raw["wait"]), park=park, stale_stopped_for=float(stale))
    raise ValueError(f"a step is {{'work': s}} or {{'wait': s}}, not {raw!r}")


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number of seconds")
    return float(value)
