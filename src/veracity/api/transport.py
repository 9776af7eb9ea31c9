"""The HTTP side of ``veracity server``: uvicorn with a read timeout and a connection bound.

uvicorn cuts idle keep-alive connections, but it waits for ever for a request whose headers
or body arrive slowly (or never), and a connection that sends nothing is held for as long
as the client likes: a few hundred such clients hold the server. Here every request must
have arrived whole ``read_timeout`` seconds after it began (or after its connection was
opened), or its connection is closed; and connections beyond ``max_connections`` are
answered ``503`` at once (uvicorn's ``limit_concurrency``). docs/operations.md.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("veracity.server")


class ReadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline for reading each request."""

    read_timeout: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._read_deadline is None:
            self._read_deadline = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that never sends a whole request is cut off too

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            log.warning("closing a connection whose request did not arrive within %g s",
                        self.read_timeout,
                        extra={"domain": "server", "client": str(self.client)})
            self.transport.close()


def protocol_with(read_timeout: float) -> type[ReadTimeoutProtocol]:
    """The protocol class for one server (uvicorn instantiates it per connection)."""
    return type("ReadTimeoutProtocolConfigured", (ReadTimeoutProtocol,),
                {"read_timeout": read_timeout})
