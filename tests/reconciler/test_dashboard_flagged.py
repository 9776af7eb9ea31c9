"""A flagged run in the dashboard's /ui/flagged, flagged by the reconciler through the fake
n8n: Veracity's state beside what the engine last said, the reason, its age, and the
resolve form (docs/dashboard.md)."""

from __future__ import annotations

import asyncio
import os
import re

import httpx

from tests.reconciler._support import FAST_LIMIT, SLOW, Rig
from veracity.testing.fake_n8n import Script


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#39;", "'").strip()


async def test_a_run_the_engine_does_not_know_shows_with_the_engines_view(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    s = await rig.start(Script.forever(callback="lose"), SLOW)
    rig.fake.forget(str(s.run_id))  # pruned, or never n8n's id
    await asyncio.sleep(FAST_LIMIT)
    assert [a.kind for a in (await rig.tick()).actions] == ["flag"]
    page = await client.get("/ui/flagged")
    assert page.status_code == 200
    text = text_of(page.text)
    card = text[text.index("unknown_id"):]
    assert f'href="/ui/executions/{s.id}"' in page.text
    assert f"the engine does not know external id {s.run_id}" in card
    assert "flagged 0 s ago" in card or "flagged 1 s ago" in card
    assert "Veracity Status running Engine n8n" in card
    assert f"External id {s.run_id}" in card
    assert "The engine last said Run status no run with this id" in card
    assert "Limit not breached" in card and "What to do:" in card
    assert f'action="/ui/executions/{s.id}/resolve"' in page.text


async def test_in_a_real_browser_the_flagged_page_shows_what_the_fake_n8n_last_said(
    rig: Rig, api_url: str
) -> None:
    """The same run in Debian's Chromium (tests/ui/test_browser.py: never a skip), the
    dashboard served on loopback over the rig's database: flagged by the reconciler after
    a look at the fake n8n, which knows no such run."""
    from playwright.async_api import async_playwright, expect

    from tests.ui.test_browser import ARTIFACTS, CHROMIUM, _missing_browser

    if not os.path.exists(CHROMIUM):
        _missing_browser()
    s = await rig.start(Script.forever(callback="lose"), SLOW)
    rig.fake.forget(str(s.run_id))
    await asyncio.sleep(FAST_LIMIT)
    assert [a.kind for a in (await rig.tick()).actions] == ["flag"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(base_url=api_url,
                                          viewport={"width": 1280, "height": 900})
            page.set_default_timeout(10_000)
            await page.goto("/ui/flagged")
            run = page.locator("article.flagged-run",
                               has=page.locator(f'a[href="/ui/executions/{s.id}"]'))
            await expect(run).to_contain_text("unknown_id")
            await expect(run).to_contain_text(
                f"the engine does not know external id {s.run_id}")
            await expect(run).to_contain_text("no run with this id")  # the engine's view
            await expect(run).to_contain_text("What to do:")
            await page.screenshot(path=str(ARTIFACTS / "flagged-by-the-fake-n8n.png"),
                                  full_page=True)
        finally:
            await browser.close()
    await rig.assert_truthful()
