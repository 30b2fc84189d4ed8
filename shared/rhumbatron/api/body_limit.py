"""The request body limit: a body over ``api_max_body_bytes`` is answered 413 before it is
read whole, declared (``Content-Length``) or streamed (chunked, or a Lambda event without
the header).

A pure ASGI middleware, not Starlette's ``BaseHTTPMiddleware``: it must see the body's
messages as they arrive. A declared length over the limit is refused at once, unread. Any
other body is received here up to the limit (at most ``max_bytes`` held in memory) and
handed on as one message; one byte more and the request is refused. Counting inside the
app instead would not work: FastAPI turns any error raised while it reads a body into a 400.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimit"]


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413 ``payload_too_large``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, f"declares {declared} bytes")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay(message), send)  # a disconnect: pass it on
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(send, f"is more than {self.max_bytes} bytes")
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay_body(bytes(body), receive), send)

    async def _refuse(self, send: Send, what: str) -> None:
        error = {
            "error": {
                "code": "payload_too_large",
                "message": f"the request body {what}; this API reads at most {self.max_bytes} "
                "bytes (RHUMBATRON_API_MAX_BODY_BYTES): send less, or page the request",
                "field": "body",
            }
        }
        payload = json.dumps(error).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(message: Message) -> Receive:
    async def receive() -> Message:
        return message

    return receive


def _replay_body(body: bytes, receive: Receive) -> Receive:
    """The whole body as one message, then whatever the server says next (a disconnect)."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await receive())

    return replayed
