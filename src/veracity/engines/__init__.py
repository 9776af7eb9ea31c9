"""External workflow engines: the adapter protocol (``base``) and its adapters (``n8n``)."""

from veracity.engines.base import (
    CallbackInfo,
    Engine,
    EngineConfig,
    EngineErrorKind,
    Inspection,
    StartOutcome,
    StartResult,
    StopMode,
    StopResult,
    parse_engine_config,
    parse_engines,
)
from veracity.engines.n8n import N8nEngine

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
    "create_engine",
    "parse_engine_config",
    "parse_engines",
]


def create_engine(config: EngineConfig) -> Engine:
    """The adapter for one configured engine."""
    if config.type == "n8n":
        return N8nEngine(config)
    raise ValueError(f"{config.entry}: no adapter for engine type {config.type!r}")
