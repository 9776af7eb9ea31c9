"""Fixtures: a fake n8n served on loopback, a rig over a fresh database of each backend, the
API in-process (ASGI) over the rig's store, and the API served for real on loopback (for the
callbacks the fake sends)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests._helpers import store_fixture
from tests.reconciler._support import (
    CLOSED_URL,
    DEPLOYMENT,
    FAST,
    MAX_PAYLOAD,
    SLOW,
    V1,
    Rig,
    Tagged,
    TaggingRecorder,
    external_config,
    new_fake,
)
from veracity.adapters.n8n import N8nEngine
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.store import Store, open_store
from veracity.testing.fake_n8n import FakeN8n, create_app, running, serve_asgi_in_thread


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> FakeN8n:
    """A fake n8n (1.x by default; parametrize indirectly with a version string)."""
    version: str = getattr(request, "param", V1)
    return new_fake(version)


@pytest.fixture
def tagged() -> Iterator[Tagged]:
    """A fake n8n (1.x) served behind a recorder of every request's span, by URL prefix."""
    fake = new_fake()
    recorder = TaggingRecorder(create_app(fake))
    url, stop = serve_asgi_in_thread(recorder, before_stop=fake.release_hangs)
    try:
        yield Tagged(fake, url, recorder)
    finally:
        stop()


@pytest.fixture
def fake_url(fake: FakeN8n) -> Iterator[str]:
    with running(fake) as url:
        yield url


store = store_fixture(pool_size=4)


MakeRig = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def make_rig(fake: FakeN8n, fake_url: str, store: Store) -> AsyncIterator[MakeRig]:
    engines: list[N8nEngine] = []

    async def make(public_url: str = CLOSED_URL, timeout: float = 5.0) -> Rig:
        external = external_config(fake_url, public_url, timeout=timeout)
        engine = N8nEngine(external.engines["n8n"])
        engines.append(engine)
        return Rig(fake, fake_url, store, external, engine)

    try:
        yield make
    finally:
        for engine in engines:
            await engine.aclose()


@pytest.fixture
async def rig(make_rig: MakeRig) -> Rig:
    return await make_rig()


def api_for(store: Store) -> FastAPI:
    service = ExecutionService(store, workflows={FAST, SLOW}, deployment_id=DEPLOYMENT,
                               max_payload_bytes=MAX_PAYLOAD)
    return create_api(service, max_payload_bytes=MAX_PAYLOAD)


@pytest.fixture
async def client(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    """The API in-process over the test's store."""
    transport = httpx.ASGITransport(app=api_for(store), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://veracity") as c:
        yield c


@pytest.fixture
def api_url(database_url: str) -> Iterator[str]:
    """The API served on a loopback port by a thread of its own (its own store), where the
    fake's callbacks arrive."""

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        opened = await open_store(database_url, pool_size=2)
        api.state.service = ExecutionService(opened, workflows={FAST, SLOW},
                                             deployment_id=DEPLOYMENT,
                                             max_payload_bytes=MAX_PAYLOAD)
        try:
            yield
        finally:
            await opened.close()

    app: Any = create_api(lifespan=lifespan, max_payload_bytes=MAX_PAYLOAD)
    url, stop = serve_asgi_in_thread(app)
    try:
        yield url
    finally:
        stop()
