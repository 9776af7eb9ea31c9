"""Structured logs: one JSON object per line, with a ``domain`` for each service."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from veracity.bindings import redact_json, secrets_known

_STANDARD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if secrets_known():
            # a secret value (docs/http.md) is never written, whatever logged it: every
            # string redacted before JSON escapes could hide a value from the search
            out = redact_json(json.loads(json.dumps(out, default=str)))
        return json.dumps(out, default=str)


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel("WARNING")
    # the pool logs every failed reconnection attempt; during an outage Veracity's own
    # lines (rate-limited, with counts) say it once in a while instead
    logging.getLogger("psycopg.pool").setLevel("ERROR")

