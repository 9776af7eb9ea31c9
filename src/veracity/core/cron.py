"""Cron schedules, ``[[cron]]`` entries and the slot decision (docs/cron.md). Pure code.

A schedule is a cron expression of 5 fields (minute hour day-of-month month day-of-week),
or 6 with a leading seconds field, read on the wall clock of an IANA time zone. croniter
finds the wall times the expression names (on naive local times, where it has no DST to
get wrong); :class:`Schedule` turns each wall time into the instant(s) it fires at, with
one rule for the clock changes of daylight saving time, as Debian's cron does
(docs/cron.md, "Time zones and DST"):

* a schedule whose minute or hour field starts with ``*`` follows the clock: a wall time
  the clock skips does not fire, one it shows twice fires twice;
* any other schedule names fixed times of day: a skipped one fires once at the moment the
  clock jumps, a repeated one fires once, at its first occurrence.

(croniter's own DST handling, given aware times, would fire a fixed ``30 2 * * *`` twice on
the night the clock goes back; it is not used.)

:func:`decide` is the slot decision of one entry at one moment: given the schedule, the
last slot recorded for it (or when it was first seen), ``now`` and ``catch_up``, which
slots fire and how many are skipped as missed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from veracity.core.ffqn import InvalidFfqn, validate_ffqn
from veracity.core.params import ParamsShape
from veracity.errors import ConfigError

__all__ = [
    "CATCH_UP_LIMIT",
    "ENTRY_KEYS",
    "MISSED_AFTER",
    "MISSED_COUNT_LIMIT",
    "CronEntry",
    "Due",
    "InvalidSchedule",
    "Schedule",
    "decide",
    "parse_cron_entries",
]

MISSED_AFTER = timedelta(seconds=30)
"""A slot no server has started this long after its time is *missed*: it fires late only
if it is the latest slot due, or with ``catch_up``. Until then it is only late (a slow
tick, a restart), and fires."""
CATCH_UP_LIMIT = 100
"""With ``catch_up = true``, at most this many missed slots fire after a downtime: the
latest ones, oldest first; older ones are skipped."""
MISSED_COUNT_LIMIT = 1000
"""Missed slots are counted one by one up to this many per entry and decision; past it the
decision says only that more were skipped."""
ENTRY_KEYS = frozenset({"name", "ffqn", "schedule", "params", "timezone", "catch_up"})
"""The keys of a ``[[cron]]`` entry."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

_SECOND = timedelta(seconds=1)
_TICK = timedelta(microseconds=1)
_START = datetime(2000, 1, 1)
# (name, what it accepts) of each field, for messages
_FIELDS = (
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day of month", "1-31, L, or nW"),
    ("month", "1-12 or JAN-DEC"),
    ("day of week", "0-7 or SUN-SAT, with L or #n"),
)
_SECONDS_FIELD = ("second", "0-59")
# croniter's random (R) and hashed (H) values: each server would draw its own slots
_NOT_DETERMINISTIC = re.compile(r"(?i)^[RH](\(.*\))?(/.*)?$")


class InvalidSchedule(ValueError):
    """A schedule that cannot be used: the message says why."""


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("naive datetime: cron slots are instants (timezone-aware)")
    return value.astimezone(UTC)


