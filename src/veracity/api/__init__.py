"""The HTTP API (FastAPI): JSON under /v1, OpenAPI at /openapi.json and /docs.

``create_api`` loads FastAPI on first use: the CLI reads ``veracity.api.schemas`` without
paying for the web framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from veracity.api.app import create_api

__all__ = ["create_api"]


def __getattr__(name: str) -> Any:
    if name == "create_api":
        from veracity.api.app import create_api

        return create_api
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
