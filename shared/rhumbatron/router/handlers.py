"""The four subscriptions' record handlers.

A handler gets the decoded records of one fetch (the router has already turned records that
do not decode into failures) and returns an outcome per record key. It owns its claims: where
they live and when they commit is what makes its effect happen once (see ``claims``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from rhumbatron.core.faults import crash_point
from rhumbatron.errors import ActorBusyError, ActorError, ArchiveError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.router.claims import (
    LeaseClaims,
    claim_events,
    claim_leases,
    complete_claims,
    release_claims,
)
from rhumbatron.router.group_sync import CommittedFetch, GroupSync
from rhumbatron.router.project_view import ProjectView
from rhumbatron.router.records import (
    APPLIED,
    DEFERRED,
    DUPLICATE,
    Outcome,
    Record,
    RecordOutcome,
    record_traces,
)
from rhumbatron.router.view_store import StreamViews

if TYPE_CHECKING:
    from rhumbatron.archive import ArchiveWriter
    from rhumbatron.core.settings import Settings
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.router.freshness import FreshnessGauge
    from rhumbatron.router.stream_state import StreamState

__all__ = [
    "AnalyticsProjector",
    "AuditArchiver",
    "CausalRouter",
    "CausalRouting",
    "NoCausalRules",
    "ProjectViewProjector",
    "RecordHandler",
    "RunContext",
]

_log = logging.getLogger(__name__)


@dataclass
class RunContext:
    """One nudge or sweep run on one stream: its clock reading and its apply budget."""

    stream_index: int
    now_s: float
    apply_calls_left: int


class RecordHandler(Protocol):
    subscription: Subscription

    async def handle(self, records: Sequence[Record], run: RunContext) -> dict[str, RecordOutcome]:
        """An outcome for every record key (records all decoded)."""
        ...

    def mark_processed(self, records: Sequence[Record], run: RunContext) -> None:
        """Mark dead-lettered records processed, so a redelivery skips them."""
        ...


def _events(records: Sequence[Record]) -> list[Event]:
    return [r.event for r in records if r.event is not None]


def _not_fresh(
    records: Sequence[Record], fresh: set[str], held: set[str]
) -> dict[str, RecordOutcome]:
    """Outcomes of the records this run did not lease: done → duplicate (ack); held by
    another run's live lease → retry after the nack delay (not a duplicate: its effect may
    never have happened, and an ack would lose it)."""
    held_by_other = RecordOutcome.retry("claimed by another run whose lease has not expired")
    return {
        r.key: held_by_other if r.key in held else DUPLICATE for r in records if r.key not in fresh
    }


def _lease(
    state: StreamState, consumer: str, event_ids: list[str], now_s: float, lease_s: float
) -> LeaseClaims:
    with state.transaction() as db:
        return claim_leases(db, consumer, event_ids, now_s=now_s, lease_s=lease_s)


async def _lease_records(
    state: StreamState, consumer: str, records: Sequence[Record], run: RunContext, lease_s: float
) -> tuple[list[Event], set[str], dict[str, RecordOutcome]]:
    """Lease the records' events (on a worker thread); return the events, the fresh IDs and
    the outcomes of those not fresh (done → duplicate; held by a live lease → retry)."""
    events = _events(records)
    leases = await asyncio.to_thread(
        _lease, state, consumer, [e.event_id for e in events], run.now_s, lease_s
    )
    fresh = set(leases.fresh)
    return events, fresh, _not_fresh(records, fresh, leases.held)


def _settle_leases(
    state: StreamState, consumer: str, done: list[str], undone: list[str], now_s: float
) -> None:
    """Complete the leases whose effect happened; release the others (one commit)."""
    with state.transaction() as db:
        complete_claims(db, consumer, done, now_s=now_s)
        release_claims(db, consumer, undone)


# -- project-view-projector -----------------------------------------------------------------


@dataclass
class ProjectViewProjector:
    """Applies each project's fresh events to its view, at most N apply calls per run.

    One ``apply_delta`` call per project per fetch; a project beyond the run's budget is
    deferred whole — never claimed, and held by the router for the stream's next run (see
    ``records``). The calls of one fetch commit together: the views of a stream share one
    file (``view_store``).
    """

    settings: Settings
    subscription: Subscription = Subscription.PROJECT_VIEW_PROJECTOR
    #: Records commit-to-apply seconds per applied batch (``event_freshness_s``); None: not.
    freshness: FreshnessGauge | None = None
    _stores: dict[int, StreamViews] = field(default_factory=dict)
    _syncs: dict[int, GroupSync] = field(default_factory=dict)

    def views(self, stream: int) -> StreamViews:
        """The view store of stream ``stream``, kept open for the next run."""
        store = self._stores.get(stream)
        if store is None:
            store = self._stores[stream] = StreamViews(self.settings, stream)
        return store

    async def recover_views(
        self, stream: int, rebuild: Callable[[int], Awaitable[object]] | None
    ) -> None:
        """Rebuild the stream's views by ``rebuild`` first when its store was lost under this
        process (None: say so, and fill the views from here on only)."""
        store = self.views(stream)
        if not store.is_open:
            await asyncio.to_thread(lambda: store.connection)  # opens (and migrates) once
        if store.check_file() and not store.lost:
            return
        if rebuild is None:
            _log.error("the views of stream %d were lost and no rebuild is wired", stream)
            store.lost = False
            return
        _log.warning("rebuilding the views of stream %d from the log", stream)
        await rebuild(stream)

    def view(self, project_id: str) -> ProjectView:
        """The view of ``project_id``, in the store of its stream."""
        return ProjectView(self.views(stream_index(project_id)), project_id)

    @staticmethod
    def _by_project(records: Sequence[Record]) -> dict[str, list[Record]]:
        """The records of each project, projects in the order of their first record: one
        ``apply_delta`` call each, while the run's calls last."""
        by_project: dict[str, list[Record]] = {}
        for record in records:
            assert record.event is not None
            by_project.setdefault(record.event.project_id, []).append(record)
        return by_project

    def split_by_budget(
        self, records: Sequence[Record], run: RunContext
    ) -> tuple[list[Record], list[Record]]:
        """``records`` split into those :meth:`handle` would take in ``run`` (the records of
        its first ``apply_calls_left`` projects, and every undecoded record: they fail on
        their own) and those it would defer, each part in the records' order. ``run`` is
        not changed."""
        projects = list(dict.fromkeys(r.event.project_id for r in records if r.event))
        if len(projects) <= run.apply_calls_left:
            return list(records), []
        taken = set(projects[: max(run.apply_calls_left, 0)])
        now: list[Record] = []
        later: list[Record] = []
        for record in records:
            event = record.event
            (now if event is None or event.project_id in taken else later).append(record)
        return now, later

    def budget_after(self, records: Sequence[Record], run: RunContext) -> tuple[int, int]:
        """What applying ``records`` (decoded) will leave of ``run``: the calls left, and
        how many of the records it must defer. ``run`` is not changed."""
        groups = list(self._by_project(records).values())
        left = run.apply_calls_left
        return max(left - len(groups), 0), sum(len(group) for group in groups[max(left, 0) :])

    async def handle(self, records: Sequence[Record], run: RunContext) -> dict[str, RecordOutcome]:
        """Apply the records and make their commit durable: every outcome is final."""
        committed = await self.commit(records, run)
        return await committed.outcomes_once_durable()

    async def commit(self, records: Sequence[Record], run: RunContext) -> CommittedFetch:
        """Apply the records in one commit, which the views show at once; in WAL it is not
        yet durable: :meth:`CommittedFetch.durable` says when it is. Nothing of the records
        may be acked before (see ``view_store``)."""
        by_project = self._by_project(records)
        outcomes: dict[str, RecordOutcome] = {}
        calls: list[list[Record]] = []
        for group in by_project.values():
            if run.apply_calls_left <= 0:
                outcomes.update({r.key: DEFERRED for r in group})
                continue
            run.apply_calls_left -= 1
            calls.append(group)
        if not calls:
            return CommittedFetch(outcomes)
        store = self.views(run.stream_index)
        commit: int | None = None
        if store.syncs_later:
            # WAL: the fetch's one commit writes the WAL without an fsync, here on the event
            # loop (the views are visible at once, with no thread hop), unless another writer
            # holds the file: then it waits on a worker thread. One fsync of the WAL, on a
            # worker thread and shared with the commits made while it runs (``group_sync``),
            # makes it durable before any of its records is acked.
            try:
                outcomes.update(self._apply(store, calls, run.now_s, wait=False))
            except ActorBusyError:
                outcomes.update(await asyncio.to_thread(self._apply, store, calls, run.now_s))
            commit = self._group_sync(run.stream_index).committed()
        else:
            # The commit and its fsync run on a worker thread, so the event loop keeps
            # publishing and acking meanwhile.
            outcomes.update(await asyncio.to_thread(self._apply, store, calls, run.now_s))
        if self.freshness is not None:
            applied = [
                r.event
                for group in calls
                for r in group
                if r.event is not None and outcomes[r.key].outcome is Outcome.APPLIED
            ]
            self.freshness.observe(event_stream_name(run.stream_index), applied)
        if commit is None:
            return CommittedFetch(outcomes)
        return CommittedFetch(outcomes, store.path, self._group_sync(run.stream_index), commit)

    def _group_sync(self, stream: int) -> GroupSync:
        syncs = self._syncs.get(stream)
        if syncs is None:
            syncs = self._syncs[stream] = GroupSync(self.views(stream).sync)
        return syncs

    def _apply(
        self, store: StreamViews, calls: list[list[Record]], now_s: float, *, wait: bool = True
    ) -> dict[str, RecordOutcome]:
        try:
            result = store.apply(calls, now_s=now_s, wait=wait)
        except (ActorError, sqlite3.OperationalError) as exc:
            if not wait and isinstance(exc, ActorBusyError):
                raise  # the caller waits on a worker thread instead
            # The view file is busy or the disk is full: nothing of the fetch committed.
            return {r.key: RecordOutcome.retry(str(exc)) for group in calls for r in group}
        # The projector's claims commit with its effect: "after claim" is "after apply".
        crash_point(self.settings.crash_at, "after_apply")
        return result

    def mark_processed(self, records: Sequence[Record], run: RunContext) -> None:
        ids = [r.event.event_id for r in records if r.event is not None]
        if ids:
            self.views(run.stream_index).mark_processed(ids, now_s=run.now_s)

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()
        self._syncs.clear()


