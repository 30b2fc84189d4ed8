"""Sending Events to JetStream: one message, or an atomic batch of one project's rows.

nats-py has no batch API, so :class:`JetStreamSender` writes the atomic-batch headers itself
(``Nats-Batch-Id``, ``Nats-Batch-Sequence``, ``Nats-Batch-Commit``) and asks for the commit's
PubAck. A batch is stored contiguously, all or nothing, with one fsync. JetStream rejects a
whole batch whose message IDs include one it already stored (error 10201): the caller then
re-sends the rows one by one, and the duplicate window drops those already stored.

The acks of nats-py's publishes have no timeout of their own; every wait here has one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rhumbatron.errors import MessagingError, NatsUnavailableError

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = [
    "HEADER_ALLOWANCE_BYTES",
    "BatchRejectedError",
    "EventSender",
    "JetStreamSender",
    "OutgoingMessage",
    "SendRefusedError",
    "StoredMessage",
]


#: Room for the header block this sender writes on a message (``NATS/1.0``, ``Nats-Msg-Id``
#: and the three atomic-batch headers come to about 170 bytes). The server counts headers
#: against ``max_payload``, so a body must leave this much room.
HEADER_ALLOWANCE_BYTES = 256


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One Event on its way: the subject, its ID (``Nats-Msg-Id``) and the JSON body."""

    subject: str
    message_id: str
    data: bytes


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """Where JetStream stored a message; ``duplicate`` when the window dropped a repeat."""

    stream: str
    sequence: int
    duplicate: bool = False


class SendRefusedError(MessagingError):
    """A server answered and refused (or did not ack in time while connected): an attempt."""


class BatchRejectedError(SendRefusedError):
    """JetStream refused an atomic batch as a whole; ``code`` is its error code."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class EventSender(Protocol):
    """The port the publisher sends through (a JetStream connection in production)."""

    @property
    def connected(self) -> bool: ...

    @property
    def max_payload(self) -> int: ...

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage: ...

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]: ...


class JetStreamSender:
    """:class:`EventSender` over one nats-py connection."""

    def __init__(self, nc: NATS, *, ack_timeout_s: float) -> None:
        self._nc = nc
        self._js = nc.jetstream(timeout=ack_timeout_s)
        self._ack_timeout_s = ack_timeout_s

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    @property
    def max_payload(self) -> int:
        return int(self._nc.max_payload)

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        """Publish one message with ``Nats-Msg-Id`` and wait (bounded) for its PubAck."""
        from nats.errors import Error as NatsError

        try:
            ack = await self._js.publish(
                message.subject,
                message.data,
                timeout=self._ack_timeout_s,
                stream=stream,
                headers={"Nats-Msg-Id": message.message_id},
            )
        except NatsError as exc:
            raise self._classify(exc, f"publish of {message.message_id}") from exc
        return StoredMessage(ack.stream, ack.seq, bool(ack.duplicate))

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        """Publish ``messages`` as one atomic batch; return where each was stored."""
        from nats.errors import Error as NatsError

        if len(messages) < 2:
            raise ValueError("an atomic batch needs at least two messages; use send()")
        batch_id = uuid.uuid4().hex
        last = len(messages)
        try:
            for sequence, message in enumerate(messages[:-1], start=1):
                await self._nc.publish(
                    message.subject,
                    message.data,
                    headers=self._batch_headers(message, batch_id, sequence),
                )
            commit = messages[-1]
            headers = self._batch_headers(commit, batch_id, last)
            headers["Nats-Batch-Commit"] = "1"
            reply = await self._nc.request(
                commit.subject, commit.data, timeout=self._ack_timeout_s, headers=headers
            )
        except NatsError as exc:
            raise self._classify(exc, f"atomic batch of {last} messages") from exc
        try:
            answer = json.loads(reply.data)
        except json.JSONDecodeError as exc:
            raise SendRefusedError(f"unreadable batch ack {reply.data[:200]!r}") from exc
        if "error" in answer:
            error = answer["error"]
            raise BatchRejectedError(
                f"JetStream refused the atomic batch: {error.get('description')} "
                f"(code {error.get('err_code')})",
                error.get("err_code"),
            )
        if answer.get("count") != last:
            raise SendRefusedError(f"batch ack counts {answer.get('count')} of {last} messages")
        final = int(answer["seq"])
        # An atomic batch is stored contiguously: the i-th message sits at final - (last - i).
        return [
            StoredMessage(answer["stream"], final - (last - index)) for index in range(1, last + 1)
        ]

    @staticmethod
    def _batch_headers(message: OutgoingMessage, batch_id: str, sequence: int) -> dict[str, str]:
        return {
            "Nats-Msg-Id": message.message_id,
            "Nats-Batch-Id": batch_id,
            "Nats-Batch-Sequence": str(sequence),
        }

    def _classify(self, exc: Exception, what: str) -> MessagingError:
        if not self._nc.is_connected:
            # The connection dropped: nobody refused anything, so no attempt is counted.
            return NatsUnavailableError(f"{what}: NATS connection lost ({type(exc).__name__})")
        return SendRefusedError(f"{what}: {type(exc).__name__}: {exc}".rstrip(": "))