class Schedule:
    """A cron expression on the wall clock of a time zone: the instants it fires at.

    Slots are whole seconds, at least a second apart. Not thread-safe (it keeps one
    croniter as a cursor); use it from one thread.
    """

    def __init__(self, expression: str, timezone: str = "UTC") -> None:
        if not isinstance(expression, str):
            raise InvalidSchedule(f"must be a string such as \"*/5 * * * *\", got "
                                  f"{type(expression).__name__}")
        fields = expression.split()
        if len(" ".join(fields)) > 1000:
            raise InvalidSchedule("is longer than 1000 characters")
        if len(fields) not in (5, 6):
            raise InvalidSchedule(
                f"has {len(fields)} field{'s' if len(fields) != 1 else ''}: expected 5 "
                "(minute hour day-of-month month day-of-week) or 6 with a leading seconds "
                "field")
        self.expression = " ".join(fields)
        self.has_seconds = len(fields) == 6
        names = ((_SECONDS_FIELD,) if self.has_seconds else ()) + _FIELDS
        for (name, _), value in zip(names, fields, strict=True):
            for part in value.split(","):
                if _NOT_DETERMINISTIC.match(part):
                    raise InvalidSchedule(
                        f"{name} {value!r}: random (R) and hashed (H) values are not "
                        "supported: every server must compute the same slots")
        try:
            croniter.expand(self.expression, second_at_beginning=self.has_seconds,
                            strict=True)
            self._it = croniter(self.expression, _START,
                                second_at_beginning=self.has_seconds)
        except (CroniterError, ValueError, TypeError, KeyError) as exc:
            raise InvalidSchedule(self._why(fields, names, exc)) from None
        self.timezone = timezone
        self.tz = zone(timezone)
        self._utc = timezone == "UTC"
        minute, hour = fields[-5], fields[-4]
        self.follows_clock = minute.startswith("*") or hour.startswith("*")
        """Its minute or hour field starts with ``*``: across a DST change it follows the
        clock (docs/cron.md)."""
        self._cursor: datetime | None = None
        if self._wall_next(_START) is None:
            raise InvalidSchedule("never matches a date")

    def _why(self, fields: list[str], names: Sequence[tuple[str, str]],
             exc: Exception) -> str:
        """Which field is at fault (each tried alone, the others ``*``), and croniter's
        own words."""
        for i, ((name, accepted), value) in enumerate(zip(names, fields, strict=True)):
            alone = ["*"] * len(fields)
            alone[i] = value
            try:
                croniter.expand(" ".join(alone), second_at_beginning=self.has_seconds)
            except (CroniterError, ValueError, TypeError, KeyError):
                return f"{name} {value!r} is not valid (expected {accepted}; croniter: {exc})"
        return f"not a valid cron expression (croniter: {exc})"

    def __repr__(self) -> str:
        return f"Schedule({self.expression!r}, {self.timezone!r})"

    # -- wall times -----------------------------------------------------------------------

    def _wall_next(self, wall: datetime) -> datetime | None:
        """The first wall time strictly after ``wall`` (naive) that the expression names."""
        if wall != self._cursor:
            self._it.set_current(wall, force=True)
        try:
            found = self._it.get_next(datetime)
        except CroniterBadDateError:  # nothing within croniter's 50 years
            self._cursor = None
            return None
        self._cursor = found
        return found

    def _offset_at(self, instant: int) -> timedelta | None:
        return datetime.fromtimestamp(instant, UTC).astimezone(self.tz).utcoffset()

    def _transition(self, before: datetime, after: datetime) -> datetime:
        """The instant in (before, after] at which the zone's offset changes (to the one
        it has at ``after``); both whole seconds."""
        lo, hi = int(before.timestamp()), int(after.timestamp())
        target = self._offset_at(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset_at(mid) == target:
                hi = mid
            else:
                lo = mid
        return datetime.fromtimestamp(hi, UTC)

    def _kind(self, wall: datetime) -> tuple[str, datetime, datetime]:
        """``("normal"|"repeated"|"skipped", first, second)``: the wall time read with the
        offset before a change (fold 0) and after it (fold 1), as UTC instants."""
        a = wall.replace(tzinfo=self.tz, fold=0)
        b = wall.replace(tzinfo=self.tz, fold=1)
        oa, ob = a.utcoffset(), b.utcoffset()
        ua, ub = a.astimezone(UTC), b.astimezone(UTC)
        if oa == ob:
            return "normal", ua, ua
        assert oa is not None and ob is not None
        # the clock went back (repeated: fold 0 first) or forward (skipped)
        return ("repeated", ua, ub) if oa > ob else ("skipped", ua, ub)

    def _instants(self, wall: datetime) -> tuple[datetime, ...]:
        """The instants a wall time the expression names fires at, in order."""
        if self._utc:
            return (wall.replace(tzinfo=UTC),)
        kind, a, b = self._kind(wall)
        if kind == "normal":
            return (a,)
        if kind == "repeated":
            return (a, b) if self.follows_clock else (a,)
        # skipped: fold 1 reads it with the later offset (an instant before the jump),
        # fold 0 with the earlier one (after it)
        return () if self.follows_clock else (self._transition(b, a),)

    def _repeat_range(self, local: datetime) -> tuple[datetime, datetime] | None:
        """For a local time the clock shows twice: the repeated wall times [start, end)."""
        kind, a, b = self._kind(local.replace(tzinfo=None, fold=0))
        if kind != "repeated":
            return None
        change = self._transition(a, b)
        # from the change on, the clock reads (b - a) earlier than it did just before
        start = change.astimezone(self.tz).replace(tzinfo=None, fold=0)
        return start, start + (b - a)

    def _skip_end(self, wall: datetime) -> datetime:
        """For a skipped wall time: the wall time the clock jumps to."""
        _, a, b = self._kind(wall)
        return self._transition(b, a).astimezone(self.tz).replace(tzinfo=None)

    # -- instants -------------------------------------------------------------------------

    def next_after(self, t: datetime) -> datetime | None:
        """The first slot strictly after the instant ``t`` (UTC), or None if there is none
        within croniter's 50 years."""
        t = _utc(t)
        if self._utc:
            found = self._wall_next(t.replace(tzinfo=None))
            return found.replace(tzinfo=UTC) if found is not None else None
        local = t.astimezone(self.tz)
        wall = local.replace(tzinfo=None)
        repeat = self._repeat_range(local)
        candidates: list[datetime] = []
        # the first occurrences: wall times after t's (past the repeated ones when t is in
        # the second pass of a repeat: their first occurrences are behind it)
        start = wall
        if repeat is not None and local.fold == 1:
            start = max(wall, repeat[1] - _TICK)
        m: datetime | None = start
        while m is not None:
            m = self._wall_next(m)
            if m is None:
                break
            instants = self._instants(m)
            if not instants:  # skipped, and the schedule follows the clock
                m = self._skip_end(m) - _TICK
                continue
            if instants[0] > t:
                candidates.append(instants[0])
                break
        # the second occurrences of a repeat t is in
        if repeat is not None and self.follows_clock:
            again = self._wall_next(repeat[0] - _TICK if local.fold == 0 else wall)
            if again is not None and again < repeat[1]:
                second = self._instants(again)[-1]
                if second > t:
                    candidates.append(second)
        return min(candidates) if candidates else None

    def latest_at_or_before(self, t: datetime, after: datetime | None = None
                            ) -> datetime | None:
        """The last slot in (after, t], or None: found with :meth:`next_after` alone (an
        exponential search back from ``t``, then a bisection), a few dozen calls at most."""
        t = _utc(t)
        after = _utc(after) if after is not None else None
        if after is not None:
            first = self.next_after(after)
            if first is None or first > t:
                return None
        step = _SECOND
        while True:
            lo = t - step
            if after is not None and lo <= after:
                lo = after
                break
            found = self.next_after(lo)
            if found is not None and found <= t:
                break
            if step > timedelta(days=366 * 60):  # beyond croniter's horizon
                return None
            step *= 2
        hi = t  # invariant: a slot in (lo, t], none in (hi, t]
        while hi - lo > _SECOND:
            mid = lo + (hi - lo) / 2
            found = self.next_after(mid)
            if found is not None and found <= t:
                lo = mid
            else:
                hi = mid
        return self.next_after(lo)

    def slots(self, after: datetime, until: datetime, *, limit: int | None = None
              ) -> list[datetime]:
        """The slots in (after, until], in order; the first ``limit`` of them."""
        out: list[datetime] = []
        until = _utc(until)
        found = self.next_after(after)
        while found is not None and found <= until and (limit is None or len(out) < limit):
            out.append(found)
            found = self.next_after(found)
        return out

    def local(self, instant: datetime) -> datetime:
        """The instant on this schedule's wall clock."""
        return _utc(instant).astimezone(self.tz)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; :class:`InvalidSchedule` if there is none."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidSchedule("an IANA time zone name such as \"Europe/Berlin\" or \"UTC\"")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(
            "unknown time zone (expected an IANA name such as \"Europe/Berlin\" or "
            "\"UTC\")") from None


