"""The fake n8n every adapter test talks to, over HTTP on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.adapters.test_n8n import API_KEY, EMAIL, PASSWORD, V2
from veracity.testing.fake_n8n import FakeN8n, Script, running


@pytest.fixture
def fake() -> FakeN8n:
    n8n = FakeN8n(version=V2, api_key=API_KEY, email=EMAIL, password=PASSWORD)
    n8n.add_webhook("fulfil", Script.forever())
    return n8n


@pytest.fixture
def base_url(fake: FakeN8n) -> Iterator[str]:
    with running(fake) as url:
        yield url
