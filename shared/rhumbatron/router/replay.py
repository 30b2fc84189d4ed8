"""Replay: re-drive one subscription's effects from a point of an event stream, or from a time
range of the S3 archive, through the subscription's own ``(consumer, event_id)`` claims.

"Replay = rewinding a consumer's cursor" (spec): the claims make a rewind harmless, since an
event whose effect already happened is a duplicate and only the events never applied take
effect. Both replays feed the records to the subscription's record handler — the very
``handle`` the live router calls on a fetched batch — so they share its claims, its
transactions and its leases; nothing here claims anything itself.

**Why a replay reader and not the durable cursor.** JetStream cannot move a durable
consumer's cursor in place: the only way to move it is to delete the consumer and create it
again with a start sequence or time. That was not the choice here, because:

* the live cursor would be disturbed: its pending and nacked messages (with their delays)
  would be forgotten, and a warm router that pulls while the consumer is gone recreates it
  from the stream's start (``EventLogClient.fetch``), racing the operator's recreation;
* a "rewind" to a point *after* the live cursor would skip the events in between for good;
* a dry run must read without moving anything.

So a rewind creates a separate, short-lived pull consumer named ``replay-<subscription>-<id>``
on the stream (``BY_START_SEQUENCE`` / ``BY_START_TIME``, an inactivity threshold so a crashed
replay leaves nothing behind), reads it up to the stream's last sequence at the start of the
replay, hands each batch to the subscription's handler, and deletes the consumer. The live
cursor keeps consuming meanwhile; the claims decide, per event, which of the two applies it,
and an event either meets is applied once. The replay runs in the caller's process (CLI or
API), against the same state directory and product database as the router.

**Dry run.** The same read, but no handler runs: each event's claim is read (never taken) —
no claim, or a lease whose holder died, *would apply*; a ``done`` claim is *already applied*; a
lease another run still holds is *in flight*. A dry run opens no file that does not exist.

**From the archive.** :func:`replay_archive` reads the archived events of ``[start, end)``
(per stream, in stream order, each once) and hands them to the handler the same way. An
archived event carries no stream sequence: it is applied with sequence 0, so into a view that
already holds later events it adds its feed row but moves no row back (it cannot know that
it is newer); into a fresh state directory the events come in stream order and the last
one wins, as on the live path. The audit-archiver is refused as a target (the archive is its
own output). Replaying the causal-router from an old range sends again the commands of the
events it finds unclaimed; their IDs are stable, but JetStream drops a repeat only within
its duplicate window — dry-run first.

A replay never writes dead letters or failure counts: those belong to the live cursor. A
record that fails is reported (with its reason) and left to the live path. Both replays check
every record as the live router does (``records``, issue #21): one that is not its project's
(another project's stream, a tenant not its root's, no root here) is reported failed and no
handler sees it — an archive may hold events archived before that check.

This module holds the report, the entry points and the archive replay; the stream rewind's
reader is :mod:`~rhumbatron.router.replay_stream`, one batch (applied, or classified in a dry
run) :mod:`~rhumbatron.router.replay_batches`, and the argument checks
:mod:`~rhumbatron.router.replay_arguments`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, cast

from rhumbatron.core.progress import ProgressCallback
from rhumbatron.errors import ReplayError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name, event_stream_subject
from rhumbatron.router.event_router import EventRouter
from rhumbatron.router.records import ProjectOwners, Record, checked_record
from rhumbatron.router.replay_arguments import (
    check_aware,
    check_stream,
    parse_subscription,
    utc_day_of,
)
from rhumbatron.router.replay_batches import replay_batch
from rhumbatron.router.replay_stream import nats_errors, read_replay_consumer

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS


__all__ = [
    "ReplayHost",
    "ReplayReport",
    "ReplaySource",
    "replay_archive",
    "rewind",
    "run_replay",
]


class ReplayHost(Protocol):
    """What a replay runs on when it is not given the router itself: the process's runtime,
    which builds its event router on first use."""

    def router(self) -> EventRouter: ...


#: At most this many failure reasons are kept in a report (the counts are always whole).
MAX_REPORTED_ERRORS = 20
#: An archive object is filed under its first Event's day; a batch that straddles midnight
#: holds events of the next day too. Listing one day before ``start`` finds them.
_ARCHIVE_DAYS_BEFORE = 1


class ReplaySource(StrEnum):
    """Where a replay reads its events: an event stream (a rewind) or the S3 archive."""

    STREAM = "stream"
    ARCHIVE = "archive"


@dataclass
class ReplayReport:
    """What one replay found and did, for one subscription.

    ``scanned`` counts the records read in the range. In a real run every scanned record
    ends in one of ``applied`` (took effect now), ``already_applied`` (its claim was done:
    a duplicate), ``retried`` (not applied now: another run holds its lease, or a file or S3
    was busy — the live cursor or the next replay applies it) or ``failed`` (could not be
    applied; ``errors`` says why). A dry run fills ``would_apply``, ``already_applied`` and
    ``in_flight`` (a lease another run holds) instead, and changes nothing.

    ``first_seq`` / ``last_seq`` are the stream positions a rewind covered (``last_seq`` is
    the stream's end when the replay started); ``start`` / ``end`` the time range asked.
    """

    source: ReplaySource
    subscription: Subscription
    stream_index: int | None
    dry_run: bool
    scanned: int = 0
    applied: int = 0
    would_apply: int = 0
    already_applied: int = 0
    in_flight: int = 0
    retried: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    first_seq: int | None = None
    last_seq: int | None = None
    start: datetime | None = None
    end: datetime | None = None

    def _note(self, key: str, reason: str) -> None:
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(f"{key}: {reason}")

    def _failed(self, key: str, reason: str) -> None:
        self.failed += 1
        self._note(key, reason)

    def _retried(self, key: str, reason: str) -> None:
        self.retried += 1
        self._note(key, reason)


# -- entry points ------------------------------------------------------------------------------


async def rewind(
    router_or_app: EventRouter | ReplayHost,
    *,
    stream_index: int,
    subscription: Subscription | str,
    to_seq: int | None = None,
    to_time: datetime | None = None,
    dry_run: bool,
    progress: ProgressCallback | None = None,
) -> ReplayReport:
    """Replay ``subscription`` on stream ``stream_index`` from sequence ``to_seq`` (or from the
    first event stored at or after ``to_time``) to the stream's end; ``progress`` hears the
    stream positions read of those to read, after each batch.

    Give exactly one of ``to_seq`` and ``to_time`` (timezone-aware). The live durable
    consumer is not touched (see the module docstring). Raises :class:`ReplayError` for a
    bad argument, :class:`NatsUnavailableError` when NATS does not answer, and
    :class:`MessagingError` when JetStream refuses (a stream that does not exist).
    """
    router = _router_of(router_or_app)
    subscription = parse_subscription(subscription)
    check_stream(stream_index)
    if (to_seq is None) == (to_time is None):
        raise ReplayError(
            f"a rewind needs exactly one start point, got to_seq={to_seq!r} and "
            f"to_time={to_time!r}; pass a stream sequence (to_seq >= 1) or a time (to_time)"
        )
    if to_seq is not None and to_seq < 1:
        raise ReplayError(f"to_seq={to_seq} is not a stream sequence; sequences start at 1")
    if to_time is not None:
        check_aware("to_time", to_time)
    report = ReplayReport(
        ReplaySource.STREAM, subscription, stream_index, dry_run, first_seq=to_seq, start=to_time
    )
    stream = event_stream_name(stream_index)
    with nats_errors(stream):
        nc = await router.connect()
        js = nc.jetstream()
        state = (await js.stream_info(stream)).state
        report.last_seq = state.last_seq
        if state.messages == 0 or (to_seq is not None and to_seq > state.last_seq):
            return report  # nothing stored from there on
        await read_replay_consumer(
            router, nc, stream_index, subscription, report, progress=progress
        )
    return report


async def replay_archive(
    router_or_app: EventRouter | ReplayHost,
    *,
    stream_index: int | None,
    subscription: Subscription | str,
    start: datetime,
    end: datetime,
    dry_run: bool,
    progress: ProgressCallback | None = None,
) -> ReplayReport:
    """Replay the archived events of ``[start, end)`` (by Event ``timestamp``) of stream
    ``stream_index`` — or of every stream for None — into ``subscription``; ``progress``
    hears the records scanned after each batch (the whole is not known ahead).

    Raises :class:`ReplayError` for a bad argument (naive times, an empty range, the
    audit-archiver as target), and :class:`~rhumbatron.archive.ArchiveError` (its subclass
    ``ArchiveUnavailableError`` when S3 does not answer) when the archive cannot be read.
    """
    from rhumbatron.archive import ArchiveReader

    router = _router_of(router_or_app)
    subscription = _archive_target(subscription, stream_index, start, end)
    report = ReplayReport(
        ReplaySource.ARCHIVE, subscription, stream_index, dry_run, start=start, end=end
    )
    reader = ArchiveReader(router.s3(), router.settings.evidence_bucket)
    first_day = utc_day_of(start, "start")
    since = (
        first_day - timedelta(days=_ARCHIVE_DAYS_BEFORE)
        if first_day > date.min + timedelta(days=_ARCHIVE_DAYS_BEFORE)
        else date.min
    )
    until = utc_day_of(end, "end")
    streams = range(EVENT_STREAM_COUNT) if stream_index is None else (stream_index,)
    for index in streams:
        await _replay_archived_stream(
            router,
            reader.iter_events(index, since, until),
            index,
            subscription,
            report,
            start=start,
            end=end,
            progress=progress,
        )
    return report


def _archive_target(
    subscription: Subscription | str, stream_index: int | None, start: datetime, end: datetime
) -> Subscription:
    """The subscription an archive replay feeds, after checking it and the range."""
    subscription = parse_subscription(subscription)
    if subscription is Subscription.AUDIT_ARCHIVER:
        raise ReplayError(
            "the archive is the audit-archiver's own output: replay it into "
            f"{', '.join(s.value for s in Subscription if s is not Subscription.AUDIT_ARCHIVER)}"
        )
    if stream_index is not None:
        check_stream(stream_index)
    check_aware("start", start)
    check_aware("end", end)
    # Archive keys are filed by UTC day; a day near date.min cannot step back a whole day.
    utc_day_of(start, "start")
    utc_day_of(end, "end")
    if not start < end:
        raise ReplayError(
            f"start {start.isoformat()} is not before end {end.isoformat()}; the range is "
            "[start, end): pass an end after the start"
        )
    return subscription


async def _replay_archived_stream(
    router: EventRouter,
    events: Iterator[Event],
    index: int,
    subscription: Subscription,
    report: ReplayReport,
    *,
    start: datetime,
    end: datetime,
    progress: ProgressCallback | None = None,
) -> None:
    """Replay one stream's archived events of ``[start, end)``, a batch at a time."""
    batch = router.settings.router_fetch_max_records
    while True:
        # boto3 is synchronous: each batch of objects is read on a worker thread.
        chunk = await asyncio.to_thread(_take, events, batch)
        if not chunk:
            break
        records = [
            _archived_record(index, e, router.project_owners)
            for e in chunk
            if start <= e.timestamp < end
        ]
        if records:
            await replay_batch(router, index, subscription, records, report)
            if progress is not None:
                progress(report.scanned, None)


async def run_replay(
    app: ReplayHost,
    *,
    source: ReplaySource | str,
    subscription: Subscription | str,
    dry_run: bool,
    stream: int | None = None,
    to_seq: int | None = None,
    to_time: datetime | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    progress: ProgressCallback | None = None,
) -> ReplayReport:
    """One replay as the CLI and the API ask for it: ``source`` ``stream`` rewinds
    (``stream``, and ``to_seq`` or ``to_time``), ``archive`` reads the archive (``start``,
    ``end``, and ``stream`` or None for every stream); ``progress`` hears how far it got.
    Raises :class:`ReplayError` when an
    option does not belong to the source or is missing."""
    try:
        kind = ReplaySource(source)
    except ValueError:
        raise ReplayError(
            f"replay source {source!r} is unknown; pass one of "
            f"{', '.join(s.value for s in ReplaySource)}"
        ) from None
    if kind is ReplaySource.STREAM:
        if start is not None or end is not None:
            raise ReplayError(
                "start and end select an archive range; a stream replay takes to_seq or to_time"
            )
        if stream is None:
            raise ReplayError(
                f"a stream replay needs the stream (0..{EVENT_STREAM_COUNT - 1}) to rewind"
            )
        return await rewind(
            app,
            stream_index=stream,
            subscription=subscription,
            to_seq=to_seq,
            to_time=to_time,
            dry_run=dry_run,
            progress=progress,
        )
    if to_seq is not None or to_time is not None:
        raise ReplayError(
            "to_seq and to_time rewind a stream; an archive replay takes start and end"
        )
    if start is None or end is None:
        raise ReplayError(
            f"an archive replay needs start and end, got start={start!r}, end={end!r}"
        )
    return await replay_archive(
        app,
        stream_index=stream,
        subscription=subscription,
        start=start,
        end=end,
        dry_run=dry_run,
        progress=progress,
    )


# -- reading the archive -----------------------------------------------------------------------


def _take(events: Iterator[Event], count: int) -> list[Event]:
    return list(itertools.islice(events, count))


def _archived_record(stream_index: int, event: Event, owners: ProjectOwners) -> Record:
    """A record for an archived event, shaped as a fetched one for the handlers, and checked
    as a fetched one is (its project's stream and tenant): the archive may hold events
    archived before that check, and the bucket has writers of its own.

    Handlers read a record's event, key and sequence, never its message (only the live
    router acks); the message carries the body, so a report can show it.
    """
    from nats.aio.msg import Msg

    msg = Msg(
        _client=cast("NATS", None),  # never acked: it was not delivered
        subject=event_stream_subject(stream_index),
        data=event.to_json(),
        headers={"Nats-Msg-Id": event.event_id},
    )
    return checked_record(msg, 0, event, read_from=stream_index, owners=owners)


# -- arguments ---------------------------------------------------------------------------------


def _router_of(target: EventRouter | ReplayHost) -> EventRouter:
    return target if isinstance(target, EventRouter) else target.router()
