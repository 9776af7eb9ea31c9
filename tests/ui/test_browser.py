"""The dashboard in a real browser: Debian's Chromium driven through Playwright's Python
API (``executable_path``: Playwright's own browser download cannot work on these machines),
against a real ``veracity server`` on a SQLite file with its in-process worker.

A missing Chromium fails these tests (never a skip); `.ci/run` installs it. Each page's
screenshot is saved under ``.artifacts/ui/`` (git-ignored)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.reconciler._support import REPO_ROOT, VERACITY, free_port, process_env
from tests.ui.browser_app import CHILD, TOUR, WAITER
from veracity._tls import ssl_context
from veracity.core.reconcile import FlagKind, WriteKind
from veracity.models import Claim, NewExecution, ReconcileAction
from veracity.store import open_store

pytestmark = pytest.mark.xdist_group("browser")  # one server and one browser for the module

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO_ROOT / ".artifacts" / "ui"
POLL_MS = 2000
"""The dashboard's polling interval."""
WITHIN_ONE_POLL_MS = POLL_MS + 1500
"""One polling interval, and the time to render and swap the fragment."""


def _missing_browser() -> None:
    pytest.fail(f"Chromium is not installed at {CHROMIUM}: apt-get install chromium "
                "fonts-liberation (.ci/run installs them when missing)")