# ---------------------------------------------------------------------------------------
# The decision


@dataclass(frozen=True, slots=True)
class Due:
    """What one entry does at one moment."""

    fire: tuple[datetime, ...] = ()
    """The slots to start, oldest first."""
    skipped: int = 0
    """Missed slots passed over (not started): exact unless ``skipped_more``."""
    skipped_more: bool = False
    """More than ``skipped`` (:data:`MISSED_COUNT_LIMIT`) were passed over: not counted."""
    missed: tuple[datetime, ...] = field(default=())
    """Of ``fire``, the slots that were missed (fired late, as the latest or caught up)."""
    next: datetime | None = None
    """The first slot after ``now`` (and after the slots fired); None if there is none."""


class _Unknown(Enum):
    UNKNOWN = "unknown"


def decide(schedule: Schedule, *, after: datetime, now: datetime, catch_up: bool,
           first: datetime | _Unknown | None = _Unknown.UNKNOWN,
           missed_after: timedelta = MISSED_AFTER, catch_up_limit: int = CATCH_UP_LIMIT,
           count_limit: int = MISSED_COUNT_LIMIT) -> Due:
    """Which slots in (after, now] fire now (docs/cron.md, "Missed slots").

    ``after`` is the entry's last recorded slot, or the moment the entry (with this
    schedule and time zone) was first seen: nothing at or before it ever fires. Slots
    within ``missed_after`` of ``now`` are on time (late at most) and all fire. Older ones
    were missed: with ``catch_up`` the latest ``catch_up_limit`` of them fire, oldest first;
    without it only the latest slot due fires, and only if no slot is on time. The rest
    are skipped. ``first``, when the caller knows it, is ``schedule.next_after(after)``.
    """
    after, now = _utc(after), _utc(now)
    if isinstance(first, _Unknown):
        first = schedule.next_after(after)
    if first is None or first > now:
        return Due(next=first)
    deadline = now - missed_after
    if first > deadline:  # all on time: the usual tick
        on_time = [first]
        following = schedule.next_after(first)
        while following is not None and following <= now:
            on_time.append(following)
            following = schedule.next_after(following)
        return Due(tuple(on_time), next=following)
    on_time = schedule.slots(deadline, now)
    following = schedule.next_after(now)
    walk = schedule.slots(after, deadline, limit=count_limit + catch_up_limit + 1)
    more = len(walk) > count_limit + catch_up_limit
    wanted = catch_up_limit if catch_up else (0 if on_time else 1)
    if not more:
        fired = walk[max(0, len(walk) - wanted):] if wanted else []
        return Due(tuple(fired + on_time), len(walk) - len(fired), False, tuple(fired),
                   following)
    # too many to walk: the latest ones, found backwards
    fired = []
    latest = schedule.latest_at_or_before(deadline, after)
    while latest is not None and len(fired) < wanted:
        fired.insert(0, latest)
        latest = schedule.latest_at_or_before(latest - _TICK, after)
    return Due(tuple(fired + on_time), count_limit, True, tuple(fired), following)


