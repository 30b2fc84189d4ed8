"""Sending Events to JetStream: one message, or a batch of one project's rows.

nats-py has no batch API, so :class:`JetStreamSender` speaks both of JetStream's batch
protocols itself:

* **Atomic batch** (``allow_atomic``): the ``Nats-Batch-Id``, ``Nats-Batch-Sequence`` and
  ``Nats-Batch-Commit`` headers, and the commit's PubAck. A batch is stored contiguously, all
  or nothing, with one fsync: the fast choice where the server syncs every write. JetStream
  rejects a whole batch whose message IDs include one it already stored (error 10201): the
  caller then re-sends the rows one by one, and the duplicate window drops those already
  stored.
* **Fast-ingest batch** (``allow_batched``, nats-server 2.14+): every message carries a reply
  subject ``<batch inbox>.<flow>.fail.<n>.<operation>.$FI``; the server stores each as it
  arrives, acks every ``flow`` messages and answers the last with the batch's PubAck. In the
  ``fail`` gap mode a message lost on the way ends the batch: nothing after it is stored, and
  the PubAck counts the stored prefix. The duplicate window drops a repeated message ID
  silently. There is no staging and no commit cost on the server: the fast choice where the
  server syncs periodically.

The acks of nats-py's publishes have no timeout of their own; every wait here has one.

What a failed send means decides whether the publisher counts an attempt: a lost
connection (:class:`NatsUnavailableError`) and a log that cannot take the write right now
(:class:`LogUnavailableError`: no responders, no PubAck in time, a leader election or quorum
loss) count none; only a stream that answers and refuses the message
(:class:`SendRefusedError`) does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rhumbatron.errors import (
    BatchRejectedError,
    LogUnavailableError,
    MessagingError,
    NatsUnavailableError,
    SendRefusedError,
)
from rhumbatron.messaging.frames import FramePublisher

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

__all__ = [
    "HEADER_ALLOWANCE_BYTES",
    "LOG_UNAVAILABLE_CODES",
    "EventSender",
    "FastBatchAck",
    "JetStreamSender",
    "OutgoingMessage",
    "StoredMessage",
    "is_log_unavailable_answer",
]


#: Room for the header block this sender writes on a message (``NATS/1.0``, ``Nats-Msg-Id``,
#: the three atomic-batch headers and a 55-character ``traceparent`` come to about 240
#: bytes). The server counts headers against ``max_payload``, so a body must leave this much
#: room.
HEADER_ALLOWANCE_BYTES = 256


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One Event on its way: the subject, its ID (``Nats-Msg-Id``), the JSON body, and the
    W3C ``traceparent`` of the work that wrote it (sent as a header when there is one)."""

    subject: str
    message_id: str
    data: bytes
    traceparent: str | None = None

    def headers(self) -> dict[str, str]:
        """``Nats-Msg-Id``, and ``traceparent`` when the message has one."""
        if self.traceparent is None:
            return {"Nats-Msg-Id": self.message_id}
        return {"Nats-Msg-Id": self.message_id, "traceparent": self.traceparent}


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """Where JetStream stored a message; ``duplicate`` when the window dropped a repeat."""

    stream: str
    sequence: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FastBatchAck:
    """What JetStream kept of a fast-ingest batch: its first ``stored`` messages (stored, or
    dropped by the duplicate window as repeats), the last of them at ``last_sequence``."""

    stream: str
    stored: int
    last_sequence: int


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

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck: ...


#: JetStream's error codes for "the log cannot take this write now" (a cluster between
#: leaders, or without quorum): not a refusal of the message. 10008: JetStream system
#: temporarily unavailable; 10009: JetStream cluster can not handle request (not the
#: leader); 10118: stream is offline; 10158: duplicate message ID is in process (its first
#: publish is still being proposed). Any 503 answer means the same.
LOG_UNAVAILABLE_CODES = frozenset({10008, 10009, 10118, 10158})


def is_log_unavailable_answer(error: dict[str, Any]) -> bool:
    """Whether a JetStream error answer (``{"code", "err_code", "description"}``) says the
    log cannot take a write now, rather than refusing the message."""
    return error.get("code") == 503 or error.get("err_code") in LOG_UNAVAILABLE_CODES


#: The header that makes JetStream refuse a message unless ``stream`` is the stream that
#: stores its subject (nats-py's ``publish(stream=...)`` sets it on a single send): a stray
#: stream binding an event stream's subject must never store our events. A batch is all on
#: one subject, so its first message carries it: refused there, the batch is refused.
_EXPECTED_STREAM = "Nats-Expected-Stream"

