"""A webhook endpoint on loopback, for tests and the demo: the check of
:class:`~rhumbatron.reactions.webhook_verification.WebhookReceiver` behind a stdlib HTTP
server. 204 for an accepted delivery, 401 with the reason for a rejected one, and both
recorded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rhumbatron.errors import WebhookRejected
from rhumbatron.reactions.webhook_verification import (
    ReceivedWebhook,
    RejectionReason,
    WebhookReceiver,
)

__all__ = ["AcceptedDelivery", "LocalWebhookReceiver", "RejectedDelivery"]

#: A pointer body is a few hundred bytes; the local server refuses anything this large.
_MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class AcceptedDelivery:
    """A request the local receiver verified: what it carried, and that its signature
    verified (``signature_verified``, always True here: nothing unverified is accepted)."""

    webhook: ReceivedWebhook
    headers: Mapping[str, str]
    body: bytes
    path: str
    signature_verified: bool = True

    def json(self) -> dict[str, Any]:
        """The body as JSON (the pointer)."""
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass(frozen=True, slots=True)
class RejectedDelivery:
    """A request the local receiver answered with ``status`` and ``message``."""

    status: int
    reason: RejectionReason | None  # None: refused before any check (too large)
    message: str
    webhook_id: str | None
    path: str


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: LocalWebhookReceiver


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self.server.owner._handle(self)

    def log_message(self, format: str, *args: Any) -> None:
        return None  # the owner records every request; stderr lines would only repeat it

    def answer(self, status: int, text: str = "") -> None:
        data = text.encode("utf-8")
        self.send_response(status)
        if data:
            self.send_header("content-type", "text/plain; charset=utf-8")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)


class LocalWebhookReceiver:
    """A webhook endpoint on loopback: a :class:`ThreadingHTTPServer` on ``host`` (127.0.0.1)
    and a free port that checks every POST with ``receiver`` and records it.

    Answers 204 to an accepted delivery, 401 with the reason to a rejected one, and 500 to
    the next :attr:`fail_next` accepted ones (their IDs are forgotten, so the sender's retry
    is accepted). The lists are copies, safe to read while requests arrive. ``start()``
    before :attr:`url`; ``stop()`` (or use it as a context manager) at the end.
    """

    def __init__(
        self,
        receiver: WebhookReceiver,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        path: str = "/hook",
    ) -> None:
        self.receiver = receiver
        self._host, self._port, self._path = host, port, path
        self._lock = threading.Lock()
        self._accepted: list[AcceptedDelivery] = []
        self._rejected: list[RejectedDelivery] = []
        self._failed: list[AcceptedDelivery] = []
        self._duplicates: list[AcceptedDelivery] = []
        self._fail_next = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> LocalWebhookReceiver:
        """Listen and serve on a thread of its own; returns itself."""
        if self._server is not None:
            return self
        server = _Server((self._host, self._port), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="webhook-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (requests in flight finish first)."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> LocalWebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>/hook``: where a subscription's webhook points."""
        if self._server is None:
            raise RuntimeError("the local webhook receiver is not started: call start() first")
        port = self._server.server_address[1]
        return f"http://{self._host}:{port}{self._path}"

    # -- what it saw -------------------------------------------------------------------
    @property
    def accepted(self) -> list[AcceptedDelivery]:
        """The deliveries answered 204, in arrival order."""
        with self._lock:
            return list(self._accepted)

    @property
    def rejected(self) -> list[RejectedDelivery]:
        """The requests answered 401 (or 413), in arrival order."""
        with self._lock:
            return list(self._rejected)

    @property
    def failed(self) -> list[AcceptedDelivery]:
        """The verified deliveries answered 500 on purpose (:attr:`fail_next`)."""
        with self._lock:
            return list(self._failed)

    @property
    def duplicates(self) -> list[AcceptedDelivery]:
        """The sender's retries of deliveries already accepted: answered 204, not kept."""
        with self._lock:
            return list(self._duplicates)

    @property
    def fail_next(self) -> int:
        """How many of the next verified deliveries are answered 500 (a failing endpoint)."""
        with self._lock:
            return self._fail_next

    @fail_next.setter
    def fail_next(self, count: int) -> None:
        with self._lock:
            self._fail_next = max(0, count)

    # -- one request -------------------------------------------------------------------
    def _handle(self, request: _Handler) -> None:
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY_BYTES:
            given = headers.get("content-length")
            message = f"content-length {given!r} is not 0..{_MAX_BODY_BYTES}: not a pointer body"
            self._record(self._rejected, RejectedDelivery(413, None, message, None, request.path))
            request.answer(413, message)
            return
        body = request.rfile.read(length)
        try:
            webhook = self.receiver.verify(headers, body)
        except WebhookRejected as exc:
            rejection = RejectedDelivery(
                exc.status, RejectionReason(exc.reason), str(exc), exc.webhook_id, request.path
            )
            self._record(self._rejected, rejection)
            request.answer(exc.status, str(exc))
            return
        delivery = AcceptedDelivery(webhook, headers, body, request.path)
        if webhook.duplicate:
            self._record(self._duplicates, delivery)
            request.answer(204)
            return
        with self._lock:
            failing = self._fail_next > 0
            if failing:
                self._fail_next -= 1
                self._failed.append(delivery)
            else:
                self._accepted.append(delivery)
        # Recorded before the answer: when the sender has its answer, the record is there.
        if failing:
            self.receiver.forget(webhook.webhook_id)
            request.answer(500, "failing on purpose (fail_next)")
        else:
            request.answer(204)

    def _record(self, into: list[Any], item: object) -> None:
        with self._lock:
            into.append(item)