def _serve(folder: Path, **extra: str) -> Iterator[dict[str, Any]]:
    database_url = f"sqlite:///{folder}/ui.db"
    port = free_port()
    env = process_env(database_url, {
        "VERACITY_APP": "tests.ui.browser_app:app", "VERACITY_PORT": str(port),
        "VERACITY_HOST": "127.0.0.1", "VERACITY_POLL_INTERVAL": "0.2",
        "VERACITY_DEPLOYMENT_ID": "d-browser",
        # no tick during the tests: the flagged run keeps the flag this module gives it
        "VERACITY_RECONCILER_INTERVAL": "3600", **extra})
    err = folder / "server.err"
    with err.open("wb") as stderr:
        proc = subprocess.Popen([VERACITY, "server"], env=env, cwd=folder,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited:\n{err.read_text()}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1, verify=ssl_context()).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not start:\n{err.read_text()}")
            time.sleep(0.05)
        yield {"url": url, "database_url": database_url, "env": env, "folder": folder}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from _serve(tmp_path_factory.mktemp("ui-server"))


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server that requires API tokens (auth.required), on loopback."""
    yield from _serve(tmp_path_factory.mktemp("ui-secured"), VERACITY_AUTH_REQUIRED="true")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        _missing_browser()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser, server: dict[str, Any]) -> Iterator[Page]:
    context = browser.new_context(base_url=server["url"],
                                  viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(10_000)
    try:
        yield opened
    finally:
        context.close()


def shot(page: Page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def submit(server: dict[str, Any], ffqn: str, *params: Any) -> str:
    response = httpx.post(f"{server['url']}/v1/executions",
                          json={"ffqn": ffqn, "params": list(params)}, timeout=5)
    assert response.status_code == 201, response.text
    ident: str = response.json()["id"]
    return ident


def status_of(server: dict[str, Any], ident: str) -> str:
    found: str = httpx.get(f"{server['url']}/v1/executions/{ident}",
                           timeout=5).json()["status"]
    return found


def wait_for(server: dict[str, Any], ident: str, status: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (current := status_of(server, ident)) != status:
        assert time.monotonic() < deadline, f"{ident} is {current}, not {status}"
        time.sleep(0.05)


def history_kinds(server: dict[str, Any], ident: str) -> list[str]:
    items = httpx.get(f"{server['url']}/v1/executions/{ident}/history", timeout=5).json()
    return [item["kind"] for item in items["items"]]


def mark(page: Page) -> None:
    """A value that only survives while the page is not reloaded."""
    page.evaluate("window.__unreloaded = true")


def not_reloaded(page: Page) -> bool:
    return bool(page.evaluate("window.__unreloaded === true"))


def act(page: Page, summary: str, reason: str, **fields: str) -> None:
    """Open an action of the detail page, fill it in, confirm and submit it."""
    details = page.locator("details", has=page.locator("summary", has_text=summary)).first
    details.locator("summary").click()
    for name, value in fields.items():
        details.locator(f"[name={name}]").fill(value)
    details.locator("textarea[name=reason]").fill(reason)
    details.locator("input[name=confirm]").check()
    details.locator("button[type=submit]").click()


def test_the_list_shows_a_new_execution_within_one_polling_interval(
    page: Page, server: dict[str, Any]
) -> None:
    page.goto("/ui/executions")
    expect(page.locator("#list .asof")).to_be_visible()
    mark(page)
    ident = submit(server, WAITER, f"new-{uuid.uuid4().hex[:6]}")
    expect(page.locator(f'#list a[href="/ui/executions/{ident}"]')).to_be_visible(
        timeout=WITHIN_ONE_POLL_MS)
    # the counts above the list move with it: it waits for its message (blocked)
    expect(page.locator("#counts a[href='/ui/executions?status=blocked'] b")).to_have_text(
        "1", timeout=2 * WITHIN_ONE_POLL_MS)
    assert not_reloaded(page)
    shot(page, "executions")


def test_filters_narrow_the_list_and_survive_a_reload(page: Page, server: dict[str, Any]
                                                      ) -> None:
    waiting = submit(server, WAITER, "filtered")
    done = submit(server, CHILD, "filtered")
    wait_for(server, done, "completed")
    wait_for(server, waiting, "blocked")
    page.goto("/ui/executions")
    page.locator("input[name=status][value=blocked]").check()
    page.locator("input[name=ffqn_prefix]").fill("ui:demo/waiter")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(f'#list a[href="/ui/executions/{waiting}"]')).to_be_visible()
    expect(page.locator(f'#list a[href="/ui/executions/{done}"]')).to_have_count(0)
    assert "status=blocked" in page.url and "ffqn_prefix=ui" in page.url
    page.reload()
    expect(page.locator("input[name=status][value=blocked]")).to_be_checked()
    expect(page.locator("input[name=ffqn_prefix]")).to_have_value("ui:demo/waiter")
    expect(page.locator(f'#list a[href="/ui/executions/{done}"]')).to_have_count(0)
    shot(page, "executions-filtered")
    page.goto("/ui/executions?status=nonsense&created_after=yesterday")
    expect(page.locator(".error")).to_contain_text("status: 'nonsense' is not a status")
    expect(page.locator(".error")).to_contain_text("created_after: 'yesterday'")
    expect(page.locator("#list table")).to_have_count(0)
    shot(page, "executions-bad-filter")


def test_the_detail_page_of_a_workflow_with_a_step_a_sleep_a_message_and_two_children(
    page: Page, server: dict[str, Any]
) -> None:
    ident = submit(server, TOUR, "o-1")
    deadline = time.monotonic() + 10
    while "recv_started" not in (kinds := history_kinds(server, ident)) \
            or status_of(server, ident) != "blocked":
        assert time.monotonic() < deadline, kinds  # it waits for its message
        time.sleep(0.05)
    page.goto(f"/ui/executions/{ident}")
    expect(page.locator("#header")).to_contain_text("blocked")
    # the message, sent from the page itself
    act(page, "Send a message", "approved by the browser test", topic="approval",
        payload='{"ok": true}')
    expect(page.locator(".notice")).to_contain_text("Message stored")
    mark(page)
    # it moves on to completed while the page shows, without a reload
    expect(page.locator("#header .status").first).to_have_text(
        "completed", timeout=10_000 + WITHIN_ONE_POLL_MS)
    assert not_reloaded(page)
    page.reload()
    history = page.locator("#history")
    for kind in ("step_completed", "sleep_started", "message_arrived", "child_submitted",
                 "completed"):
        expect(history).to_contain_text(kind)
    expect(history).to_contain_text("approved by the browser test")
    tree = page.locator("ul.tree")
    expect(tree.locator("a", has_text=CHILD)).to_have_count(2)
    expect(tree.locator(".status", has_text="completed")).to_have_count(2)
    shot(page, "execution-detail")


def test_pause_unpause_and_cancel_from_the_page_and_refusals_with_the_apis_reason(
    page: Page, server: dict[str, Any]
) -> None:
    ident = submit(server, WAITER, "acted-on")
    wait_for(server, ident, "blocked")
    page.goto(f"/ui/executions/{ident}")
    act(page, "Pause", "holding for the test")
    expect(page.locator(".notice")).to_contain_text("Paused")
    expect(page.locator("#header .status").first).to_have_text("paused")
    act(page, "Unpause", "go on")
    expect(page.locator(".notice")).to_contain_text("Released")
    expect(page.locator("#header .status").first).to_have_text("blocked")
    # the page is stale: the execution is cancelled meanwhile through the API
    page.locator("details", has=page.locator("summary", has_text="Pause")).first \
        .locator("summary").click()
    response = httpx.put(f"{server['url']}/v1/executions/{ident}/cancel", timeout=5)
    assert response.status_code == 200
    details = page.locator("details", has=page.locator("summary", has_text="Pause")).first
    details.locator("textarea[name=reason]").fill("too late")
    details.locator("input[name=confirm]").check()
    details.locator("button[type=submit]").click()
    expect(page.locator(".error")).to_contain_text("pause refused (wrong_state)")
    expect(page.locator(".error")).to_contain_text("cancelled")
    shot(page, "execution-refused")
    # a workflow that cannot be cancelled: no cancel form, and why
    plain = submit(server, TOUR, "not-cancellable")
    page.goto(f"/ui/executions/{plain}")
    expect(page.locator(".actions")).to_contain_text(
        "only workflows whose name ends in -cancellable can be cancelled")
    cancellable = submit(server, WAITER, "to-cancel")
    wait_for(server, cancellable, "blocked")
    page.goto(f"/ui/executions/{cancellable}")
    act(page, "Cancel", "not needed any more")
    expect(page.locator(".notice")).to_contain_text("Cancellation requested")
    expect(page.locator("#header .status").first).to_have_text("cancelled")
    assert "not needed any more" in str(httpx.get(
        f"{server['url']}/v1/executions/{cancellable}/history", timeout=5).json())


DELEGATED = "ui:demo/delegated.run"
"""A workflow the server's app does not register: its worker never claims it."""