#: Messages between the server's flow acks that a fast batch asks for (the server may ask
#: for fewer), and how many flow windows may be unacknowledged before the sender waits.
FAST_BATCH_FLOW = 100
FAST_BATCH_WINDOWS = 2
_FAST_START, _FAST_APPEND, _FAST_COMMIT = 0, 1, 2


@dataclass(slots=True)
class _FastBatch:
    """One fast batch under way: its inbox's answers, when it gives up waiting, what to call
    it in an error, and the flow: the acknowledged mark and the messages per ack."""

    replies: asyncio.Queue[Msg]
    deadline: float
    what: str
    acked: int
    flow: int


class JetStreamSender:
    """:class:`EventSender` over one nats-py connection."""

    def __init__(self, nc: NATS, *, ack_timeout_s: float) -> None:
        self._nc = nc
        self._frames = FramePublisher(nc)
        self._js = nc.jetstream()  # each publish is given its own ack timeout
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
                headers=message.headers(),
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
                headers = self._batch_headers(message, batch_id, sequence)
                if sequence == 1:
                    headers[_EXPECTED_STREAM] = stream
                await self._frames.publish(message.subject, message.data, headers=headers)
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
            raise self._batch_refused(answer["error"], "atomic batch")
        if answer.get("count") != last:
            raise SendRefusedError(f"batch ack counts {answer.get('count')} of {last} messages")
        final = int(answer["seq"])
        # An atomic batch is stored contiguously: the i-th message sits at final - (last - i).
        return [
            StoredMessage(answer["stream"], final - (last - index)) for index in range(1, last + 1)
        ]

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        """Publish ``messages`` as one fast-ingest batch; return how many of them JetStream
        kept, in order from the first.

        A message lost on the way (or refused) ends the batch there: the messages after it
        are not stored, and the caller sends them again. Raises :class:`BatchRejectedError`
        when the server refuses the batch itself (the stream does not allow fast batches,
        too many batches in flight), :class:`SendRefusedError` when its PubAck does not come
        in time, and :class:`NatsUnavailableError` when the connection is lost.
        """
        from nats.errors import Error as NatsError

        if len(messages) < 2:
            raise ValueError("a fast batch needs at least two messages; use send()")
        # The batch ID is the inbox's second token; the server reads the reply from the right.
        inbox = self._nc.new_inbox()
        replies: asyncio.Queue[Msg] = asyncio.Queue()

        async def on_reply(msg: Msg) -> None:
            replies.put_nowait(msg)

        what = f"fast batch of {len(messages)} messages"
        deadline = asyncio.get_running_loop().time() + self._ack_timeout_s
        state = _FastBatch(replies, deadline, what, acked=0, flow=FAST_BATCH_FLOW)
        try:
            subscription = await self._nc.subscribe(f"{inbox}.>", cb=on_reply)
            try:
                if (final := await self._fast_publish(stream, messages, inbox, state)) is not None:
                    return final
                while True:
                    if (final := await self._fast_answer(state)) is not None:
                        return final
            finally:
                if self._nc.is_connected:
                    await subscription.unsubscribe()
        except NatsError as exc:
            raise self._classify(exc, what) from exc

    async def _fast_publish(
        self, stream: str, messages: Sequence[OutgoingMessage], inbox: str, state: _FastBatch
    ) -> FastBatchAck | None:
        """Publish the batch's messages, each with its reply subject, keeping at most
        ``FAST_BATCH_WINDOWS`` flow windows unacknowledged; the batch's PubAck when it came
        before the last message was sent (None: wait for it). The first names ``stream``
        (see :data:`_EXPECTED_STREAM`)."""
        for number, message in enumerate(messages, start=1):
            while number > 1 and state.acked + state.flow * FAST_BATCH_WINDOWS <= number:
                # The server asked for fewer messages per ack than we have in flight.
                if (final := await self._fast_answer(state)) is not None:
                    return final
            operation = (
                _FAST_START
                if number == 1
                else _FAST_COMMIT
                if number == len(messages)
                else _FAST_APPEND
            )
            headers = message.headers()
            if number == 1:
                headers[_EXPECTED_STREAM] = stream
            await self._frames.publish(
                message.subject,
                message.data,
                reply=f"{inbox}.{FAST_BATCH_FLOW}.fail.{number}.{operation}.$FI",
                headers=headers,
            )
            # The first answer says the batch exists (or why it cannot).
            if number == 1 and (final := await self._fast_answer(state)) is not None:
                return final
        return None

    async def _fast_answer(self, state: _FastBatch) -> FastBatchAck | None:
        """The next answer of the batch: its PubAck, or None after applying a flow event."""
        answer = await self._next_reply(state.replies, state.deadline, state.what)
        if (final := self._fast_final(answer, state.what)) is not None:
            return final
        state.acked, state.flow = self._fast_flow(answer, state.acked, state.flow)
        return None

    async def _next_reply(
        self, replies: asyncio.Queue[Msg], deadline: float, what: str
    ) -> dict[str, Any]:
        """The next JSON answer on the batch's inbox; a status without a body (no stream
        took a message: its subject is bound to none) is skipped, as the gap that follows
        it ends the batch."""
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if not self._nc.is_connected:
                raise NatsUnavailableError(f"{what}: NATS connection lost")
            try:
                msg = await asyncio.wait_for(replies.get(), max(left, 0.0))
            except TimeoutError:
                raise LogUnavailableError(
                    f"{what}: no PubAck within {self._ack_timeout_s:g} s"
                ) from None
            if not msg.data:
                continue
            try:
                answer = json.loads(msg.data)
            except json.JSONDecodeError as exc:
                raise SendRefusedError(f"{what}: unreadable answer {msg.data[:200]!r}") from exc
            if isinstance(answer, dict):
                return answer

    @staticmethod
    def _fast_final(answer: dict[str, Any], what: str) -> FastBatchAck | None:
        """The batch's PubAck, if ``answer`` is it (None: a flow event); raises for a batch
        the server refused whole."""
        if "type" in answer:
            return None
        if "error" in answer:
            raise JetStreamSender._batch_refused(answer["error"], what)
        try:
            return FastBatchAck(str(answer["stream"]), int(answer["count"]), int(answer["seq"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SendRefusedError(f"{what}: unexpected PubAck {answer!r}") from exc

    @staticmethod
    def _batch_refused(error: dict[str, Any], what: str) -> MessagingError:
        """The error for a batch JetStream did not take whole, with its description and
        code: refused, or the log could not take it now."""
        said = f"{error.get('description')} (code {error.get('err_code')})"
        if is_log_unavailable_answer(error):
            return LogUnavailableError(f"{what}: the log cannot take it now: {said}")
        return BatchRejectedError(f"JetStream refused the {what}: {said}", error.get("err_code"))

    @staticmethod
    def _fast_flow(answer: dict[str, Any], acked: int, flow: int) -> tuple[int, int]:
        """Apply a flow event: an ack moves the acknowledged mark and may set a new flow; a
        gap or a message's error is only news (the PubAck that follows counts what was kept)."""
        if answer.get("type") == "ack":
            return max(acked, int(answer.get("seq", acked))), int(answer.get("msgs") or flow)
        return acked, flow

    @staticmethod
    def _batch_headers(message: OutgoingMessage, batch_id: str, sequence: int) -> dict[str, str]:
        return {
            **message.headers(),
            "Nats-Batch-Id": batch_id,
            "Nats-Batch-Sequence": str(sequence),
        }

    def _classify(self, exc: Exception, what: str) -> MessagingError:
        """What a nats-py error on a send means: the connection is gone, the log cannot take
        the write now, or the stream refused it (the only one that counts an attempt)."""
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeoutError
        from nats.js.errors import APIError, NoStreamResponseError

        if not self._nc.is_connected:
            # The connection dropped: nobody refused anything, so no attempt is counted.
            return NatsUnavailableError(f"{what}: NATS connection lost ({type(exc).__name__})")
        if isinstance(exc, NoRespondersError | NoStreamResponseError):
            return LogUnavailableError(f"{what}: no responders (no stream leader answers)")
        if isinstance(exc, NatsTimeoutError):
            return LogUnavailableError(f"{what}: no PubAck within {self._ack_timeout_s:g} s")
        if isinstance(exc, APIError) and is_log_unavailable_answer(
            {"code": exc.code, "err_code": exc.err_code}
        ):
            return LogUnavailableError(
                f"{what}: the log cannot take it now: {exc.description} (code {exc.err_code})"
            )
        return SendRefusedError(f"{what}: {type(exc).__name__}: {exc}".rstrip(": "))
