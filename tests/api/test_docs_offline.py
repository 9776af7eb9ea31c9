"""``/docs`` (Swagger UI) and ``/redoc`` work offline: each page and every file it refers to
(scripts, styles, icon, the OpenAPI document) come from the server itself, from files
shipped in a package (api/docs.py), never from another host; nothing else is referred to."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import httpx
import pytest

from veracity.api import create_api
from veracity.control import ExecutionService

EXPECTED_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png",
                  ".json": "application/json"}


class Refs(HTMLParser):
    """The URLs a page loads: src and href attributes, ReDoc's spec-url."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "spec-url") and value:
                self.urls.append(value)


def references(page: str) -> list[str]:
    parser = Refs()
    parser.feed(page)
    # Swagger UI's configuration names the document and the OAuth2 page in its script
    parser.urls += re.findall(r"url: '([^']+)'", page)
    parser.urls += re.findall(r"window\.location\.origin \+ '([^']+)'", page)
    return parser.urls


@pytest.mark.parametrize(("page", "needs"), [
    ("/docs", {"/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css",
               "/openapi.json", "/docs/oauth2-redirect"}),
    ("/redoc", {"/docs/static/redoc.standalone.js", "/openapi.json"}),
])
async def test_a_docs_page_and_everything_it_loads_come_from_the_server(
    client: httpx.AsyncClient, page: str, needs: set[str]
) -> None:
    response = await client.get(page)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    # no other host anywhere in the page: no CDN, no web fonts, no online validator
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", html, re.IGNORECASE), html
    urls = references(html)
    assert needs <= set(urls), urls
    assert "/docs/static/favicon.png" in urls
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        got = await client.get(url)
        assert got.status_code == 200, (url, got.status_code)
        assert len(got.content) > 0, url
        suffix = url[url.rfind("."):] if "." in url.rsplit("/", 1)[-1] else ""
        if suffix in EXPECTED_TYPES:
            assert got.headers["content-type"].startswith(EXPECTED_TYPES[suffix]), url
    script = next((u for u in urls if u.endswith(".js")), None)
    assert script is not None
    assert len((await client.get(script)).content) > 500_000  # the whole bundle, not a stub


async def test_only_the_shipped_files_are_served(client: httpx.AsyncClient) -> None:
    for name in ["nope.js", "..%2f..%2fpyproject.toml", "__init__.py", "core.py"]:
        response = await client.get(f"/docs/static/{name}")
        assert response.status_code == 404, (name, response.text)
        assert response.json()["error"]["code"] == "not_found"


async def test_the_docs_need_no_token(service: ExecutionService) -> None:
    api = create_api(service, auth_required=True)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/v1/executions")).status_code == 401
        for url in ["/docs", "/redoc", "/docs/oauth2-redirect",
                    "/docs/static/swagger-ui.css", "/openapi.json"]:
            assert (await client.get(url)).status_code == 200, url
            assert (await client.head(url)).status_code == 200, url
