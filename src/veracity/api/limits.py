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


class JsonBodies:
    """Bodies under ``/v1`` are JSON. One sent without a Content-Type is taken as JSON; one
    declared as anything else (``curl -d`` sends form encoding, for instance) is answered
    ``415 unsupported_media_type`` saying what to send. (Accepting text/plain or form
    bodies would let any web page a browser visits post to the API.)"""

    METHODS = frozenset({"POST", "PUT", "PATCH"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] not in self.METHODS
                or not scope["path"].startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        headers = list(scope.get("headers", ()))
        declared = next((v for k, v in headers if k == b"content-type"), None)
        if declared is None:
            scope = dict(scope, headers=[*headers, (b"content-type", b"application/json")])
        else:
            media = declared.split(b";", 1)[0].strip().lower()
            if media != b"application/json" and not media.endswith(b"+json"):
                length = next((v for k, v in headers if k == b"content-length"), None)
                chunked = any(k == b"transfer-encoding" for k, _ in headers)
                if chunked or (length is not None and length.strip() not in (b"0", b"")):
                    await BodySizeLimit._reply(
                        send, 415, "unsupported_media_type",
                        f"the body must be JSON, sent as Content-Type: application/json "
                        f"(got {declared.decode(errors='replace')[:100]}); with curl, add "
                        "-H 'content-type: application/json'")
                    return
        await self.app(scope, receive, send)
