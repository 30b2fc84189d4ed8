"""``OutboxPublisher.publish_due``: move an actor's due outbox rows onto the event streams.

Per call and per project, at most 100 due rows are sent, in outbox order, to
``EVENTS_NN`` / ``events.NN`` (NN = ``fnv1a32(projectId) mod 8``) with the Event ID as
``Nats-Msg-Id`` and the row's ``traceparent``, if any, beside it. How order survives retries:

* only a *prefix* of a project's rows is ever sent: a row waiting out its backoff blocks the
  rows behind it (see :func:`~rhumbatron.actors.outbox.due_rows`);
* a prefix of two or more rows goes as one batch of the kind :func:`publish_batch_mode`
  picks: a JetStream *atomic* batch (stored contiguously, all or nothing, one fsync — where
  the server syncs every write) or a *fast-ingest* batch (stored in order; a row lost on the
  way ends the batch there, so no later row lands while an earlier one is missing — where
  the server syncs periodically and an atomic batch's staging costs more than it saves);
* what a batch did not store (all of it when refused or its ack is lost; the rows after
  the gap of a fast batch) is sent one at a time, each waiting for its PubAck; the duplicate
  window drops rows already stored, and the first row that fails stops the project for this
  call.

Attempts: only a send the stream answered and refused counts. With no server reachable
nothing is counted and rows stay ``pending``, so a long outage never turns events into
``failed`` rows. A log that is reachable but cannot take the write now (no responders, no
PubAck in time, a leader election or a quorum loss: :class:`LogUnavailableError`) counts
nothing either: the row is sent again every ``publish_unavailable_retry_s`` (at most a
second) for up to ``publish_unavailable_wait_s``, so a leader loss stalls writes for about
the re-election time, and a longer outage leaves the rows ``pending`` for the next fire.
"""

from __future__ import annotations

import functools
import random
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rhumbatron.actors.actor import Actor
from rhumbatron.actors.alarms import AlarmGuard, FireDecision, alarm_due_at, replace_alarm
from rhumbatron.actors.due_index import NEVER_DUE_S
from rhumbatron.actors.outbox import (
    OutboxRow,
    RowState,
    backoff_s,
    due_rows,
    mark_attempt_failed,
    mark_failed,
    mark_published,
    next_due_at,
    prune_published,
    published_envelopes,
    record_stream_seqs,
    requeue_failed,
)
from rhumbatron.core.clock import Clock, SystemClock
from rhumbatron.core.faults import crash_point
from rhumbatron.core.settings import Settings
from rhumbatron.core.tracing import record_hops
from rhumbatron.errors import LogUnavailableError, NatsUnavailableError, SendRefusedError
from rhumbatron.messaging.nudge import NoNudge, RouterNudge
from rhumbatron.messaging.sender import (
    HEADER_ALLOWANCE_BYTES,
    EventSender,
    OutgoingMessage,
    StoredMessage,
)
from rhumbatron.protocol.ids import (
    EVENT_STREAM_COUNT,
    event_stream_name,
    event_stream_subject,
    stream_index,
)

__all__ = [
    "OutboxPublisher",
    "PublishReport",
    "ScanReport",
    "publish_batch_mode",
    "requeue_failed_rows",
]


_DAY_S = 86_400.0


@dataclass
class PublishReport:
    """What one ``publish_due`` (or alarm fire) did to one actor's outbox."""

    actor_key: str
    alarm: FireDecision | None = None
    published: int = 0
    duplicates: int = 0
    retry_wait: int = 0
    failed: int = 0
    busy: bool = False
    unavailable: bool = False
    nudged: list[int] = field(default_factory=list)
    next_alarm_at: float | None = None
    #: Rows the latest ``publish_due`` of this report sent (0 = no progress).
    last_published: int = 0
    #: Why this actor could not be published at all (a damaged or locked file), if so.
    error: str | None = None
    #: Published rows past their retention that this run's commit deleted.
    pruned: int = 0

    def absorb(self, later: PublishReport) -> None:
        """Add a later ``publish_due`` of the same actor (within one alarm fire)."""
        self.published += later.published
        self.duplicates += later.duplicates
        self.retry_wait += later.retry_wait
        self.failed += later.failed
        self.busy = later.busy
        self.unavailable = later.unavailable
        self.nudged += [index for index in later.nudged if index not in self.nudged]
        self.next_alarm_at = later.next_alarm_at
        self.last_published = later.last_published
        self.pruned += later.pruned