# -- causal-router --------------------------------------------------------------------------


class CausalRouting(Protocol):
    """The causal rules (issue #5 brings them): which commands each fresh Event causes.

    ``route`` must be idempotent per Event: the commands it sends carry stable IDs, so a
    redelivery after a crash sends nothing twice (the JetStream duplicate window drops it).
    """

    def acts_on(self, event: Event) -> bool:
        """Whether a rule may act on ``event``. False is a promise: routing it would send,
        ask and change nothing, in any world, so the router acks it with no claim."""
        ...

    async def route(
        self, events: Sequence[Event], traces: Mapping[str, str] | None = None
    ) -> dict[str, RecordOutcome]:
        """An outcome per event ID; ``traces`` holds the ``traceparent`` header of each
        event that came with one (by event ID), for the commands it causes."""
        ...


class NoCausalRules:
    """No causal rules are installed: every Event is applied with no command."""

    def acts_on(self, event: Event) -> bool:
        return False

    async def route(
        self, events: Sequence[Event], traces: Mapping[str, str] | None = None
    ) -> dict[str, RecordOutcome]:
        return {event.event_id: APPLIED for event in events}


@dataclass
class CausalRouter:
    """Claims fresh events as leases, routes them, then completes or releases the leases.

    An Event no rule acts on (``routing.acts_on``) is applied with no lease and no settle
    row: it has no effect to make happen once, so a redelivery of it is harmless (most
    of a stream's Events are such: ``task.ready``, the informational types).
    """

    state: StreamState
    routing: CausalRouting
    lease_s: float
    subscription: Subscription = Subscription.CAUSAL_ROUTER

    async def handle(self, records: Sequence[Record], run: RunContext) -> dict[str, RecordOutcome]:
        name = self.subscription.value
        routable: list[Record] = []
        outcomes: dict[str, RecordOutcome] = {}
        for record in records:
            if record.event is not None and not self.routing.acts_on(record.event):
                outcomes[record.key] = APPLIED
            else:
                routable.append(record)
        if not routable:
            return outcomes
        events, fresh, leased = await _lease_records(self.state, name, routable, run, self.lease_s)
        outcomes |= leased
        crash_point(self.state.settings.crash_at, "after_claim")
        try:
            routed = await self.routing.route(
                [e for e in events if e.event_id in fresh], record_traces(routable)
            )
        except Exception as exc:
            # A crashing rule fails its events (counted, dead-lettered on the 5th), not the run.
            _log.exception("causal routing failed")
            routed = {
                event_id: RecordOutcome.failed(f"routing failed: {exc}") for event_id in fresh
            }
        applied = [k for k in fresh if routed.get(k, APPLIED) in (APPLIED, DUPLICATE)]
        crash_point(self.state.settings.crash_at, "after_apply")
        await asyncio.to_thread(
            _settle_leases,
            self.state,
            name,
            applied,
            [k for k in fresh if k not in applied],
            run.now_s,
        )
        for key in fresh:
            outcomes[key] = routed.get(key, APPLIED)
        return outcomes

    def mark_processed(self, records: Sequence[Record], run: RunContext) -> None:
        _settle_leases(self.state, self.subscription.value, [r.key for r in records], [], run.now_s)


