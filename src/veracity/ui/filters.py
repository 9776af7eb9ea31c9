"""The executions list's filters as the URL holds them: parsed, checked and written back.

Pure code: a query string in, an :class:`ExecutionFilter` (or the list of what is wrong
with it) out. A bad value is never dropped silently: the page names it and lists nothing
(docs/dashboard.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlencode

from veracity.core.ffqn import InvalidFfqn, validate_ffqn_prefix
from veracity.core.states import Status
from veracity.models import ExecutionFilter

MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9999, 1, 1, tzinfo=UTC)
MAX_TEXT = 512
PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class ListQuery:
    """What the list shows: the filter as typed (to write back into the form and links),
    and, when every value is good, the filter itself."""

    statuses: tuple[str, ...] = ()
    ffqn_prefix: str = ""
    deployment_id: str = ""
    created_after: str = ""
    created_before: str = ""
    id: str = ""
    flagged: bool = False
    limit: int = DEFAULT_PAGE_SIZE
    cursor: str = ""
    errors: list[str] = field(default_factory=list)
    """One sentence per bad value, naming the field and the value."""
    filter: ExecutionFilter | None = None
    """None when :attr:`errors` is not empty."""
    execution_id: uuid.UUID | None = None
    """The id searched for, when one was given and is a UUID."""

    def params(self, *, cursor: str | None = None, limit: bool = True
               ) -> list[tuple[str, str]]:
        """The filter as query parameters (the cursor only when given)."""
        out: list[tuple[str, str]] = [("status", s) for s in self.statuses]
        for name, value in (("ffqn_prefix", self.ffqn_prefix),
                            ("deployment_id", self.deployment_id),
                            ("created_after", self.created_after),
                            ("created_before", self.created_before), ("id", self.id)):
            if value:
                out.append((name, value))
        if self.flagged:
            out.append(("flagged", "1"))
        if limit and self.limit != DEFAULT_PAGE_SIZE:
            out.append(("limit", str(self.limit)))
        if cursor:
            out.append(("cursor", cursor))
        return out

    def query(self, *, cursor: str | None = None) -> str:
        return urlencode(self.params(cursor=cursor))

    @property
    def any(self) -> bool:
        """Whether anything narrows the list."""
        return bool(self.params(limit=False))


def parse_time(name: str, text: str) -> tuple[datetime | None, str | None]:
    """An ISO 8601 time (``2030-01-01T00:00:00Z``, or without a zone: UTC, as a browser's
    datetime-local field sends it); the error sentence otherwise."""
    try:
        value = datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    except ValueError:
        return None, (f"{name}: {text[:80]!r} is not a time (use 2030-01-01T00:00:00Z, or "
                      "2030-01-01T00:00 for UTC)")
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if not MIN_TIME <= value <= MAX_TIME:
        return None, f"{name}: {text[:80]!r} is not between 1970 and 9999"
    return value, None


def _text(name: str, values: Sequence[str], errors: list[str]) -> str:
    value = values[-1].strip() if values else ""
    if len(value) > MAX_TEXT or "\x00" in value:
        errors.append(f"{name}: at most {MAX_TEXT} characters, no NUL")
        return ""
    return value


def parse_list_query(query: Mapping[str, Sequence[str]]) -> ListQuery:
    """The list's query string (each name to its values, in order) as a :class:`ListQuery`."""
    errors: list[str] = []
    statuses: list[str] = []
    for value in query.get("status", []):
        for part in value.split(","):
            part = part.strip()
            if not part or part in statuses:
                continue
            if part not in Status.__members__.values():
                names = ", ".join(s.value for s in Status)
                errors.append(f"status: {part[:80]!r} is not a status (one of {names})")
            statuses.append(part[:80])
    ffqn_prefix = _text("ffqn_prefix", query.get("ffqn_prefix", []), errors)
    if ffqn_prefix:
        try:
            validate_ffqn_prefix(ffqn_prefix)
        except InvalidFfqn as exc:
            errors.append(f"ffqn_prefix: {exc}")
    deployment_id = _text("deployment_id", query.get("deployment_id", []), errors)
    times: dict[str, datetime | None] = {}
    texts: dict[str, str] = {}
    for name in ("created_after", "created_before"):
        texts[name] = _text(name, query.get(name, []), errors)
        times[name] = None
        if texts[name]:
            times[name], error = parse_time(name, texts[name])
            if error:
                errors.append(error)
    after, before = times["created_after"], times["created_before"]
    if after is not None and before is not None and after >= before:
        errors.append("created_after must be earlier than created_before")
    ident = _text("id", query.get("id", []), errors)
    execution_id = None
    if ident:
        try:
            execution_id = uuid.UUID(ident)
        except ValueError:
            errors.append(f"id: {ident[:80]!r} is not an execution id (a UUID such as "
                          "0192f4a0-7b1c-7d2e-8f3a-4b5c6d7e8f90)")
    flagged_values = query.get("flagged", [])
    flagged = bool(flagged_values) and flagged_values[-1] not in ("", "0")
    if flagged_values and flagged_values[-1] not in ("", "0", "1"):
        errors.append("flagged: 1 or 0")
    limit = DEFAULT_PAGE_SIZE
    if query.get("limit"):
        text = query["limit"][-1]
        if not (text.isascii() and text.isdigit()) or int(text) not in PAGE_SIZES:
            errors.append(f"limit: {text[:20]!r} is not one of "
                          f"{', '.join(map(str, PAGE_SIZES))}")
        else:
            limit = int(text)
    cursor = _text("cursor", query.get("cursor", []), errors)
    parsed = ListQuery(
        statuses=tuple(statuses), ffqn_prefix=ffqn_prefix, deployment_id=deployment_id,
        created_after=texts["created_after"], created_before=texts["created_before"],
        id=ident, flagged=flagged, limit=limit, cursor=cursor, errors=errors,
        execution_id=execution_id)
    if errors:
        return parsed
    return ListQuery(
        **{f: getattr(parsed, f) for f in (
            "statuses", "ffqn_prefix", "deployment_id", "created_after", "created_before",
            "id", "flagged", "limit", "cursor", "errors", "execution_id")},
        filter=ExecutionFilter(
            statuses=tuple(Status(s) for s in statuses), ffqn_prefix=ffqn_prefix or None,
            deployment_id=deployment_id or None, created_after=after, created_before=before,
            flagged=True if flagged else None))
