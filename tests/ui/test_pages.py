"""The dashboard's pages as HTML, on both backends: the list with its filters, counts and
pages, the detail page with its history and tree, the other pages, and bad input."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from tests.ui.conftest import (
    MAIL,
    MONITOR,
    ORDERS,
    child,
    completed,
    flagged,
    submit,
    text_of,
)
from veracity.control import ExecutionService
from veracity.models import WorkerInfo
from veracity.store import Store


def ids_listed(html: str) -> list[str]:
    """The execution ids the list links to, in order."""
    return re.findall(r'href="/ui/executions/([0-9a-f-]{36})"', html)


async def test_the_root_and_ui_redirect_to_the_list(client: httpx.AsyncClient) -> None:
    for path in ("/", "/ui"):
        response = await client.get(path)
        assert response.status_code == 307
        assert response.headers["location"] == "/ui/executions"


async def test_an_empty_list_says_so(client: httpx.AsyncClient) -> None:
    response = await client.get("/ui/executions")
    assert response.status_code == 200
    assert "No executions yet." in text_of(response.text)
    assert "text/html" in response.headers["content-type"]
    assert "script-src 'self'" in response.headers["content-security-policy"]


async def test_the_list_is_newest_first_with_counts_that_link(
    client: httpx.AsyncClient, service: ExecutionService
) -> None:
    a = await submit(service)
    b = await submit(service, MAIL)
    c = await submit(service, MONITOR, paused=True)
    html = (await client.get("/ui/executions")).text
    assert ids_listed(html) == [str(c.id), str(b.id), str(a.id)]
    text = text_of(html)
    assert "1 paused" in text and "0 failed" in text and "0 flagged" in text
    assert 'href="/ui/executions?status=paused"' in html
    assert 'href="/ui/flagged"' in html


async def test_keyset_pages_follow_each_other(client: httpx.AsyncClient,
                                              service: ExecutionService) -> None:
    made = [await submit(service) for _ in range(30)]
    first = await client.get("/ui/executions?limit=25")
    assert ids_listed(first.text) == [str(e.id) for e in reversed(made)][:25]
    older = re.search(r'href="/ui/executions\?([^"]*cursor=[^"]+)">older', first.text)
    assert older is not None
    second = await client.get("/ui/executions?" + older.group(1).replace("&amp;", "&"))
    assert ids_listed(second.text) == [str(e.id) for e in reversed(made)][25:]
    assert "older" not in text_of(second.text)
    assert "newest" in text_of(second.text)


async def test_filters_narrow_the_list_and_stay_in_the_form(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    orders = await submit(service)
    mail = await submit(service, MAIL)
    paused = await submit(service, MONITOR, paused=True)
    two = await client.get("/ui/executions?status=paused&status=pending&ffqn_prefix=shop:m")
    assert ids_listed(two.text) == [str(paused.id), str(mail.id)]
    assert 'value="paused" checked' in two.text and 'value="shop:m"' in two.text
    comma = await client.get("/ui/executions?status=paused,pending")
    assert set(ids_listed(comma.text)) == {str(paused.id), str(mail.id), str(orders.id)}
    by_id = await client.get(f"/ui/executions?id={mail.id}")
    assert ids_listed(by_id.text) == [str(mail.id)]
    missing = await client.get(f"/ui/executions?id={uuid.uuid4()}")
    assert ids_listed(missing.text) == [] and "No execution with the id" in missing.text
    assert ids_listed((await client.get("/ui/executions?deployment_id=other")).text) == []
    after = orders.created_at.isoformat()
    between = await client.get("/ui/executions", params={
        "created_after": after, "created_before": "9000-01-01T00:00"})
    assert set(ids_listed(between.text)) == {str(mail.id), str(paused.id)} - (
        {str(mail.id)} if mail.created_at <= orders.created_at else set())
    flagged_only = await client.get("/ui/executions?flagged=1")
    assert ids_listed(flagged_only.text) == []


@pytest.mark.parametrize(("query", "named"), [
    ("status=bogus", "status: 'bogus' is not a status"),
    ("status=pending&status=<b>x</b>", "is not a status"),
    ("ffqn_prefix=no%20spaces%20here", "ffqn_prefix:"),
    ("created_after=yesterday", "created_after: 'yesterday' is not a time"),
    ("created_before=10000-01-01", "created_before:"),
    ("created_after=2030-01-02&created_before=2030-01-01",
     "created_after must be earlier than created_before"),
    ("id=12345", "id: '12345' is not an execution id"),
    ("limit=7", "limit: '7' is not one of"),
    ("cursor=garbage", "cursor is not one this server gave out"),
    ("flagged=maybe", "flagged: 1 or 0"),
])
async def test_a_bad_filter_value_is_named_and_nothing_is_listed(
    client: httpx.AsyncClient, service: ExecutionService, query: str, named: str
) -> None:
    await submit(service)
    response = await client.get(f"/ui/executions?{query}")
    assert response.status_code == 422
    assert named in text_of(response.text).replace("&#39;", "'")
    assert "Nothing is listed" in text_of(response.text)
    assert ids_listed(response.text) == []
    assert "<b>x</b>" not in response.text


async def test_the_list_fragment_polls_while_unfinished_work_shows(
    client: httpx.AsyncClient, service: ExecutionService
) -> None:
    e = await submit(service, MONITOR)
    page = await client.get("/ui/executions")
    assert 'hx-trigger="every 2s"' in page.text
    fragment = await client.get("/ui/executions?fragment=list")
    # the counts first, swapped out of band, then the list itself
    assert fragment.text.lstrip().startswith('<section id="counts"')
    assert 'hx-swap-oob="true"' in fragment.text and '<section id="list"' in fragment.text
    assert "<html" not in fragment.text and "as of" in fragment.text
    assert str(e.id) in fragment.text
    paused = await client.get("/ui/executions?live=0")
    assert 'hx-trigger' not in paused.text and "updates paused" in text_of(paused.text)
    await service.cancel(e.id)
    ended = await client.get("/ui/executions")
    assert 'hx-trigger' not in ended.text  # nothing unfinished: nothing to poll


async def test_the_detail_page_shows_the_header_history_and_tree(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    parent = await submit(service, ORDERS, ["order-7", 2500])
    kids = [await child(store, parent, join_set="mails") for _ in range(2)]
    direct = await child(store, parent, MONITOR)
    grandchild = await child(store, kids[0])
    await service.send(parent.id, "approval", {"ok": True})
    response = await client.get(f"/ui/executions/{parent.id}")
    assert response.status_code == 200
    text = text_of(response.text)
    for shown in (ORDERS, str(parent.id), "pending", "order-7", "2500", "d-ui", "Attempt",
                  "message_arrived", "approval", "join set mails", "direct calls"):
        assert shown in text, shown
    for e in (*kids, direct, grandchild):
        assert f'href="/ui/executions/{e.id}"' in response.text
    assert 'hx-trigger="every 2s"' in response.text  # unfinished: its header polls
    child_page = await client.get(f"/ui/executions/{grandchild.id}")
    assert f'href="/ui/executions/{kids[0].id}"' in child_page.text  # its parent
    header = await client.get(f"/ui/executions/{parent.id}?fragment=header")
    assert "<html" not in header.text and "as of" in header.text


async def test_a_completed_execution_shows_its_result_and_stops_polling(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await completed(service, store, {"receipt": "r-42"})
    html = (await client.get(f"/ui/executions/{e.id}")).text
    assert "r-42" in text_of(html) and "Result" in text_of(html)
    assert "hx-trigger" not in html
    assert "Nothing can be done: it has ended (completed)" in text_of(html)


async def test_the_history_is_paged_and_filtered_by_kind(
    client: httpx.AsyncClient, service: ExecutionService
) -> None:
    e = await submit(service)
    for i in range(150):
        await service.send(e.id, f"t{i}", i)
    first = await client.get(f"/ui/executions/{e.id}")
    rows = re.findall(r'<td class="num">(\d+)</td><td><span class="kind', first.text)
    assert rows == [str(n) for n in range(1, 101)]
    assert f'href="/ui/executions/{e.id}?after=100"' in first.text
    assert "message_arrived (150)" in text_of(first.text)
    second = await client.get(f"/ui/executions/{e.id}?after=100")
    rows = re.findall(r'<td class="num">(\d+)</td><td><span class="kind', second.text)
    assert rows == [str(n) for n in range(101, 152)]
    only = await client.get(f"/ui/executions/{e.id}?kind=pending")
    rows = re.findall(r'<td class="num">(\d+)</td><td><span class="kind', only.text)
    assert rows == ["1"]
    bad = await client.get(f"/ui/executions/{e.id}?after=-1")
    assert "after: '-1' is not a position" in text_of(bad.text).replace("&#39;", "'")


# a fixed unknown id: every xdist worker must collect the same parameters
@pytest.mark.parametrize("ident", ["0b9c6a52-3f1e-4c55-9d4e-7a1f2e8b6c01", "not-an-id",
                                   "<script>x</script>"])
async def test_an_unknown_id_is_a_404_page(client: httpx.AsyncClient, ident: str) -> None:
    response = await client.get(f"/ui/executions/{ident}")
    assert response.status_code == 404
    assert "No such" in response.text
    assert "<script>x" not in response.text


async def test_the_workers_deployments_and_crons_pages(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    await store.worker_register(WorkerInfo(
        id="w-ui", host="host-a", pid=4242, deployment_id="d-ui", ffqns=[ORDERS],
        concurrency=8))
    await submit(service)
    workers = text_of((await client.get("/ui/workers")).text)
    for shown in ("w-ui", "host-a", "4242", "live", ORDERS):
        assert shown in workers, shown
    deployments = await client.get("/ui/deployments")
    assert deployments.status_code == 200 and "d-ui" in deployments.text
    assert 'href="/ui/executions?deployment_id=d-ui&amp;status=pending"' in deployments.text
    crons = await client.get("/ui/crons")
    assert "No cron entries are configured" in text_of(crons.text)


async def test_the_flagged_page_shows_both_sides_the_reason_and_the_resolve_form(
    client: httpx.AsyncClient, service: ExecutionService, store: Store
) -> None:
    e = await flagged(service, store, "the trigger's answer was lost <b>x</b>",
                      {"engine": "n8n", "engine_status": "running"})
    html = (await client.get("/ui/flagged")).text
    text = text_of(html)
    for shown in ("no_external_id", "the trigger's answer was lost", "Veracity",
                  "The engine last said", "running", "Resolve", str(e.id)[-8:]):
        assert shown in text.replace("&#39;", "'"), shown
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert f'action="/ui/executions/{e.id}/resolve"' in html
    empty = await client.get("/ui/executions?flagged=1")
    assert ids_listed(empty.text) == [str(e.id)]
