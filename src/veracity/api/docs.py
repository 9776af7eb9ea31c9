"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), working offline: their JavaScript, CSS and
icon are served by the server itself from the files the ``fastapi-offline`` package ships
(MIT; Swagger UI is Apache-2.0, ReDoc MIT), never from a CDN. The pages load nothing from
anywhere else: no web fonts, no online validator.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from starlette.requests import Request
from starlette.responses import Response

from veracity.api.errors import error_response

ASSETS = "/docs/static"
ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
"""The files served under ASSETS, from the package ``fastapi_offline``'s ``static``."""


def _asset(name: str) -> bytes:
    return resources.files("fastapi_offline").joinpath("static", name).read_bytes()


def install_docs(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """Add ``/docs``, ``/docs/oauth2-redirect``, ``/redoc`` and their assets to ``app``
    (created with ``docs_url=None, redoc_url=None``)."""
    redirect = "/docs/oauth2-redirect"

    async def swagger(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{redirect}",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            # no badge fetched from the online validator
            swagger_ui_parameters={"validatorUrl": None})

    async def swagger_redirect(_: Request) -> Response:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png", with_google_fonts=False)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        media = ASSET_TYPES.get(name)
        if media is None:
            return error_response(404, "not_found", f"no such file: {name[:100]}")
        return Response(_asset(name), media_type=media,
                        headers={"Cache-Control": "public, max-age=86400"})

    app.add_route("/docs", swagger, include_in_schema=False)
    app.add_route(redirect, swagger_redirect, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)
    app.add_route(f"{ASSETS}/{{name}}", asset, include_in_schema=False)
