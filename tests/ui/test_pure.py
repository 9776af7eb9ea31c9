"""The dashboard's pure parts, without a database: the list's filters, the post check, the
words for values, and which actions an execution offers."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

import pytest

from veracity.core.states import Status
from veracity.models import Execution
from veracity.ui import present
from veracity.ui.filters import DEFAULT_PAGE_SIZE, parse_list_query, parse_time
from veracity.ui.routes import actions_for
from veracity.ui.security import post_refusal

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
OWN = "http://127.0.0.1:8000"


def q(text: str) -> dict[str, list[str]]:
    return parse_qs(text, keep_blank_values=True)


def test_an_empty_query_is_every_execution() -> None:
    parsed = parse_list_query({})
    assert parsed.errors == [] and parsed.filter is not None
    assert parsed.filter.statuses == () and parsed.filter.flagged is None
    assert parsed.limit == DEFAULT_PAGE_SIZE and not parsed.any and parsed.query() == ""


def test_every_filter_is_parsed_and_written_back() -> None:
    ident = uuid.uuid4()
    text = (f"status=failed&status=paused,blocked&status=failed&ffqn_prefix=shop:o"
            f"&deployment_id=d1&created_after=2030-01-01T00:00&created_before=2030-01-02"
            f"T00:00:00%2B02:00&id={ident}&flagged=1&limit=100&cursor=abc")
    parsed = parse_list_query(q(text))
    assert parsed.errors == []
    f = parsed.filter
    assert f is not None
    assert f.statuses == (Status.FAILED, Status.PAUSED, Status.BLOCKED)
    assert f.ffqn_prefix == "shop:o" and f.deployment_id == "d1" and f.flagged is True
    assert f.created_after == datetime(2030, 1, 1, tzinfo=UTC)  # no zone: UTC
    assert f.created_before == datetime(2030, 1, 1, 22, tzinfo=UTC)
    assert parsed.execution_id == ident and parsed.limit == 100 and parsed.cursor == "abc"
    again = parse_list_query(q(parsed.query(cursor=parsed.cursor)))
    assert again.filter == f and again.cursor == "abc" and again.limit == 100
    assert ("cursor", "abc") not in parsed.params()
    assert parsed.any


@pytest.mark.parametrize(("text", "error"), [
    ("status=bogus", "status: 'bogus' is not a status"),
    ("ffqn_prefix=a%20b", "ffqn_prefix:"),
    ("ffqn_prefix=" + "a" * 513, "ffqn_prefix: at most 512 characters"),
    ("deployment_id=a%00b", "deployment_id: at most 512 characters, no NUL"),
    ("created_after=soon", "created_after: 'soon' is not a time"),
    ("created_before=1969-12-31T00:00Z", "created_before: '1969-12-31T00:00Z' is not between"),
    ("created_after=2030-01-02&created_before=2030-01-01", "must be earlier than"),
    ("created_after=2030-01-01&created_before=2030-01-01", "must be earlier than"),
    ("id=xyz", "id: 'xyz' is not an execution id"),
    ("limit=0", "limit: '0' is not one of 25, 50, 100, 200"),
    ("limit=ten", "limit: 'ten' is not one of"),
    ("flagged=yes", "flagged: 1 or 0"),
])
def test_each_bad_value_is_named_and_no_filter_is_made(text: str, error: str) -> None:
    parsed = parse_list_query(q(text))
    assert parsed.filter is None
    assert len(parsed.errors) == 1 and error in parsed.errors[0], parsed.errors


def test_several_bad_values_are_all_named() -> None:
    parsed = parse_list_query(q("status=x&status=y&id=z&limit=3"))
    assert len(parsed.errors) == 4 and parsed.filter is None


def test_flagged_zero_or_empty_is_no_filter() -> None:
    for text in ("flagged=0", "flagged="):
        parsed = parse_list_query(q(text))
        assert parsed.errors == [] and parsed.filter is not None
        assert parsed.filter.flagged is None


def test_parse_time_accepts_a_space_and_a_zone() -> None:
    assert parse_time("t", "2030-01-01 10:00Z") == (datetime(2030, 1, 1, 10, tzinfo=UTC), None)
    assert parse_time("t", "9999-01-01T00:00Z")[1] is None
    assert parse_time("t", "9999-01-02T00:00Z")[1] is not None


def test_a_same_origin_post_with_its_token_passes() -> None:
    assert post_refusal(own_origin=OWN, headers={"origin": OWN}, cookie="c", field="c") is None
    assert post_refusal(own_origin=OWN, headers={"origin": OWN.upper(),
                                                  "sec-fetch-site": "same-origin"},
                        cookie="c", field="c") is None
    # no Origin: the Referer says where it came from; neither: the token alone decides
    assert post_refusal(own_origin=OWN, headers={"referer": f"{OWN}/ui/x"}, cookie="c",
                        field="c") is None
    assert post_refusal(own_origin=OWN, headers={}, cookie="c", field="c") is None
    assert post_refusal(own_origin=OWN, headers={"sec-fetch-site": "none"}, cookie="c",
                        field="c") is None


@pytest.mark.parametrize(("headers", "cookie", "field", "why"), [
    ({"origin": "http://evil.example"}, "c", "c", "a post from http://evil.example"),
    ({"origin": "http://127.0.0.1:8001"}, "c", "c", "is refused"),
    ({"origin": "https://127.0.0.1:8000"}, "c", "c", "is refused"),
    ({"origin": "null"}, "c", "c", "opaque origin"),
    ({"sec-fetch-site": "cross-site"}, "c", "c", "a cross-site post"),
    ({"sec-fetch-site": "same-site"}, "c", "c", "a same-site post"),
    ({"referer": "http://evil.example/page"}, "c", "c", "referred by another site"),
    ({"origin": OWN}, None, "c", "cookies are needed"),
    ({"origin": OWN}, "c", None, "security token is missing"),
    ({"origin": OWN}, "c", "", "security token is missing"),
    ({"origin": OWN}, "c", "d", "does not match"),
])
def test_each_forged_post_is_refused(headers: dict[str, str], cookie: str | None,
                                     field: str | None, why: str) -> None:
    refusal = post_refusal(own_origin=OWN, headers=headers, cookie=cookie, field=field)
    assert refusal is not None and why in refusal


def test_words_for_times_and_values() -> None:
    assert present.when(None) == "—"
    assert present.when(datetime(2030, 1, 1, 13, 0, 5, tzinfo=UTC)) == "2030-01-01 13:00:05Z"
    assert present.span(42) == "42 s" and present.span(89) == "89 s"
    assert present.span(90) == "2 min" and present.span(3600) == "60 min"
    assert present.span(2 * 3600) == "2 h" and present.span(2 * 3600 + 300) == "2 h 5 min"
    assert present.span(3 * 86400) == "3 d"
    assert present.ago(NOW - timedelta(seconds=5), NOW) == "5 s ago"
    assert present.ago(NOW + timedelta(minutes=3), NOW) == "in 3 min"
    assert present.ago(None, NOW) == ""
    assert present.pretty({"a": [1]}) == '{\n  "a": [\n    1\n  ]\n}'
    assert present.pretty("x" * 50, limit=10).endswith("… (42 more characters)")
    assert present.inline({"a": 1}) == '{"a": 1}'
    assert present.inline("y" * 200, limit=20) == '"' + "y" * 18 + "…"
    ident = uuid.UUID("01a232f6-3d91-7382-9aa0-ce76a30f9557")
    assert present.short(ident) == "a30f9557" and present.short(None) == ""
    assert present.status_word("paused") == "held by an operator"
    assert present.is_unfinished("blocked") and not present.is_unfinished("completed")
    assert set(present.STATUS_WORDS) == {s.value for s in Status}


def _execution(ffqn: str = "a:b/c.run", status: Status = Status.PENDING, **kw: object
               ) -> Execution:
    return replace(Execution(
        id=uuid.uuid4(), ffqn=ffqn, params=[], status=status, result=None, error=None,
        attempt=1, deployment_id="d", parent_id=None, idempotency_key=None, scheduled_at=NOW,
        created_at=NOW, updated_at=NOW, lease_owner=None, lease_epoch=0,
        lease_expires_at=None), **kw)  # type: ignore[arg-type]


def test_which_actions_each_state_offers() -> None:
    pending = actions_for(_execution())
    assert (pending.cancel, pending.pause, pending.unpause, pending.send, pending.resolve) \
        == (False, True, False, True, False)
    assert pending.cancel_why_not is not None and "-cancellable" in pending.cancel_why_not
    cancellable = actions_for(_execution("a:b/c.run-cancellable"))
    assert cancellable.cancel and cancellable.cancel_why_not is None
    requested = actions_for(_execution("a:b/c.run-cancellable", cancel_requested_at=NOW))
    assert not requested.cancel and requested.cancel_why_not == \
        "cancellation was already requested"
    paused = actions_for(_execution(status=Status.PAUSED))
    assert (paused.pause, paused.unpause) == (False, True)
    parking = actions_for(_execution(status=Status.RUNNING, pause_requested_at=NOW))
    assert (parking.pause, parking.unpause) == (False, True)
    delegated = actions_for(_execution(status=Status.RUNNING, engine="n8n"))
    assert (delegated.pause, delegated.resolve, delegated.send) == (False, True, True)
    assert delegated.cancel_why_not is not None
    assert delegated.cancel_why_not.endswith("resolve it instead (a run in an engine cannot "
                                             "be paused)")
    for status in (Status.COMPLETED, Status.FAILED, Status.FAILED_TRANSIENT, Status.CANCELLED):
        ended = actions_for(_execution("a:b/c.run-cancellable", status))
        assert not (ended.cancel or ended.pause or ended.unpause or ended.send
                    or ended.resolve)
        assert ended.cancel_why_not == f"it has ended ({status})"
        assert ended.retry == (status in (Status.FAILED, Status.FAILED_TRANSIENT))
    for status in (Status.PENDING, Status.RUNNING, Status.BLOCKED, Status.PAUSED):
        assert not actions_for(_execution(status=status)).retry


def test_children_group_by_join_set_in_order_of_appearance() -> None:
    a = _execution(join_set="js1")
    b = _execution(join_set=None)
    c = _execution(join_set="js1")
    assert present.by_join_set([a, b, c]) == [("js1", [a, c]), ("", [b])]
    assert present.by_join_set([]) == []
