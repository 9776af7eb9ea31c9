"""Adapters to external workflow engines: the protocol and its results (``base``), their
configuration (``config``), the n8n adapter (``n8n``), and looks at delegated runs
(``looks``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from veracity.adapters.base import (
    CallbackInfo,
    Engine,
    EngineErrorKind,
    Inspection,
    StartOutcome,
    StartResult,
    StopResult,
)
from veracity.adapters.config import (
    EngineConfig,
    ExternalConfig,
    StopMode,
    parse_engine_config,
    parse_engines,
)

if TYPE_CHECKING:
    from veracity.adapters.n8n import N8nEngine

__all__ = [
    "CallbackInfo",
    "Engine",
    "EngineConfig",
    "EngineErrorKind",
    "Inspection",
    "N8nEngine",
    "StartOutcome",
    "StartResult",
    "StopMode",
    "StopResult",
    "build_engines",
    "close_engines",
    "create_engine",
    "parse_engine_config",
    "parse_engines",
]

log = logging.getLogger("veracity.adapters")


def __getattr__(name: str) -> Any:
    # the n8n adapter (and its HTTP stack) loads only when an engine needs it
    if name == "N8nEngine":
        from veracity.adapters.n8n import N8nEngine

        return N8nEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def create_engine(config: EngineConfig) -> Engine:
    """The adapter for one configured engine."""
    if config.type == "n8n":
        from veracity.adapters.n8n import N8nEngine

        return N8nEngine(config)
    raise ValueError(f"{config.entry}: no adapter for engine type {config.type!r}")


def build_engines(config: ExternalConfig) -> dict[str, Engine]:
    """An adapter for every configured engine."""
    return {name: create_engine(cfg) for name, cfg in config.engines.items()}


async def close_engines(engines: Mapping[str, Engine]) -> None:
    for engine in engines.values():
        try:
            await engine.aclose()
        except Exception as exc:  # closing is best effort
            log.warning("closing engine %s: %s", engine.name, exc)