# -- audit-archiver -------------------------------------------------------------------------


@dataclass
class AuditArchiver:
    """Writes a fetch's fresh events as one gzip NDJSON object; S3 down → retry, never lost.

    The claims are leases: the object is written after the claim commits and the claims
    complete after the put. A crash between the two leaves leases that expire with the ack
    wait, and the redelivery writes the events again: the same key when the batch comes back
    as it was (the object is overwritten), another key when it was recomposed — then an
    Event is in two objects and the reader yields it once. No Event is ever missing.
    """

    state: StreamState
    writer: ArchiveWriter
    lease_s: float
    objects_written: list[tuple[str, int]] = field(default_factory=list)
    subscription: Subscription = Subscription.AUDIT_ARCHIVER

    async def handle(self, records: Sequence[Record], run: RunContext) -> dict[str, RecordOutcome]:
        name = self.subscription.value
        events, fresh, outcomes = await _lease_records(self.state, name, records, run, self.lease_s)
        batch = [e for e in events if e.event_id in fresh]
        if not batch:
            return outcomes
        crash_point(self.state.settings.crash_at, "after_claim")
        try:
            # boto3 is synchronous: the PUT runs on a worker thread, off the event loop.
            archived = await asyncio.to_thread(self.writer.write_batch, run.stream_index, batch)
        except ArchiveError as exc:
            await asyncio.to_thread(_settle_leases, self.state, name, [], list(fresh), run.now_s)
            outcomes.update({k: RecordOutcome.retry(str(exc)) for k in fresh})
            return outcomes
        crash_point(self.state.settings.crash_at, "after_apply")
        await asyncio.to_thread(_settle_leases, self.state, name, list(fresh), [], run.now_s)
        self.objects_written.append((archived.key, archived.event_count))
        outcomes.update({k: APPLIED for k in fresh})
        return outcomes

    def mark_processed(self, records: Sequence[Record], run: RunContext) -> None:
        _settle_leases(self.state, self.subscription.value, [r.key for r in records], [], run.now_s)


