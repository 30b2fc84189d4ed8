"""Test doubles of the :class:`~rhumbatron.messaging.sender.EventSender` port, kept in the
development package (never in the Lambda layer) so every test suite and the benchmarks use
the same ones.

They stand in for JetStream only where a test is about the publisher's own decisions (what
counts as an attempt, the backoff schedule); tests about delivery use a real nats-server,
often through a :class:`SenderWrapper` that injects one fault into the real sender.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rhumbatron.errors import SendRefusedError
from rhumbatron.messaging.sender import EventSender, FastBatchAck, OutgoingMessage, StoredMessage

__all__ = ["MemorySender", "RefuseFirstRowOnce", "RefusingSender", "SenderWrapper"]


@dataclass
class MemorySender:
    """Stores every message in memory, as one stream would: sequence = position in ``sent``."""

    connected: bool = True
    max_payload: int = 1024 * 1024
    sent: list[OutgoingMessage] = field(default_factory=list)

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        self.sent.append(message)
        return StoredMessage(stream, len(self.sent))

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        return [await self.send(stream, message) for message in messages]

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        stored = await self.send_batch(stream, messages)
        return FastBatchAck(stream, len(stored), stored[-1].sequence)


@dataclass
class RefusingSender(MemorySender):
    """A server that answers and refuses every send: each call is one counted attempt.

    ``attempted`` lists the message ID of each refused send, and ``"batch"`` for each
    refused batch (atomic or fast).
    """

    reason: str = "refused by the test server"
    attempted: list[str] = field(default_factory=list)

    @property
    def refusals(self) -> int:
        return len(self.attempted)

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        self.attempted.append(message.message_id)
        raise SendRefusedError(f"{message.message_id}: {self.reason}")

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        self.attempted.append("batch")
        raise SendRefusedError(f"batch of {len(messages)}: {self.reason}")

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        self.attempted.append("batch")
        raise SendRefusedError(f"fast batch of {len(messages)}: {self.reason}")


class SenderWrapper:
    """Passes everything to another sender; subclasses override what they change."""

    def __init__(self, inner: EventSender) -> None:
        self.inner = inner

    @property
    def connected(self) -> bool:
        return self.inner.connected

    @property
    def max_payload(self) -> int:
        return self.inner.max_payload

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        return await self.inner.send(stream, message)

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        return await self.inner.send_batch(stream, messages)

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        return await self.inner.send_fast_batch(stream, messages)


class RefuseFirstRowOnce(SenderWrapper):
    """The server refuses the first row once (and any batch while that refusal is pending)."""

    def __init__(self, inner: EventSender) -> None:
        super().__init__(inner)
        self.refusals_left = 1

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        if self.refusals_left:
            self.refusals_left -= 1
            raise SendRefusedError(f"{message.message_id}: refused once by the test server")
        return await self.inner.send(stream, message)

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        if self.refusals_left:
            raise SendRefusedError("batch refused by the test server")
        return await self.inner.send_batch(stream, messages)

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        if self.refusals_left:
            raise SendRefusedError("fast batch refused by the test server")
        return await self.inner.send_fast_batch(stream, messages)
