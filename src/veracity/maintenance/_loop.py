"""The loop around a service's ``run_once()``: tick, sleep, tick — never overlapping."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol


class Service(Protocol):
    name: str

    async def run_once(self) -> Any: ...


async def run_forever(service: Service, interval: float, stop: asyncio.Event) -> None:
    log = logging.getLogger(f"veracity.{service.name}")
    while not stop.is_set():
        try:
            await service.run_once()
        except Exception as exc:  # a failed tick is logged and counted; the loop goes on
            log.warning("tick failed: %s", exc, extra={"domain": service.name})
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
        except TimeoutError:
            pass