async def _flagged_run(database_url: str) -> str:
    """A run delegated to the engine "n8n" that the reconciler flagged (no external id),
    with the engine's view in its flag, written as the worker and the reconciler write
    them."""
    store = await open_store(database_url)
    try:
        submitted = await store.execution_submit(NewExecution(
            ffqn=DELEGATED, params=["flag-me"], deployment_id="d-browser",
            id=uuid.uuid4()))
        [e] = await store.execution_claim("browser-test", [DELEGATED], limit=1,
                                          lease_ttl=timedelta(seconds=60),
                                          deployment_id="d-browser")
        assert e.id == submitted.execution.id
        claim = Claim(e.id, "browser-test", e.lease_epoch)
        assert (await store.execution_delegate_if_owned(claim, "n8n", "x" * 64)).applied
        assert await store.execution_reconcile_apply([ReconcileAction(
            e.id, None, WriteKind.FLAG,
            "no external id: the trigger's answer was lost; left running",
            {"engine": "n8n", "engine_status": "unknown"}, flag=FlagKind.NO_EXTERNAL_ID)])
        return str(e.id)
    finally:
        await store.close()


def test_a_flagged_run_shows_in_the_flagged_page_and_is_resolved_there(
    page: Page, server: dict[str, Any]
) -> None:
    # Playwright's sync API runs its own event loop in this thread: the store gets another
    with ThreadPoolExecutor(1) as pool:
        ident = pool.submit(asyncio.run, _flagged_run(server["database_url"])).result()
    page.goto("/ui/flagged")
    run = page.locator("article.flagged-run",
                       has=page.locator(f'a[href="/ui/executions/{ident}"]'))
    expect(run).to_contain_text("no_external_id")
    expect(run).to_contain_text("the trigger's answer was lost")
    expect(run).to_contain_text("The engine last said")
    shot(page, "flagged")
    run.locator("summary", has_text="Resolve").click()
    run.locator("input[name=action][value=attach]").check()
    run.locator("input[name=external_execution_id]").fill("run-77")
    run.locator("textarea[name=reason]").fill("found it in n8n")
    run.locator("input[name=confirm]").check()
    run.locator("button[type=submit]").click()
    expect(page.locator(".notice")).to_contain_text("External id attached")
    header = page.locator("#header")
    expect(header).to_contain_text("run-77")
    for shown in ("Engine", "n8n", "Triggered", "Limit", "Reconciler's last look"):
        expect(header).to_contain_text(shown)
    shot(page, "execution-delegated")


