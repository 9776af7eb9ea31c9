"""The dashboard's actions, on both backends: each a confirmed form post with a reason
recorded in history, refused with the API's reason where it must be; forged and
cross-site posts; escaping; tokens kept in an HttpOnly cookie and each action's scope;
bulk actions over a filter."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests._helpers import history
from tests.ui.conftest import (
    MONITOR,
    ORDERS,
    ORIGIN,
    client_for,
    completed,
    csrf,
    failed,
    flagged,
    post,
    submit,
    text_of,
)
from veracity.api import create_api
from veracity.api.auth import ROUTE_ACCESS
from veracity.control import ExecutionService, TokenService
from veracity.core.states import Status
from veracity.core.tokens import Scope as TokenScope
from veracity.store import Store

REASON = {"reason": "customer asked", "confirm": "yes"}


async def test_pause_and_unpause_record_the_reason_and_who(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await submit(service)
    response = await post(client, f"/ui/executions/{e.id}/pause", REASON)
    assert response.status_code == 303
    assert response.headers["location"] == f"/ui/executions/{e.id}?notice=pause"
    page = await client.get(response.headers["location"])
    assert "Paused" in text_of(page.text)
    assert (await service.get(e.id)).status == Status.PAUSED
    response = await post(client, f"/ui/executions/{e.id}/unpause",
                          {"reason": "done waiting", "confirm": "yes"})
    assert response.status_code == 303
    events = await history(store, e.id)
    assert events[1].kind == "paused"
    assert events[1].data == {"by": "dashboard", "from": "pending", "reason": "customer asked"}
    assert events[2].data == {"by": "dashboard", "reason": "unpaused: done waiting"}


async def test_cancel_only_where_allowed_and_the_409_explained(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    plain = await submit(service, ORDERS)
    page = await client.get(f"/ui/executions/{plain.id}")
    assert f'action="/ui/executions/{plain.id}/cancel"' not in page.text
    assert "only workflows whose name ends in -cancellable" in text_of(page.text)
    refused = await post(client, f"/ui/executions/{plain.id}/cancel", REASON)
    assert refused.status_code == 409
    text = text_of(refused.text)
    assert "cancel refused (not_cancellable)" in text and "Pause it instead" in text
    assert (await service.get(plain.id)).status == Status.PENDING
    assert len(await history(store, plain.id)) == 1
    cancellable = await submit(service, MONITOR)
    page = await client.get(f"/ui/executions/{cancellable.id}")
    assert f'action="/ui/executions/{cancellable.id}/cancel"' in page.text
    done = await post(client, f"/ui/executions/{cancellable.id}/cancel", REASON)
    assert done.status_code == 303
    assert (await service.get(cancellable.id)).status == Status.CANCELLED
    requested = [ev for ev in await history(store, cancellable.id)
                 if ev.kind == "cancel_requested"]
    assert requested[0].data["reason"] == "customer asked"


async def test_pause_of_an_ended_execution_is_refused_with_its_state(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await completed(service, store, 1)
    response = await post(client, f"/ui/executions/{e.id}/pause", REASON)
    assert response.status_code == 409
    assert "pause refused (wrong_state)" in text_of(response.text)
    assert "execution is completed" in text_of(response.text)


async def test_send_validates_the_topic_and_the_json_payload(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await submit(service)
    path = f"/ui/executions/{e.id}/messages"
    bad_json = await post(client, path, {"topic": "approval", "payload": "{nope", **REASON})
    assert bad_json.status_code == 422
    assert "the payload is not JSON" in text_of(bad_json.text)
    assert "{nope" in bad_json.text  # the form keeps what was typed
    no_topic = await post(client, path, {"topic": "", "payload": "1", **REASON})
    assert no_topic.status_code == 422 and "topic must be 1 to 256" in text_of(no_topic.text)
    assert len(await history(store, e.id)) == 1
    sent = await post(client, path, {"topic": "approval", "payload": '{"ok": true}', **REASON})
    assert sent.status_code == 303
    arrived = (await history(store, e.id))[-1]
    assert arrived.kind == "message_arrived"
    assert arrived.data["topic"] == "approval"
    assert arrived.data["reason"] == "customer asked"


async def test_resolve_of_a_run_that_is_not_delegated_is_refused_with_why(
    client: httpx.AsyncClient, service: ExecutionService
) -> None:
    e = await submit(service)
    response = await post(client, f"/ui/executions/{e.id}/resolve",
                          {"action": "cancel", **REASON})
    assert response.status_code == 409
    assert "resolve refused" in text_of(response.text)


async def test_resolve_attaches_an_external_id_to_a_flagged_run(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await flagged(service, store)
    bad = await post(client, f"/ui/executions/{e.id}/resolve",
                     {"action": "explode", **REASON})
    assert bad.status_code == 422 and "action must be attach, fail or cancel" in bad.text
    response = await post(client, f"/ui/executions/{e.id}/resolve",
                          {"action": "attach", "external_execution_id": "run-9", **REASON})
    assert response.status_code == 303, response.text
    assert response.headers["location"].endswith("notice=resolve-attached")
    assert (await service.get(e.id)).external_execution_id == "run-9"


async def test_retry_of_a_failed_execution_opens_the_new_one_with_the_reason(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    old = await failed(service, store)
    page = await client.get(f"/ui/executions/{old.id}")
    assert f'action="/ui/executions/{old.id}/retry"' in page.text
    assert "smtp down" in text_of(page.text)
    response = await post(client, f"/ui/executions/{old.id}/retry", REASON)
    assert response.status_code == 303
    new_id = response.headers["location"].split("/")[-1].split("?")[0]
    new = await service.get(new_id)
    assert new.retry_of == old.id and new.status == Status.PENDING
    first = (await history(store, new.id))[0]
    assert first.data["reason"] == "customer asked" and first.data["by"] == "dashboard"
    shown = await client.get(response.headers["location"])
    assert "This is the retry" in text_of(shown.text)
    assert f'href="/ui/executions/{old.id}"' in shown.text  # retry of
    # a pending one cannot be retried: refused with the API's reason
    refused = await post(client, f"/ui/executions/{new.id}/retry", REASON)
    assert refused.status_code == 409
    assert "retry refused (wrong_state)" in text_of(refused.text)
    assert (await service.get(old.id)).status == Status.FAILED


@pytest.mark.parametrize(("form", "why"), [
    ({"confirm": "yes"}, "a written reason is needed"),
    ({"reason": "   ", "confirm": "yes"}, "a written reason is needed"),
    ({"reason": "x" * 1001, "confirm": "yes"}, "at most 1000 characters"),
    ({"reason": "why"}, "tick the confirmation box"),
    ({"reason": "why", "confirm": "no"}, "tick the confirmation box"),
])
async def test_a_missing_reason_or_confirmation_changes_nothing(
    client: httpx.AsyncClient, service: ExecutionService, store: Store,
    form: dict[str, str], why: str
) -> None:
    e = await submit(service)
    response = await post(client, f"/ui/executions/{e.id}/pause", form)
    assert response.status_code == 422
    assert why in text_of(response.text)
    assert (await service.get(e.id)).status == Status.PENDING


@pytest.mark.parametrize(("headers", "field", "why"), [
    ({"Origin": "https://evil.example"}, True, "a post from https://evil.example is refused"),
    ({"Origin": "null"}, True, "opaque origin"),
    ({"Sec-Fetch-Site": "cross-site"}, True, "a cross-site post is refused"),
    ({"Origin": "http://127.0.0.1:9999"}, True, "is refused"),
    ({}, False, "security token is missing"),
    ({}, "forged", "does not match"),
])
async def test_forged_and_cross_site_posts_are_refused(
    client: httpx.AsyncClient, service: ExecutionService, store: Store,
    headers: dict[str, str], field: bool | str, why: str
) -> None:
    e = await submit(service)
    data: dict[str, Any] = dict(REASON)
    if field == "forged":
        await csrf(client)  # the browser has its cookie; the form's field is another
        data["csrf"] = "not-the-cookie"
    response = await post(client, f"/ui/executions/{e.id}/pause", data, headers=headers,
                          token=field is True)
    assert response.status_code == 403
    assert why in text_of(response.text)
    assert (await service.get(e.id)).status == Status.PENDING
    assert len(await history(store, e.id)) == 1


async def test_a_post_without_the_csrf_cookie_is_refused(
    service: ExecutionService, store: Store
) -> None:
    e = await submit(service)
    async with client_for(create_api(service)) as fresh:  # never loaded a page
        response = await fresh.post(f"/ui/executions/{e.id}/pause",
                                    data={"csrf": "guess", **REASON},
                                    headers={"Origin": ORIGIN})
    assert response.status_code == 403 and "cookies are needed" in text_of(response.text)
    assert (await service.get(e.id)).status == Status.PENDING


async def test_script_in_params_results_topics_and_reasons_is_escaped(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    script = "<script>alert(1)</script>"
    e = await submit(service, ORDERS, [script, 1])
    await post(client, f"/ui/executions/{e.id}/messages",
               {"topic": script, "payload": f'"{script}"', "reason": script, "confirm": "yes"})
    await post(client, f"/ui/executions/{e.id}/pause", {"reason": script, "confirm": "yes"})
    done = await completed(service, store, {"html": script}, [script])
    for page in (f"/ui/executions/{e.id}", f"/ui/executions/{done.id}", "/ui/executions",
                 f"/ui/executions/{e.id}?fragment=history"):
        html = (await client.get(page)).text
        assert "<script>alert" not in html, page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html or (
            "\\u003cscript" in html) or page == "/ui/executions", page
    detail = (await client.get(f"/ui/executions/{e.id}")).text
    assert detail.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3  # params, topic, reason
    assert re.findall(r"<script[^>]*>", detail) == [
        '<script src="/ui/static/dashboard.js">', '<script src="/ui/static/htmx.min.js" defer>']


# -- tokens -------------------------------------------------------------------------------


async def _token(store: Store, name: str, *scopes: str) -> str:
    return (await TokenService(store).create(name, list(scopes))).token


@pytest.fixture
async def secured(service: ExecutionService) -> Any:
    async with client_for(create_api(service, auth_required=True)) as c:
        yield c


async def test_with_tokens_required_the_dashboard_asks_for_one_once(
    secured: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await submit(service)
    first = await secured.get(f"/ui/executions/{e.id}")
    assert first.status_code == 303
    assert first.headers["location"] == f"/ui/login?next=%2Fui%2Fexecutions%2F{e.id}"
    login = await secured.get(first.headers["location"])
    assert "requires an API token" in text_of(login.text)
    wrong = await post(secured, "/ui/login", {"token": "vrc_nope_nope", "next": "/ui/workers"})
    assert wrong.status_code == 401 and "unknown API token" in text_of(wrong.text)
    no_read = await _token(store, "sender", "executions:send")
    refused = await post(secured, "/ui/login", {"token": no_read})
    assert refused.status_code == 403 and "executions:read" in text_of(refused.text)
    reader = await _token(store, "reader", "executions:read")
    signed = await post(secured, "/ui/login", {"token": reader,
                                               "next": f"/ui/executions/{e.id}"})
    assert signed.status_code == 303
    assert signed.headers["location"] == f"/ui/executions/{e.id}"
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith("veracity_token=") and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie and "Path=/ui" in cookie
    page = await secured.get(f"/ui/executions/{e.id}")
    assert page.status_code == 200 and "reader" in text_of(page.text)
    # an open redirect is never made of next
    other = await post(secured, "/ui/login", {"token": reader, "next": "//evil.example/"})
    assert other.headers["location"] == "/ui/executions"


async def test_each_action_needs_the_scope_its_api_route_needs(
    secured: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await submit(service, MONITOR)
    reader = await _token(store, "reader", "executions:read")
    assert (await post(secured, "/ui/login", {"token": reader})).status_code == 303
    for action, scope in (("pause", "executions:pause"), ("cancel", "executions:cancel"),
                          ("messages", "executions:send"),
                          ("resolve", "executions:resolve"), ("retry", "executions:submit")):
        response = await post(secured, f"/ui/executions/{e.id}/{action}",
                              {"topic": "t", "action": "cancel", **REASON})
        assert response.status_code == 403, action
        assert f"lacks the scope {scope}" in text_of(response.text)
    bulk = await post(secured, "/ui/bulk/pause", {"filter": "status=pending", "expected": "1",
                                                   **REASON})
    assert bulk.status_code == 403 and "executions:pause" in text_of(bulk.text)
    assert len(await history(store, e.id)) == 1
    pauser = await _token(store, "pauser", "executions:read", "executions:pause")
    assert (await post(secured, "/ui/login", {"token": pauser})).status_code == 303
    done = await post(secured, f"/ui/executions/{e.id}/pause", REASON)
    assert done.status_code == 303
    paused = (await history(store, e.id))[-1]
    assert paused.data["by"] == "dashboard:pauser"
    out = await post(secured, "/ui/logout", {})
    assert out.status_code == 303 and 'veracity_token=""' in out.headers["set-cookie"]
    assert (await secured.get("/ui/executions")).status_code == 303


async def test_a_revoked_token_in_the_cookie_goes_back_to_sign_in(
    secured: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await submit(service)
    reader = await _token(store, "gone", "executions:read", "executions:pause")
    assert (await post(secured, "/ui/login", {"token": reader})).status_code == 303
    assert (await secured.get("/ui/workers")).status_code == 200
    await TokenService(store).revoke("gone")
    again = await secured.get("/ui/workers?x=1")
    assert again.status_code == 303
    assert again.headers["location"] == "/ui/login?next=%2Fui%2Fworkers%3Fx%3D1"
    assert 'veracity_token=""' in again.headers["set-cookie"]
    # a post sends the browser back to the page it was made from, after signing in
    await _token(store, "other", "executions:read")
    posted = await post(secured, f"/ui/executions/{e.id}/pause", REASON)
    assert posted.status_code == 303
    assert posted.headers["location"] == f"/ui/login?next=%2Fui%2Fexecutions%2F{e.id}"
    assert (await service.get(e.id)).status == Status.PENDING


# -- bulk ----------------------------------------------------------------------------------


async def test_bulk_pause_shows_the_count_then_applies_with_the_reason(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    pending = [await submit(service) for _ in range(3)]
    other = await submit(service, MONITOR, paused=True)
    page = await client.get("/ui/bulk?action=pause&status=pending")
    assert page.status_code == 200
    assert re.search(r'<b id="applicable">3</b>', page.text)
    assert 'name="expected" value="3"' in page.text
    stale = await post(client, "/ui/bulk/pause",
                       {"filter": "status=pending", "expected": "2", **REASON})
    assert stale.status_code == 409 and "now matches 3" in text_of(stale.text)
    for e in pending:
        assert (await service.get(e.id)).status == Status.PENDING
    done = await post(client, "/ui/bulk/pause",
                      {"filter": "status=pending", "expected": "3", **REASON})
    assert done.status_code == 200
    assert "Done: 3 changed" in text_of(done.text)
    for e in pending:
        assert (await service.get(e.id)).status == Status.PAUSED
        assert (await history(store, e.id))[-1].data["reason"] == "customer asked"
    assert len(await history(store, other.id)) == 1


async def test_bulk_needs_a_good_filter_and_counts_only_what_it_can_cancel(
    client: httpx.AsyncClient, service: ExecutionService
) -> None:
    await submit(service, ORDERS)
    await submit(service, MONITOR)
    everything = await client.get("/ui/bulk?action=cancel")
    assert everything.status_code == 422 and "set a filter first" in text_of(everything.text)
    bad = await client.get("/ui/bulk?action=cancel&status=nope")
    assert bad.status_code == 422 and "is not a status" in text_of(bad.text)
    wrong = await client.get("/ui/bulk?action=explode&status=pending")
    assert wrong.status_code == 422 and "is not cancel or pause" in text_of(wrong.text)
    counted = await client.get("/ui/bulk?action=cancel&status=pending")
    text = text_of(counted.text)
    assert "Matching 2" in text and re.search(r'<b id="applicable">1</b>', counted.text)
    refused = await post(client, "/ui/bulk/cancel", {"filter": "", "expected": "0", **REASON})
    assert refused.status_code == 422 and "set a filter first" in text_of(refused.text)


async def test_every_dashboard_route_refuses_a_token_without_its_scope(
    secured: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    """Each scoped /ui route of ROUTE_ACCESS, with a token holding every scope but the one
    it needs (and not admin): a page naming that scope, and nothing written."""
    e = await submit(service, MONITOR)
    routes = {key: access for key, access in ROUTE_ACCESS.items()
              if key[1].startswith("/ui") and isinstance(access, TokenScope)}
    assert len(routes) >= 15
    for i, ((method, template), needed) in enumerate(routes.items()):
        path = template.replace("{execution_id}", str(e.id))
        others = [s.value for s in TokenScope if s not in (needed, TokenScope.ADMIN)]
        value = await _token(store, f"route-{i}", *others)
        sent = await secured.request(method, path, headers={"Authorization": f"Bearer {value}"})
        assert sent.status_code == 403, (method, template)
        assert f"lacks the scope {needed.value}" in text_of(sent.text), (method, template)
    assert len(await history(store, e.id)) == 1
    assert (await service.get(e.id)).status == Status.PENDING
