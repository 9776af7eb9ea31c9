"""A flagged run in the dashboard's /ui/flagged, flagged by the reconciler through the fake
n8n: Veracity's state beside what the engine last said, the reason, its age, and the
resolve form (docs/dashboard.md)."""

from __future__ import annotations

import asyncio
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
