"""Veracity's HTTP clients share one TLS context per process (src/veracity/_tls.py): building
a client, the n8n adapter or the fake n8n's callback sender reads no CA bundle."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.adapters.test_n8n import ENV, config
from veracity import AsyncClient, Client
from veracity._tls import ssl_context
from veracity.adapters.n8n import N8nEngine
from veracity.testing.fake_n8n import FakeN8n
from veracity.testing.fake_n8n.web import _Runtime


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """Every default TLS context made from here on (the CA bundle read each time)."""
    ssl_context()  # the process's own, made once before counting
    ssl_context(trust_env=False)
    calls: list[tuple[Any, ...]] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        calls.append(args + tuple(kwargs.values()))
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    yield calls


def test_a_plain_httpx_client_makes_a_context_of_its_own(made: list[tuple[Any, ...]]) -> None:
    """What the shared context saves, and that the counter above counts."""
    with httpx.Client():
        pass
    assert len(made) == 1


async def test_veracitys_clients_make_none(
    made: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    with Client("http://127.0.0.1:9"):
        pass
    async with AsyncClient("http://127.0.0.1:9"):
        pass
    async with N8nEngine(config("http://127.0.0.1:9")):
        pass
    runtime = _Runtime(FakeN8n())
    await runtime.close()
    assert made == []


def test_the_context_verifies_as_httpx_does() -> None:
    context = ssl_context()
    assert context is ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # certifi's bundle (or SSL_CERT_FILE's)
