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

Decoding also checks that an event is its project's (issue #21, ../shared/RELIABILITY.md
B11): it must sit on its project's stream, and its ``tenantId`` must be the tenant of its
project's root actor. Anyone with publish rights on NATS could put anything on a stream, and
the router is the last line: a forged tenant would otherwise make another tenant's
subscriptions react, and an event on another project's stream would be applied out of its
project's order. Such a record is refused like one that does not decode: no subscription sees
it (``event`` is None), and its dead letter is filed under no tenant.

A project with no root here cannot have its tenant checked. The reactions act for a tenant,
so they refuse such an event (``require_owner``); the projector, the causal router, the
archiver and analytics apply it as before (a view, a command or an archive object of that
project, which no tenant owns here), so a view or an archive rebuilt before the actor files
are restored still fills.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from rhumbatron.errors import EnvelopeError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, stream_index

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ["Outcome", "ProjectOwners", "Record", "RecordOutcome", "decode_records"]


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


@dataclass
class ProjectOwners:
    """The tenant owning each project, as its root actor says (``lookup``: None when the
    project has no root here). A project's tenant never changes, so an answer is kept for the
    process; an unknown project is asked again each time (its root may be created later)."""

    lookup: Callable[[str], str | None]
    _known: dict[str, str] = field(default_factory=dict)

    def owner(self, project_id: str, *, fresh: bool = False) -> str | None:
        if not fresh and (known := self._known.get(project_id)) is not None:
            return known
        owner = self.lookup(project_id)
        if owner is not None:
            self._known[project_id] = owner
        return owner


def _refusal(
    event: Event, read_from: int, owners: ProjectOwners, require_owner: bool
) -> str | None:
    """Why ``event`` read from stream ``read_from`` is not its project's, or None."""
    home = stream_index(event.project_id)
    if home != read_from:
        return (
            f"event {event.event_id} of project {event.project_id!r} sits on "
            f"{event_stream_name(read_from)}, but the project's stream is "
            f"{event_stream_name(home)}; it was not published by this deployment's outbox"
        )
    if owners.owner(event.project_id) == event.tenant_id:
        return None
    owner = owners.owner(event.project_id, fresh=True)  # a cached owner is checked again
    if owner is None and not require_owner:
        return None
    if owner is None:
        return (
            f"event {event.event_id} names project {event.project_id!r}, which has no project "
            f"root here, so its tenant {event.tenant_id!r} cannot be verified for a reaction"
        )
    if owner != event.tenant_id:
        return (
            f"event {event.event_id} of project {event.project_id!r} claims tenant "
            f"{event.tenant_id!r}, but the project belongs to tenant {owner!r}"
        )
    return None


def _decode(msg: Msg, read_from: int, owners: ProjectOwners, require_owner: bool) -> Record:
    metadata = msg.metadata
    seq = metadata.sequence.stream
    header_id = (msg.headers or {}).get("Nats-Msg-Id")
    try:
        event = Event.parse(msg.data or b"")
    except EnvelopeError as exc:
        key = header_id or f"seq:{seq}"
        return Record(msg, seq, metadata.num_delivered, key, None, f"undecodable record: {exc}")
    refused = _refusal(event, read_from, owners, require_owner)
    if refused is not None:
        return Record(msg, seq, metadata.num_delivered, event.event_id, None, refused)
    return Record(msg, seq, metadata.num_delivered, event.event_id, event, None)


def decode_records(
    messages: list[Msg], read_from: int, owners: ProjectOwners, *, require_owner: bool
) -> list[Record]:
    """Decode every message read from stream ``read_from``; one that does not decode, or
    that is not its project's (its stream, its root's tenant; with ``require_owner`` a root
    at all), becomes a record with an error."""
    return [_decode(msg, read_from, owners, require_owner) for msg in messages]