# ---------------------------------------------------------------------------------------
# [[cron]] entries


@dataclass(frozen=True, slots=True)
class CronEntry:
    """One validated ``[[cron]]`` entry."""

    name: str
    ffqn: str
    schedule: Schedule
    params: tuple[Any, ...] = ()
    catch_up: bool = False

    @property
    def expression(self) -> str:
        return self.schedule.expression

    @property
    def timezone(self) -> str:
        return self.schedule.timezone


def parse_cron_entries(raw: Sequence[Any], *, workflows: Collection[str],
                       max_payload_bytes: int | None = None,
                       shapes: Mapping[str, ParamsShape] | None = None) -> list[CronEntry]:
    """Validate the ``[[cron]]`` entries of the configuration. Every problem is a
    :class:`ConfigError` naming the entry: ``cron[worker_reconcile]: schedule "61 * * * *":
    minute '61' is not valid (...)``. ``shapes``: the parameters each workflow takes (those
    of the app's workflows); an entry whose params do not fit its workflow's is refused
    as a submission of them would be."""
    entries: list[CronEntry] = []
    seen: dict[str, int] = {}
    for number, item in enumerate(raw, 1):
        where = f"cron #{number}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a table ([[cron]] with name, ffqn, "
                              "schedule)")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: name is required (letters, digits, '_', '-', '.')")
        if not NAME.fullmatch(name):
            raise ConfigError(f"{where}: name {json.dumps(name)}: 1 to 100 letters, digits, "
                              "'_', '-' or '.', starting with a letter or digit")
        where = f"cron[{name}]"
        unknown = sorted(set(item) - ENTRY_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(unknown)} (an entry has "
                              f"{', '.join(sorted(ENTRY_KEYS))})")
        if name in seen:
            raise ConfigError(f"{where}: the name is taken by cron #{seen[name]}: each "
                              "[[cron]] entry needs a name of its own")
        seen[name] = number
        expression = item.get("schedule")
        if expression is None:
            raise ConfigError(f"{where}: schedule is required (e.g. \"*/5 * * * *\")")
        timezone = item.get("timezone", "UTC")
        shown = json.dumps(expression) if isinstance(expression, str) else repr(expression)
        try:
            zone(timezone)
        except InvalidSchedule as exc:
            raise ConfigError(f"{where}: timezone {_shown(timezone)}: {exc}") from None
        try:
            schedule = Schedule(expression, timezone)
        except InvalidSchedule as exc:
            raise ConfigError(f"{where}: schedule {shown}: {exc}") from None
        ffqn = item.get("ffqn")
        if not isinstance(ffqn, str):
            raise ConfigError(f"{where}: ffqn is required (the workflow to start, "
                              "namespace:package/interface.function)")
        try:
            validate_ffqn(ffqn)
        except InvalidFfqn as exc:
            raise ConfigError(f"{where}: ffqn {json.dumps(ffqn)}: {exc}") from None
        if ffqn not in workflows:
            known = ", ".join(sorted(workflows)[:10]) or "none"
            raise ConfigError(f"{where}: ffqn {json.dumps(ffqn)}: unknown workflow: neither "
                              f"registered by the app nor an [[external_workflow]] (known: "
                              f"{known})")
        params = item.get("params", [])
        if not isinstance(params, list):
            raise ConfigError(f"{where}: params must be a list (the workflow's positional "
                              f"parameters, JSON values), got {_kind(params)}")
        try:
            encoded = json.dumps(params, allow_nan=False, separators=(",", ":"),
                                 ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: params must be JSON values ({exc}; TOML dates and "
                              "times are not JSON: quote them)") from None
        if max_payload_bytes is not None and len(encoded.encode()) > max_payload_bytes:
            raise ConfigError(f"{where}: params are {len(encoded.encode())} bytes; the limit "
                              f"is max_payload_bytes = {max_payload_bytes}")
        shape = (shapes or {}).get(ffqn)
        problem = shape.problem(params) if shape is not None else None
        if problem is not None:
            raise ConfigError(f"{where}: params do not fit workflow {ffqn}: {problem}")
        catch_up = item.get("catch_up", False)
        if not isinstance(catch_up, bool):
            raise ConfigError(f"{where}: catch_up must be true or false, got {_shown(catch_up)}")
        entries.append(CronEntry(name, ffqn, schedule, tuple(json.loads(encoded)), catch_up))
    return entries


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _kind(value: Any) -> str:
    names = {str: "a string", int: "a number", float: "a number", bool: "a boolean",
             dict: "a table"}
    return names.get(type(value), type(value).__name__)
