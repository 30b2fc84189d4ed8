"""Fetched records, decoded at the edge, and what a subscription decided for each.

Every record gets its own outcome (JetStream acknowledges per message):

* ``APPLIED`` / ``DUPLICATE`` — ack.
* ``DEFERRED`` — the 15-call cap left it for later: its claim is released and it is nacked
  without delay; no failure is counted (spec: a deferral is not a failure).
* ``RETRY`` — something outside the event failed (S3 down, a busy file): claim released,
  nacked after the nack delay, no failure counted, so an outage never dead-letters good
  events.
* ``FAILED`` — the event itself could not be applied (it does not decode, or applying it
  raised): claim released, failure counted, nacked after the nack delay; the 5th failure
  makes it a dead letter, marks it processed and acks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from rhumbatron.errors import EnvelopeError
from rhumbatron.protocol.envelopes import Event

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ["Outcome", "Record", "RecordOutcome", "decode_records"]


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    DEFERRED = "deferred"
    RETRY = "retry"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    outcome: Outcome
    reason: str = ""

    @classmethod
    def failed(cls, reason: str) -> RecordOutcome:
        return cls(Outcome.FAILED, reason)

    @classmethod
    def retry(cls, reason: str) -> RecordOutcome:
        return cls(Outcome.RETRY, reason)


APPLIED = RecordOutcome(Outcome.APPLIED)
DUPLICATE = RecordOutcome(Outcome.DUPLICATE)
DEFERRED = RecordOutcome(Outcome.DEFERRED)


@dataclass(frozen=True, slots=True)
class Record:
    """One fetched message: its stream position, its key, and its Event or decode error.

    ``key`` identifies the record for claims, failure counts and dead letters: the event
    ID, or for a record that does not decode the ``Nats-Msg-Id`` it was published with,
    else ``seq:<stream sequence>``.
    """

    msg: Msg
    stream_seq: int
    delivered: int
    key: str
    event: Event | None
    error: str | None

    @property
    def body(self) -> str:
        return (self.msg.data or b"").decode("utf-8", errors="replace")


def _decode(msg: Msg) -> Record:
    metadata = msg.metadata
    seq = metadata.sequence.stream
    header_id = (msg.headers or {}).get("Nats-Msg-Id")
    try:
        event = Event.parse(msg.data or b"")
    except EnvelopeError as exc:
        key = header_id or f"seq:{seq}"
        return Record(msg, seq, metadata.num_delivered, key, None, f"undecodable record: {exc}")
    return Record(msg, seq, metadata.num_delivered, event.event_id, event, None)


def decode_records(messages: list[Msg]) -> list[Record]:
    """Decode every message; one that does not decode becomes a record with an error."""
    return [_decode(msg) for msg in messages]