def test_the_pages_work_with_javascript_off(browser: Browser, server: dict[str, Any]) -> None:
    context = browser.new_context(base_url=server["url"], java_script_enabled=False)
    page = context.new_page()
    try:
        ident = submit(server, WAITER, "no-js")
        wait_for(server, ident, "blocked")
        page.goto("/ui/executions")
        page.locator("input[name=ffqn_prefix]").fill("ui:demo/waiter")
        page.get_by_role("button", name="Filter").click()
        assert "ffqn_prefix=ui" in page.url
        page.goto(f"/ui/executions/{ident}")
        act(page, "Pause", "paused with JavaScript off")
        expect(page.locator(".notice")).to_contain_text("Paused")
        assert status_of(server, ident) == "paused"
        shot(page, "execution-no-js")
    finally:
        context.close()


def test_the_other_pages_read_well(page: Page, server: dict[str, Any]) -> None:
    for name, heading in (("workers", "Workers"), ("deployments", "Deployments"),
                          ("crons", "Cron entries")):
        page.goto(f"/ui/{name}")
        expect(page.locator("h1")).to_have_text(heading)
        shot(page, name)
    expect(page.locator("main")).to_contain_text("No cron entries are configured")
    page.goto("/ui/workers")
    expect(page.locator("table")).to_contain_text("live")
    page.goto(f"/ui/executions/{uuid.uuid4()}")
    expect(page.locator("h1")).to_have_text("No such execution")
    shot(page, "not-found")
    page.goto("/ui/bulk?action=pause&ffqn_prefix=ui:demo/waiter&status=blocked")
    expect(page.locator("#applicable")).to_be_visible()
    shot(page, "bulk")


def _token(server: dict[str, Any], name: str, *scopes: str) -> str:
    args = [VERACITY, "token", "create", "--name", name]
    for scope in scopes:
        args += ["--scope", scope]
    made = subprocess.run(args, env=server["env"], cwd=server["folder"], capture_output=True,
                          text=True, timeout=30, check=True)
    return made.stdout.strip()


def test_a_token_is_asked_for_once_and_each_action_needs_its_scope(
    browser: Browser, secured_server: dict[str, Any]
) -> None:
    reader = _token(secured_server, "reader", "executions:read")
    context = browser.new_context(base_url=secured_server["url"])
    page = context.new_page()
    try:
        page.goto("/ui/executions")
        assert "/ui/login" in page.url
        page.locator("input[name=token]").fill("vrc_wrong_token")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator(".error")).to_contain_text("unknown API token")
        page.locator("input[name=token]").fill(reader)
        shot(page, "login")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("h1")).to_have_text("Executions")
        expect(page.locator(".who")).to_contain_text("reader")
        cookie = next(c for c in context.cookies() if c["name"] == "veracity_token")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie").find("veracity_token") == -1
        # the API itself still needs the token: the cookie is the dashboard's only
        submitter = _token(secured_server, "submitter", "executions:submit")
        response = httpx.post(f"{secured_server['url']}/v1/executions", timeout=5,
                              json={"ffqn": WAITER, "params": ["secured"]},
                              headers={"Authorization": f"Bearer {submitter}"})
        ident = response.json()["id"]
        page.goto(f"/ui/executions/{ident}")
        act(page, "Pause", "a reader may not")
        expect(page.locator(".error")).to_contain_text("lacks the scope executions:pause")
        shot(page, "forbidden")
        page.locator(".who button").click()
        expect(page.locator("h1")).to_have_text("Sign in")
        page.goto("/ui/workers")
        assert "/ui/login" in page.url
    finally:
        context.close()


def test_no_page_logs_an_error_or_breaks_its_content_security_policy(
    page: Page, server: dict[str, Any]
) -> None:
    """A script or style the policy refuses, a failed request (a favicon included) or a
    script error would show in the browser's console."""
    ident = submit(server, WAITER, "console")
    logged: list[str] = []
    page.on("console", lambda m: logged.append(f"{m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: logged.append(f"pageerror: {e}"))
    for path in ("/ui/executions", f"/ui/executions/{ident}", "/ui/flagged", "/ui/workers",
                 "/ui/deployments", "/ui/crons"):
        page.goto(path)
        if path.startswith("/ui/executions"):
            page.wait_for_timeout(POLL_MS + 500)  # one poll at least
    assert logged == []
