"""The HTTP API (FastAPI): JSON under /v1, OpenAPI at /openapi.json and /docs."""

from veracity.api.app import create_api

__all__ = ["create_api"]
