"""The event router: nudge and sweep runs over the event streams.

A **nudge** for stream N runs ``project-view-projector`` then ``causal-router``, at most 2
consumes each. A **sweep tick** (the start of every minute) visits stream
``minute-of-day mod 8`` and runs the same two, then the ``audit-archiver`` batch(es), then —
on a tick that is neither the daily maintenance tick nor a release-sweep tick — the
``analytics-projector`` batch(es); every tick ends with one ``reactions`` batch on each of
the 8 streams (so an event storm waits on the stream instead of stampeding; issue #7). The
sweep is the correctness path: with nudges off every event is applied, 8 minutes later at most.

For every fetched record the router settles one outcome (see ``records``): ack, nack after
the delay, hold for the stream's next run (a deferral: the run that leaves records waiting is
followed at once by another, and what is still held when no run follows is nacked at once,
``release_held``), or — on the 5th failure of the same event for the same
subscription — a ``poison_event`` dead letter, the event marked processed, and an ack, so one
bad record never dams its stream. A record that is not its project's (on another project's
stream, of another tenant than its project root's, or of a project with no root here) is such
a failure too, and no subscription sees it: the router is the last line before a record
forged by anyone with publish rights on NATS makes another tenant's subscriptions react
(issue #21, ``records``). Its dead letter carries no tenant. A
record whose project root cannot be read now is retried, uncounted, like a busy view file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rhumbatron.core.clock import Clock
from rhumbatron.core.event_loop import run_together
from rhumbatron.core.settings import Settings
from rhumbatron.messaging.event_log import ConsumerLag, EventLogClient, Subscription
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT
from rhumbatron.router.handlers import (
    AnalyticsProjector,
    AuditArchiver,
    CausalRouter,
    CausalRouting,
    NoCausalRules,
    ProjectViewProjector,
    RecordHandler,
    RunContext,
)
from rhumbatron.router.nudge_turn import turn_taken_since
from rhumbatron.router.records import (
    DecodedEvents,
    Outcome,
    ProjectOwners,
    Record,
    decode_records,
)
from rhumbatron.router.reports import RunReport, SubscriptionReport, SweepReport
from rhumbatron.router.settling import (
    DurableAcks,
    HeldRecords,
    handle_fetch,
    prefetch_next,
    release_stream,
    settle_failure,
    settle_records,
)
from rhumbatron.router.stream_state import StreamState
from rhumbatron.router.ticks import sweep_plan, tick_kind

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

    from rhumbatron.archive import ArchiveWriter
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase

__all__ = ["EventRouter"]

_log = logging.getLogger(__name__)


@dataclass
class EventRouter:
    """Runs the subscriptions of the event streams. Build one per process.

    The router knows nothing of reactions: the composition root hands it the ``reactions``
    subscription's handler and the daily pruner of the reactions' bookkeeping, ready-made.
    """

    settings: Settings
    clock: Clock
    connect: Callable[[], Awaitable[NATS]]
    product: ProductDatabase
    archive_writer: Callable[[], ArchiveWriter]
    s3: Callable[[], S3Client]
    metrics_sink: MetricsSink
    #: Each project's tenant from its root actor (``Rhumbatron.project_tenant``, wired in by
    #: the composition root): a record is seen only if it sits on its project's stream and
    #: carries its project's tenant (``records``).
    project_owners: ProjectOwners
    #: The ``reactions`` subscription's handler.
    reactions_handler: RecordHandler
    #: The daily maintenance's prune of the reactions' bookkeeping: ``now_s`` → rows deleted.
    prune_reaction_history: Callable[[float, int], int]
    causal_routing: CausalRouting = field(default_factory=NoCausalRules)
    outbox_backlog: Callable[[], dict[str, int]] | None = None
    #: Rebuilds the views of a stream from the log (``views.rebuild_views``, wired in by the
    #: composition root): run before the projector applies anything more when the stream's
    #: view store was lost under this process. None: a lost store is logged and filled from
    #: here on only.
    rebuild_lost_views: Callable[[int], Awaitable[object]] | None = None
    _log_client: EventLogClient | None = None
    _log_nc: NATS | None = None
    _states: dict[int, StreamState] = field(default_factory=dict)
    _handlers: dict[tuple[int, Subscription], RecordHandler] = field(default_factory=dict)
    _projector: ProjectViewProjector | None = None
    _locks: dict[tuple[int, Subscription], asyncio.Lock] = field(default_factory=dict)
    #: The projector's acks waiting for the sync of their commit (``group_sync``).
    _durable_acks: DurableAcks = field(default_factory=DurableAcks)
    #: When (the clock's seconds) this process last measured the streams' event rate.
    _capacity_checked_at: float | None = None
    #: The event rate the streams carried at the last capacity check (None: unknown).
    _observed_per_day: float | None = None
    # When this process last ran a nudge (the local invoker nudges in process).
    _last_nudge_at_s: float | None = None
    _decoded: DecodedEvents = field(default_factory=DecodedEvents)
    #: The records this process keeps for each stream's next run (``settling``).
    _held: HeldRecords = field(default_factory=HeldRecords)

    # -- wiring ------------------------------------------------------------------------------
    async def event_log(self) -> EventLogClient:
        """The event-log client, rebuilt when the NATS connection was replaced."""
        nc = await self.connect()
        if self._log_client is None or self._log_nc is not nc:
            self._log_client, self._log_nc = EventLogClient(nc, self.settings), nc
        return self._log_client

    def stream_state(self, stream_index: int) -> StreamState:
        if (state := self._states.get(stream_index)) is None:
            state = self._states[stream_index] = StreamState(self.settings, stream_index)
        return state

    @property
    def projector(self) -> ProjectViewProjector:
        if self._projector is None:
            from rhumbatron.router.freshness import freshness_gauge

            # Commit-to-apply freshness per applied batch (the dashboards' panel), in memory
            self._projector = ProjectViewProjector(
                self.settings,
                freshness=freshness_gauge(
                    self.product,
                    self.metrics_sink,
                    self.clock,
                    flush_interval_s=self.settings.router_freshness_flush_s,
                ),
            )
        return self._projector

    def handler(self, stream_index: int, subscription: Subscription) -> RecordHandler:
        key = (stream_index, subscription)
        if (handler := self._handlers.get(key)) is None:
            lease_s = self.settings.router_ack_wait_s
            state = self.stream_state(stream_index)
            match subscription:
                case Subscription.PROJECT_VIEW_PROJECTOR:
                    handler = self.projector
                case Subscription.CAUSAL_ROUTER:
                    handler = CausalRouter(state, self.causal_routing, lease_s)
                case Subscription.AUDIT_ARCHIVER:
                    handler = AuditArchiver(state, self.archive_writer(), lease_s)
                case Subscription.ANALYTICS_PROJECTOR:
                    handler = AnalyticsProjector(self.product, self.metrics_sink)
                case Subscription.REACTIONS:
                    handler = self.reactions_handler
            self._handlers[key] = handler
        return handler

    # -- runs --------------------------------------------------------------------------------
    async def nudge(
        self,
        stream_index: int,
        *,
        should_stop: Callable[[], bool] | None = None,
        settle: bool = True,
    ) -> RunReport:
        """A nudge for ``stream_index``: the projector, then the causal router; in drain
        mode (:func:`~rhumbatron.router.capacity.drain_mode`) the archiver, analytics and
        reactions of the stream drain after them, until caught up or ``should_stop``.

        ``settle=False``: the projector's acks that wait for their commit's sync go out while
        the caller's next nudge runs; its :meth:`release_held` sends them (``group_sync``)."""
        _check_stream(stream_index)
        self._last_nudge_at_s = self.clock.now().timestamp()
        report = RunReport(stream_index, "nudge")
        consumes = self.settings.router_consumes_per_run
        batch = self.settings.router_fetch_max_records
        subscriptions = (Subscription.PROJECT_VIEW_PROJECTOR, Subscription.CAUSAL_ROUTER)
        # The projector starts first; the two then run side by side: they share nothing, and
        # waiting for the causal router's commits would delay the projector's next run.
        try:
            results = await run_together(
                *(
                    self.consume(
                        self.run_context(stream_index),
                        subscription,
                        consumes=consumes,
                        batch=batch,
                        should_stop=should_stop,
                        flush=False,
                    )
                    for subscription in subscriptions
                )
            )
        finally:  # both consumers' acks, on one connection: one round trip, even if one raised
            if settle:
                await self._durable_acks.settle(stream_index)
            log = self._log_client
            if log is not None and log.nc.is_connected:
                await log.nc.flush()
        for subscription, result in zip(subscriptions, results, strict=True):
            report.subscriptions[subscription.value] = result
        if self._drain_mode():
            from rhumbatron.router.other_streams import drain_stream

            await drain_stream(self, stream_index, report, should_stop, analytics=True)
        await self._flush_freshness(force=False)
        return report

    def _drain_mode(self) -> bool:
        from rhumbatron.router.capacity import drain_mode

        return drain_mode(self.settings, self._observed_per_day)

    async def _flush_freshness(self, *, force: bool) -> None:
        """Write the freshness points kept in memory, when a flush is due (``force``: now)."""
        gauge = self._projector.freshness if self._projector is not None else None
        if gauge is not None and gauge.flush_due(force=force):  # most nudges: no thread hop
            await asyncio.to_thread(gauge.flush, force=force)  # an fsync: off the event loop

    async def sweep(
        self, *, now: datetime | None = None, should_stop: Callable[[], bool] | None = None
    ) -> SweepReport:
        """One sweep tick for the minute of ``now`` (the clock's time by default)."""
        now = now or self.clock.now()
        warnings, capacity_used = await self._check_capacity()
        stream_index, maintenance, release_sweep = tick_kind(self.settings, now)
        run = self.run_context(stream_index)
        report = RunReport(stream_index, "sweep")
        analytics = not (maintenance or release_sweep)
        drain = self._drain_mode()
        plan = sweep_plan(self.settings, analytics=analytics, drain=drain)
        archiver = self.handler(stream_index, Subscription.AUDIT_ARCHIVER)
        assert isinstance(archiver, AuditArchiver)
        archived_before = len(archiver.objects_written)
        for subscription, consumes, batch in plan:
            report.subscriptions[subscription.value] = await self.consume(
                run, subscription, consumes=consumes, batch=batch, should_stop=should_stop
            )
        sweep = SweepReport(
            run=report,
            minute_of_day=now.hour * 60 + now.minute,
            maintenance=maintenance,
            release_sweep=release_sweep,
            analytics=analytics,
            archive_objects=archiver.objects_written[archived_before:],
            warnings=warnings,
            capacity_used_percent=capacity_used,
        )
        from rhumbatron.router.other_streams import drain_other_streams, reactions_elsewhere

        if drain:
            # Drain mode: every other stream drains too, so none waits 8 minutes for its tick
            # (a stream with nothing waiting costs one empty pull per subscription).
            await drain_other_streams(self, sweep, stream_index, should_stop, analytics=analytics)
        else:
            await reactions_elsewhere(self, sweep, stream_index, should_stop)
        del archiver.objects_written[:archived_before]
        from rhumbatron.router.maintenance import run_maintenance

        await run_maintenance(
            self, sweep, now, observed_per_day=self._observed_per_day, should_stop=should_stop
        )
        from rhumbatron.router.lag import record_lag

        await record_lag(self, sweep)
        # No run of this process follows a sweep's: what its runs left waiting is nacked.
        await self.release_held(None if drain else stream_index)
        await self._flush_freshness(force=True)
        return sweep

    async def _check_capacity(self) -> tuple[list[str], float | None]:
        """At a process's first sweep, then every ``router_capacity_check_every_s``: measure the
        event rate; warn of each ceiling below the sized volume, or that the rate passed 80 % of."""
        now_s = self.clock.now().timestamp()
        last = self._capacity_checked_at
        if last is not None and now_s - last < self.settings.router_capacity_check_every_s:
            return [], None
        self._capacity_checked_at = now_s
        from rhumbatron.router.capacity import capacity_report

        nudged = self.nudged_lately(now_s)
        try:
            report = await capacity_report(self.settings, await self.connect(), nudged=nudged)
        except Exception as exc:
            # A missing estimate must not stop a sweep: the settings' warnings still hold.
            _log.warning("cannot estimate the event rate: %s", exc)
            report = await capacity_report(self.settings, None, nudged=nudged)
        self._observed_per_day = report.observed_events_per_day
        for warning in report.warnings:
            _log.warning(warning)
        return report.warnings, report.used_percent

    def nudged_lately(self, now_s: float) -> bool:
        """Whether nudges ran in the last ``router_capacity_check_every_s``, here or through a
        stream's turn (:func:`~rhumbatron.router.nudge_turn.turn_taken_since`)."""
        since_s = now_s - self.settings.router_capacity_check_every_s
        last = self._last_nudge_at_s
        return (last is not None and last >= since_s) or turn_taken_since(self, since_s)

    def run_context(self, stream_index: int) -> RunContext:
        """A run's context on ``stream_index``: its time and its budget of apply calls."""
        return RunContext(
            stream_index=stream_index,
            now_s=self.clock.now().timestamp(),
            apply_calls_left=self.settings.router_apply_calls_per_run,
        )

    async def consume(
        self,
        run: RunContext,
        subscription: Subscription,
        *,
        consumes: int,
        batch: int,
        should_stop: Callable[[], bool] | None = None,
        flush: bool = True,
    ) -> SubscriptionReport:
        """Up to ``consumes`` fetches of at most ``batch`` records, each settled record by
        record. Stops early when a fetch comes back short (nothing more is waiting) or
        when ``should_stop`` says the function's time is nearly up. Sends and flushes the
        acks at the end, unless ``flush`` is False: the projector's may then still wait
        for their commit's sync, counted in the report (:meth:`settle_acks` sends them)."""
        key = (run.stream_index, subscription)
        lock = self._locks.setdefault(key, asyncio.Lock())
        report = SubscriptionReport()
        async with lock:  # one consume per subscription and stream at a time in a process
            log = await self.event_log()
            if subscription is Subscription.PROJECT_VIEW_PROJECTOR:
                await self.projector.recover_views(run.stream_index, self.rebuild_lost_views)
            for _ in range(consumes):
                if should_stop is not None and should_stop():
                    break
                if subscription is Subscription.PROJECT_VIEW_PROJECTOR and (
                    run.apply_calls_left <= 0
                ):
                    break  # the run's calls are spent: whatever it fetched now, it would defer
                messages = await log.fetch(run.stream_index, subscription, batch)
                # Leases are measured from each fetch, not from the start of the run: a
                # lease read against a stale clock could look live after JetStream has
                # already redelivered its message.
                run.now_s = self.clock.now().timestamp()
                report.consumes += 1
                if not messages:
                    break
                report.fetched += len(messages)
                records = self._held.take(
                    run.stream_index,
                    messages,
                    lambda fresh: decode_records(
                        fresh, run.stream_index, self.project_owners, self._decoded
                    ),
                )
                full = len(messages) >= min(batch, self.settings.router_fetch_max_records)
                if (
                    full
                    and subscription is Subscription.PROJECT_VIEW_PROJECTOR
                    and not (should_stop is not None and should_stop())
                ):
                    await prefetch_next(
                        log, self.projector, run, records, batch, more=_ < consumes - 1
                    )
                await self._settle_batch(log, run, subscription, records, report, ack_now=flush)
                if not full:
                    break
        if flush:
            await self.settle_acks(run.stream_index)
        return report

    async def _settle_batch(
        self,
        log: EventLogClient,
        run: RunContext,
        subscription: Subscription,
        records: list[Record],
        report: SubscriptionReport,
        *,
        ack_now: bool,
    ) -> None:
        handler = self.handler(run.stream_index, subscription)
        later: list[Record] = []
        if subscription is Subscription.PROJECT_VIEW_PROJECTOR:
            # What the run's apply calls cannot take waits for the next run as it is: neither
            # the handler nor settling touches it (a wide fetch defers most of itself).
            records, later = self.projector.split_by_budget(records, run)
            report.deferred += len(later)
        decoded = [r for r in records if r.event is not None]
        outcomes, committed = await handle_fetch(
            handler, decoded, run, pipelined=None if ack_now else self._projector
        )
        acks: list[tuple[Msg, Outcome]] | None = None if committed is None else []
        deferred = await settle_records(
            self.settings,
            subscription,
            records,
            outcomes,
            report,
            fail=lambda record, outcome: settle_failure(
                self.settings,
                state=self.stream_state(run.stream_index),
                product=self.product,
                run=run,
                subscription=subscription,
                handler=handler,
                record=record,
                outcome=outcome,
            ),
            acks=acks,
        )
        if committed is not None and acks:
            self._durable_acks.after_sync(
                run.stream_index, committed, acks, report, self.settings.router_nak_delay_s
            )
        if deferred or later:
            # Kept for the stream's next run in this process, which takes them before
            # anything new: nacked, each would be sent, parsed and fetched again. Whoever
            # ends the runs nacks what is still kept (``release_held``).
            self._held.keep(log, run, subscription, deferred + later)

    async def settle_acks(self, stream_index: int) -> None:
        """Send the projector's acks of stream ``stream_index`` that wait for their commit's
        sync, once it ends, and flush the connection (a caller that ends its runs)."""
        log = self._log_client
        await self._durable_acks.settle(stream_index)
        if log is not None and log.nc.is_connected:
            await log.nc.flush()

    async def release_held(self, stream_index: int | None = None) -> int:
        """Nack, without delay, every record this process keeps for a next run of stream
        ``stream_index`` (every stream for None), so any reader gets them at once, once the
        projector's acks are sent (``settle_acks``); returns how many. Called when no run
        of the stream follows in this process."""
        log = self._log_client
        if log is None:
            return 0
        streams = range(EVENT_STREAM_COUNT) if stream_index is None else (stream_index,)
        released = 0
        for index in streams:
            released += await release_stream(log, index, self._locks, self._durable_acks)
            self._held.forget(index)
        return released

    # -- lag ---------------------------------------------------------------------------------
    async def consumer_lags(self) -> list[ConsumerLag]:
        """The lag of every subscription on every stream (40 consumers)."""
        log = await self.event_log()
        return [
            await log.lag(index, subscription)
            for index in range(EVENT_STREAM_COUNT)
            for subscription in Subscription
        ]

    async def drain(self, *, max_rounds: int = 1_000) -> dict[str, Any]:
        """Run every subscription of every stream until nothing is waiting (the local demo
        and tests; the deployed router only nudges and sweeps)."""
        from rhumbatron.router.other_streams import drain_everything

        return await drain_everything(self, max_rounds=max_rounds)

    async def close(self) -> None:
        if self._log_client is not None:
            try:
                await self.release_held()
            except Exception as exc:  # closing anyway: JetStream redelivers after the ack wait
                _log.warning("cannot nack the records kept for a next run: %s", exc)
            await self._log_client.close()
            self._log_client = None
        for state in self._states.values():
            state.close()
        if self._projector is not None:
            self._projector.close()


def _check_stream(stream_index: int) -> None:
    if not 0 <= stream_index < EVENT_STREAM_COUNT:
        raise ValueError(f"stream index {stream_index} is outside 0..{EVENT_STREAM_COUNT - 1}")
