"""Request body size limit, enforced before the body is parsed (413)."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """Raised while a streamed body is read; an HTTPException so that FastAPI's body
    parsing passes it through instead of calling it a parse error."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body is larger than the limit of {max_bytes} bytes")


class BodySizeLimit:
    """Refuse bodies over ``max_bytes``: at once when Content-Length says so, or as soon as
    a streamed body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reply(send, 400, "bad_request", "invalid Content-Length")
                    return
                if declared > self.max_bytes:
                    await self._too_large(send)
                    return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        await self._reply(
            send, 413, "payload_too_large",
            f"request body is larger than the limit of {self.max_bytes} bytes",
        )

    @staticmethod
    async def _reply(send: Send, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
        })
        await send({"type": "http.response.body", "body": body})