# -- analytics-projector --------------------------------------------------------------------


@dataclass
class AnalyticsProjector:
    """One EVENT_METRICS data point per fresh lifecycle Event; claim and point commit together
    in the product database."""

    product: ProductDatabase
    sink: MetricsSink
    subscription: Subscription = Subscription.ANALYTICS_PROJECTOR

    async def handle(self, records: Sequence[Record], run: RunContext) -> dict[str, RecordOutcome]:
        from rhumbatron.metrics import MetricBinding, analytics_point, record_event_points

        name = self.subscription.value
        events = _events(records)
        try:
            with self.product.transaction() as db:
                fresh = set(claim_events(db, name, [e.event_id for e in events], now_s=run.now_s))
                points = record_event_points(
                    db,
                    [
                        point
                        for event in events
                        if event.event_id in fresh and (point := analytics_point(event)) is not None
                    ],
                    now_s=run.now_s,
                )
        except ActorError as exc:
            return {r.key: RecordOutcome.retry(str(exc)) for r in records}
        if points:
            self.sink.emit(MetricBinding.EVENT_METRICS, points)
        return {r.key: APPLIED if r.key in fresh else DUPLICATE for r in records}

    def mark_processed(self, records: Sequence[Record], run: RunContext) -> None:
        with self.product.transaction() as db:
            complete_claims(db, self.subscription.value, [r.key for r in records], now_s=run.now_s)