@dataclass
class ScanReport:
    """What one every-minute scan did: a report per fired actor, the actor files it opened,
    those it did not reach, and whether it walked every actor file (see due_index)."""

    reports: list[PublishReport] = field(default_factory=list)
    actors_left: int = 0
    actors_visited: int = 0
    full_walk: bool = False


class _Stop(Exception):
    """Internal: NATS became unreachable; stop sending for this call.

    ``stored`` holds ``(seq, stream_seq)`` of the rows stored before the connection was lost.
    """

    def __init__(self, stored: list[tuple[int, int | None]] | None = None) -> None:
        super().__init__()
        self.stored = stored or []


def publish_batch_mode(settings: Settings) -> str:
    """The batch kind ``publish_batch_mode`` resolves to: ``auto`` is ``atomic`` where the
    deployment promises ``sync_interval: always`` (``require_durable_jetstream``), where one
    fsync per atomic batch beats one per message, and ``fast`` elsewhere, where a
    fast-ingest batch skips the atomic batch's staging on the server."""
    if settings.publish_batch_mode == "auto":
        return "atomic" if settings.require_durable_jetstream else "fast"
    return settings.publish_batch_mode


class OutboxPublisher:
    """Publishes actors' outbox rows. One instance per process; actors are passed per call."""

    def __init__(
        self,
        sender: EventSender,
        settings: Settings,
        *,
        clock: Clock | None = None,
        nudge: RouterNudge | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._sender = sender
        self._settings = settings
        self._clock = clock or SystemClock()
        self._nudge = nudge or NoNudge()
        self._rng = rng or random.Random()
        self._guard = AlarmGuard(settings.alarm_max_fires_per_day)
        self._batch_mode = publish_batch_mode(settings)
        bindings = settings.producer_bindings
        self._bindings = frozenset(range(EVENT_STREAM_COUNT) if bindings is None else bindings)

    async def fire_alarm(self, actor: Actor, *, nudge: bool = True) -> PublishReport:
        """The actor's alarm fired: ask AlarmGuard, then publish if it admits the fire.

        Under the publish lock the guard decides from reads alone; an admitted fire is
        counted in the same commit that marks the rows published (one commit per fire, not
        two). Every other outcome writes what it implies in a transaction of its own.
        ``nudge=False`` leaves the streams it moved (``report.nudged``) to the caller, who
        nudges each once for a whole run (:meth:`nudge_streams`).
        """
        with actor.publish_lock() as acquired:
            if not acquired:
                return PublishReport(actor.ref.key, busy=True)
            now = self._clock.now()
            if self._guard.decide(actor.connection, now) is FireDecision.FIRE:
                report = await self._publish_locked(actor, fire_at=now)
            else:
                with actor.write() as db:
                    decision = self._guard.admit(db, now)
                if decision is not FireDecision.FIRE:
                    return PublishReport(actor.ref.key, alarm=decision)
                report = await self._publish_locked(actor)  # admit() counted this fire
        report.alarm = FireDecision.FIRE
        if nudge:
            await self.nudge_streams(report.nudged)
        return report

    async def publish_due(self, actor: Actor, *, nudge: bool = True) -> PublishReport:
        """Send the due rows of every project in ``actor``'s outbox (at most 100 each).
        ``nudge=False``: as for :meth:`fire_alarm`."""
        with actor.publish_lock() as acquired:
            if not acquired:
                # another publisher is on this actor right now (F8)
                return PublishReport(actor.ref.key, busy=True)
            report = await self._publish_locked(actor)
        if nudge:
            await self.nudge_streams(report.nudged)
        return report

    async def nudge_streams(self, stream_indexes: Iterable[int]) -> None:
        """Nudge the router once for each stream of ``stream_indexes``, in order."""
        for index in dict.fromkeys(stream_indexes):
            await self._nudge.nudge(index)

    async def _publish_locked(
        self, actor: Actor, *, fire_at: datetime | None = None
    ) -> PublishReport:
        """``publish_due`` while holding the actor's publish lock; ``fire_at`` counts a fire."""
        report = PublishReport(actor.ref.key)
        if not self._sender.connected:
            report.unavailable = True
            report.next_alarm_at = alarm_due_at(actor.connection)
            if fire_at is not None:
                with actor.write() as db:
                    self._guard.count_fire(db, fire_at)
            return report
        now_s = self._clock.now().timestamp()
        limit = self._settings.publish_max_rows_per_project
        stored: list[tuple[int, int | None]] = []
        try:
            for rows in due_rows(actor.connection, now_s=now_s, limit=limit).values():
                stored += await self._publish_project(actor, rows, report)
        except _Stop as stop:
            report.unavailable = True
            stored += stop.stored
        crash_point(self._settings.crash_at, "after_puback")
        # One commit marks what was stored, counts the fire and sets the next alarm. A crash
        # that loses it re-sends those rows, and the duplicate window drops them (F5): it
        # needs no fsync of its own (a lost count lets one fire more through, at most).
        commit = functools.partial(self._commit_stored, actor, stored, fire_at, report)
        await actor.write_lightly(commit)
        report.last_published = report.published
        return report

    def _commit_stored(
        self,
        actor: Actor,
        stored: list[tuple[int, int | None]],
        fire_at: datetime | None,
        report: PublishReport,
        db: sqlite3.Connection,
    ) -> None:
        settings = self._settings
        now_s = self._clock.now().timestamp()
        mark_published(db, stored, now_s=now_s)
        if fire_at is not None:
            self._guard.count_fire(db, fire_at)
        report.next_alarm_at = next_due_at(db, now_s=now_s)
        replace_alarm(db, report.next_alarm_at)
        if report.next_alarm_at is not None:
            # An alarm left for work still due keeps its marker no later than itself.
            actor.due_index.mark(actor.ref.key, report.next_alarm_at)
        if stored:
            # Published rows past their retention go in the commit that publishes more:
            # an outbox stays at its retention's worth of rows with no commit of its own,
            # and a pass deletes more than a run publishes, so it keeps up with the inflow.
            report.pruned = prune_published(
                db,
                older_than_s=now_s - settings.outbox_published_retention_days * _DAY_S,
                limit=max(settings.outbox_prune_batch_rows, 2 * len(stored)),
            )

    async def _publish_project(
        self, actor: Actor, rows: list[OutboxRow], report: PublishReport
    ) -> list[tuple[int, int | None]]:
        """Send one project's due rows; return ``(seq, stream_seq)`` of those stored.

        Raises ``_Stop`` (after recording what was stored) when the connection is lost.
        """
        started, sendable = time.time(), self._drop_unsendable(actor, rows, report)
        if not sendable:
            return []
        stream_index = sendable[0].stream_index
        stream, subject = event_stream_name(stream_index), event_stream_subject(stream_index)
        # A project's rows all go to its one stream.
        messages = [
            OutgoingMessage(subject, row.event_id, row.envelope, row.traceparent)
            for row in sendable
        ]
        stored: list[tuple[int, int | None]] = []
        lost_connection = False
        if len(messages) >= 2:
            try:
                stored = await self._send_batch(stream, sendable, messages)
            except LogUnavailableError:
                # Maybe stored, maybe not: one by one below waits for the log, and the
                # duplicate window drops what the batch did store.
                stored = []
            except NatsUnavailableError:
                raise _Stop from None
            except SendRefusedError:
                stored = []  # refused whole: fall back to one by one below
        if len(stored) < len(sendable):
            # What a batch did not store goes one by one: a row the server refuses now waits
            # for its retry, and the rows behind it wait with it.
            more, lost_connection = await self._send_one_by_one(
                actor, stream, sendable[len(stored) :], messages[len(stored) :], report
            )
            stored += more
        if stored:
            record_hops("publish", (row.traceparent for row in sendable[: len(stored)]), started)
            report.published += len(stored)
            if stream_index not in report.nudged:
                report.nudged.append(stream_index)
        if lost_connection:
            raise _Stop(stored)
        return stored

    async def _send_batch(
        self, stream: str, rows: Sequence[OutboxRow], messages: Sequence[OutgoingMessage]
    ) -> list[tuple[int, int | None]]:
        """Send the rows as one batch of the configured kind; ``(seq, stream_seq)`` of the
        rows it stored, always a prefix of ``rows`` ([] in ``off`` mode)."""
        if self._batch_mode == "atomic":
            results = await self._sender.send_batch(stream, messages)
            return [(row.seq, r.sequence) for row, r in zip(rows, results, strict=True)]
        if self._batch_mode == "fast":
            ack = await self._sender.send_fast_batch(stream, messages)
            kept = rows[: ack.stored]
            # The PubAck names the position of the last row only; the others stay unknown
            # (another publisher's messages may sit between them on the stream).
            return [(row.seq, ack.last_sequence if row is kept[-1] else None) for row in kept]
        return []

    async def _send_one_by_one(
        self,
        actor: Actor,
        stream: str,
        rows: Sequence[OutboxRow],
        messages: Sequence[OutgoingMessage],
        report: PublishReport,
    ) -> tuple[list[tuple[int, int | None]], bool]:
        """Send rows in order, each awaiting its PubAck; stop at the first that fails.

        Returns what was stored and whether the connection was lost (no attempt counted).
        """
        stored: list[tuple[int, int | None]] = []
        for row, message in zip(rows, messages, strict=True):
            try:
                result = await self._send_when_the_log_takes_it(stream, message)
            except NatsUnavailableError:  # gone, or still unavailable after the wait
                return stored, True
            except SendRefusedError as exc:
                self._count_failed_attempt(actor, row, str(exc), report)
                break  # the rows behind it wait: order before progress
            stored.append((row.seq, result.sequence))
            report.duplicates += int(result.duplicate)
        return stored, False

    async def _send_when_the_log_takes_it(
        self, stream: str, message: OutgoingMessage
    ) -> StoredMessage:
        """Send ``message``; while the log cannot take it, send it again every
        ``publish_unavailable_retry_s`` (no attempt counted), for at most
        ``publish_unavailable_wait_s``. The same ``Nats-Msg-Id`` each time: a send whose
        PubAck was lost is dropped by the duplicate window when it is repeated."""
        settings = self._settings
        started = self._clock.now().timestamp()
        while True:
            try:
                return await self._sender.send(stream, message)
            except LogUnavailableError:
                waited_s = self._clock.now().timestamp() - started
                if waited_s + settings.publish_unavailable_retry_s > (
                    settings.publish_unavailable_wait_s
                ):
                    raise
                await self._clock.sleep(settings.publish_unavailable_retry_s)

    def _count_failed_attempt(
        self, actor: Actor, row: OutboxRow, error: str, report: PublishReport
    ) -> None:
        settings = self._settings
        delay = backoff_s(
            row.attempts + 1,
            initial_s=settings.outbox_backoff_initial_s,
            max_s=settings.outbox_backoff_max_s,
            jitter=settings.outbox_backoff_jitter,
            rng=self._rng,
        )
        with actor.write() as db:
            state = mark_attempt_failed(
                db,
                row,
                error,
                now_s=self._clock.now().timestamp(),
                max_attempts=settings.outbox_max_attempts,
                delay_s=delay,
            )
            if state is RowState.FAILED:
                # A failed row has no alarm; its marker lets the backlog gauge find it.
                actor.due_index.mark(actor.ref.key, NEVER_DUE_S)
        if state is RowState.FAILED:
            report.failed += 1
        else:
            report.retry_wait += 1

    def _drop_unsendable(
        self, actor: Actor, rows: list[OutboxRow], report: PublishReport
    ) -> list[OutboxRow]:
        """Fail at once, with ``last_error``, the rows no retry could ever send."""
        sendable: list[OutboxRow] = []
        doomed: list[tuple[int, str]] = []
        max_payload = self._sender.max_payload  # a property: read once, not per row
        for row in rows:
            reason = self._why_unsendable(row, max_payload)
            if reason is None:
                sendable.append(row)
            else:
                doomed.append((row.seq, reason))
        if doomed:
            with actor.write() as db:
                for seq, reason in doomed:
                    mark_failed(db, seq, reason)
                actor.due_index.mark(actor.ref.key, NEVER_DUE_S)
            report.failed += len(doomed)
        return sendable

    def _why_unsendable(self, row: OutboxRow, max_payload: int) -> str | None:
        if row.stream_index not in self._bindings:
            return (
                f"no producer binding for stream {event_stream_name(row.stream_index)}; "
                f"this publisher binds {sorted(self._bindings)} (RHUMBATRON_PRODUCER_BINDINGS)"
            )
        if len(row.envelope) + HEADER_ALLOWANCE_BYTES > max_payload:
            # The server counts headers too, and it answers an oversize message by closing
            # the connection, so the check must leave room for them.
            return (
                f"event is {len(row.envelope)} bytes, which with its headers (up to "
                f"{HEADER_ALLOWANCE_BYTES}) is over the server's max_payload of "
                f"{max_payload}; it can never be published as it is"
            )
        # Every stored envelope was a validated Event, serialised by us, and a trigger keeps
        # it from changing: re-validating it per send would burn a fifth of the publisher's
        # CPU. What remains possible is damage, caught by a cheap check: the bytes must be a
        # JSON object that carries this row's own identity.
        envelope = row.envelope
        if not (envelope[:1] == b"{" and envelope[-1:] == b"}"):
            return "stored envelope is not a JSON object; the row is damaged"
        identity = (
            ("eventId", f'"eventId":"{row.event_id}"'.encode()),
            ("eventType", f'"eventType":"{row.event_type}"'.encode()),
            ("projectId", f'"projectId":"{row.project_id}"'.encode()),
        )
        missing = [name for name, field in identity if field not in envelope]
        if not missing:
            return None
        return f"stored envelope lacks this row's {', '.join(missing)}; the row is damaged"


def requeue_failed_rows(actor: Actor, event_ids: Sequence[str] | None = None) -> int:
    """Operator action: put ``failed`` rows back to ``pending``, attempts reset; set the alarm."""
    with actor.write() as db:
        count = requeue_failed(db, event_ids)
        if count:
            replace_alarm(db, actor.clock.now().timestamp())
            actor.due_index.mark(actor.ref.key, actor.clock.now().timestamp())
    if count:
        actor.alarms.alarm_set(actor.ref.key, actor.clock.now())
    return count


async def republish_rows(
    actor: Actor, sender: EventSender, event_ids: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Operator action (a log repair): send ``actor``'s published rows among ``event_ids``
    again, one at a time in outbox order, each with its own ``Nats-Msg-Id``; move each
    stored row's ``stream_seq`` to its new place. Returns the IDs stored and those the
    stream's duplicate window dropped as repeats (it still remembers them). Only events no
    replica holds may be sent again (:mod:`rhumbatron.operator.log_repair`)."""
    stored: list[str] = []
    repeats: list[str] = []
    placed: list[tuple[int, int]] = []
    for seq, event_id, envelope in published_envelopes(actor.connection, event_ids):
        index = stream_index(actor.ref.project_id)
        message = OutgoingMessage(event_stream_subject(index), event_id, envelope)
        answer = await sender.send(event_stream_name(index), message)
        if answer.duplicate:
            repeats.append(event_id)
        else:
            stored.append(event_id)
            placed.append((seq, answer.sequence))
    if placed:
        with actor.write() as db:
            record_stream_seqs(db, placed)
    return stored, repeats
