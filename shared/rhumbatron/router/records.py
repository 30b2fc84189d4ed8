"""Fetched records, decoded at the edge, and what a subscription decided for each.

Every record gets its own outcome (JetStream acknowledges per message):

* ``APPLIED`` / ``DUPLICATE`` — ack.
* ``DEFERRED`` — the 15-call cap left it for later: it is never claimed, and no failure is
  counted (spec: a deferral is not a failure). The process keeps it, unacknowledged, for the
  stream's next run, which it starts at once; when no run follows (the turn ends, a sweep
  ends, the function's time is up) it is nacked without delay.
* ``RETRY`` — something outside the event failed (S3 down, a busy file): claim released,
  nacked after the nack delay, no failure counted, so an outage never dead-letters good
  events.
* ``FAILED`` — the event itself could not be applied (it does not decode, it is not its
  project's, or applying it raised): claim released, failure counted, nacked after the nack
  delay; the 5th failure makes it a dead letter, marks it processed and acks it.

Decoding also checks that an event is its project's (issue #21, ../shared/RELIABILITY.md
B11): it must sit on its project's stream (``stream_index(projectId)`` is the stream it was
read from), and its ``tenantId`` must be the tenant of its project's root actor. Anyone with
publish rights on NATS could put anything on a stream, and the router is the last line: a
forged tenant would otherwise make another tenant's subscriptions react, and an event on
another project's stream would be applied to its project's view out of its project's order.
An event of a project that has no root here is refused too (fail closed): nothing can vouch
for its tenant, and this deployment's outbox never publishes for a project it has not
created. Such a record is refused like one that does not decode — ``FAILED``, counted, and a
``poison_event`` dead letter on the 5th failure — and no subscription sees it (``event`` is
None), so its dead letter is filed under no tenant, least of all the one it claims.

The owners are cached for the process (a project's tenant never changes, roots are never
deleted): after a project's first record, checking one costs one dict lookup. A mismatch
against a cached owner is read again from the root before the record is refused. A root that
cannot be read now (held by a writer past the busy timeout, as on EFS's rollback journal)
is not the event's fault: its record is retried (``retry``), uncounted, and the rest of the
batch goes on.

Records are decoded by the trusted fast decode (``protocol.fast_decode``: the outbox
validated each envelope before publishing it; anything of another shape takes the full
parse and is refused as before), once per process for all the subscriptions that fetch the
same record (:class:`DecodedEvents`).

Every path that hands records to a subscription checks them here: the live consume and the
rewind (:func:`decode_records`), and the archive replay (:func:`checked_record`) — an archive
may hold events archived before this check, and the bucket has writers of its own.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from rhumbatron.core.tracing import Span, span
from rhumbatron.errors import EnvelopeError, RhumbatronError
from rhumbatron.messaging.pull import delivery
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.fast_decode import decode_event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.protocol.tracecontext import TRACEPARENT_HEADER, TraceContext

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = [
    "DecodedEvents",
    "Outcome",
    "ProjectOwners",
    "ProjectTenant",
    "Record",
    "RecordOutcome",
    "checked_record",
    "decode_record",
    "decode_records",
    "event_span",
    "record_traces",
]


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
    """One fetched message: its stream position, its key, and its Event — or, with no
    Event, why not: ``error`` (it does not decode or is not its project's: a failure) or
    ``retry`` (its project's root could not be read now: not the event's fault).

    ``key`` identifies the record for claims, failure counts and dead letters: the event
    ID, or for a record that does not decode the ``Nats-Msg-Id`` it was published with,
    else ``seq:<stream sequence>``.
    """

    msg: Msg
    stream_seq: int
    key: str
    event: Event | None
    error: str | None
    retry: str | None = None

    @property
    def body(self) -> str:
        return (self.msg.data or b"").decode("utf-8", errors="replace")

    @property
    def traceparent(self) -> str | None:
        """The ``traceparent`` header the publisher sent the record with, if any (read when
        asked, not while decoding: only records that cause work need it)."""
        headers = getattr(self.msg, "headers", None)
        return None if not headers else headers.get(TRACEPARENT_HEADER)


def record_traces(records: Iterable[Record]) -> dict[str, str]:
    """``traceparent`` by record key, of the records that carry one."""
    return {r.key: header for r in records if (header := r.traceparent) is not None}


def event_span(name: str, event: Event, traceparent: str | None) -> AbstractContextManager[Span]:
    """The span of the work one Event causes: in its Change's trace when it has a Change
    (else in its header's, else a new one), child of the position in its header."""
    return span(
        f"{name} {event.event_type}",
        parent=TraceContext.parse(traceparent),
        project_id=event.project_id,
        change_id=event.change_id,
    )


#: The port to the project roots: a project's tenant as its root actor says, None when the
#: project has no root here (``Rhumbatron.project_tenant``, wired in by the composition root).
ProjectTenant = Callable[[str], str | None]


@dataclass
class ProjectOwners:
    """The tenant owning each project, and the project's stream, kept for the process.

    A project's tenant never changes and a root is never deleted, so an answer of ``lookup``
    is kept; a project without a root is asked again each time (its root may be created
    later, and such records are rare: they are refused)."""

    lookup: ProjectTenant
    _known: dict[str, tuple[str, int]] = field(default_factory=dict)

    def home(self, project_id: str, *, fresh: bool = False) -> tuple[str, int] | None:
        """``(tenant, stream index)`` of ``project_id``, or None when it has no root here;
        ``fresh`` reads the root again instead of the cache."""
        if not fresh and (known := self._known.get(project_id)) is not None:
            return known
        owner = self.lookup(project_id)
        if owner is None:
            return None
        known = self._known[project_id] = (owner, stream_index(project_id))
        return known


def _refusal(event: Event, read_from: int, owners: ProjectOwners) -> str | None:
    """Why ``event`` read from stream ``read_from`` is not its project's, or None."""
    home = owners.home(event.project_id)
    if home is not None and home == (event.tenant_id, read_from):
        return None  # the hot path: one dict lookup
    stream = stream_index(event.project_id)
    if stream != read_from:
        return (
            f"event {event.event_id} of project {event.project_id} sits on "
            f"{event_stream_name(read_from)}, but project {event.project_id}'s stream is "
            f"{event_stream_name(stream)}; this deployment's outbox did not publish it there"
        )
    if home is not None:
        home = owners.home(event.project_id, fresh=True)  # a cached owner is read again
    if home is None:
        return (
            f"event {event.event_id} claims tenant {event.tenant_id!r}, but project "
            f"{event.project_id} has no project root here, so nothing vouches for its tenant"
        )
    if home[0] != event.tenant_id:
        return (
            f"event {event.event_id} of project {event.project_id} claims tenant "
            f"{event.tenant_id!r}, but {event.project_id} belongs to tenant {home[0]!r}"
        )
    return None


def checked_record(
    msg: Msg,
    stream_seq: int,
    event: Event,
    *,
    read_from: int,
    owners: ProjectOwners,
) -> Record:
    """The record of ``event``, read from stream ``read_from``: with its Event when it is its
    project's, else with no Event and the reason it is refused (``error``) — or, when its
    project's root cannot be read now, the reason to retry it (``retry``)."""
    try:
        refused = _refusal(event, read_from, owners)
    except (RhumbatronError, sqlite3.Error) as exc:
        retry = (
            f"cannot read the root of project {event.project_id} to check the tenant of "
            f"event {event.event_id}: {type(exc).__name__}: {exc}"
        )
        return Record(msg, stream_seq, event.event_id, None, None, retry)
    if refused is not None:
        return Record(msg, stream_seq, event.event_id, None, refused)
    return Record(msg, stream_seq, event.event_id, event, None)


@dataclass
class DecodedEvents:
    """The Events this process decoded lately, by stream and sequence.

    A nudge's projector and causal router, and a sweep's five subscriptions, each fetch the
    same records through their own consumers: with this, a record is decoded (and its
    envelope validated) once per process, not once per subscription. A hit must carry the
    same bytes, so a stream recreated under the same name cannot hand back another Event.
    """

    limit: int = 4_096
    _events: OrderedDict[tuple[int, int], tuple[bytes, Event]] = field(default_factory=OrderedDict)

    def decode(self, stream: int, seq: int, raw: bytes) -> Event:
        """The Event in ``raw`` at ``seq`` of ``stream``; raises
        :class:`~rhumbatron.errors.EnvelopeError` as :meth:`Event.parse` does."""
        key = (stream, seq)
        hit = self._events.get(key)
        if hit is not None and hit[0] == raw:
            return hit[1]
        event = decode_event(raw)
        self._events[key] = (raw, event)
        if len(self._events) > self.limit:
            self._events.popitem(last=False)
        return event


def decode_record(
    msg: Msg, read_from: int, owners: ProjectOwners, decoded: DecodedEvents | None = None
) -> Record:
    """One message of :func:`decode_records`."""
    seq, _ = delivery(msg)
    raw = msg.data or b""
    try:
        event = decode_event(raw) if decoded is None else decoded.decode(read_from, seq, raw)
    except EnvelopeError as exc:
        key = (msg.headers or {}).get("Nats-Msg-Id") or f"seq:{seq}"
        return Record(msg, seq, key, None, f"undecodable record: {exc}")
    return checked_record(msg, seq, event, read_from=read_from, owners=owners)


def decode_records(
    messages: list[Msg],
    read_from: int,
    owners: ProjectOwners,
    decoded: DecodedEvents | None = None,
) -> list[Record]:
    """Decode every message read from stream ``read_from`` (by the trusted fast decode,
    through ``decoded`` when given); one that does not decode, or that is not its project's
    (its stream, its root's tenant, a root at all), becomes a record with an error and no
    event (see :func:`checked_record`)."""
    return [decode_record(msg, read_from, owners, decoded) for msg in messages]
