"""The sweep tick's work beyond the router: one minute's housekeeping, as a job of the root.

The router's tick (:meth:`~rhumbatron.router.event_router.EventRouter.sweep`), then what the
router's role also runs each minute: the dead-letter queue's consumer and, on the 5-minute
(release-sweep) ticks, the closing of the command letters of ended Changes; the lifecycle's
housekeeping; the workflows a crash cut short (locally); the time events; the webhook
retries; the cheap check of the log (each replica of the tick's stream against its own
sequence range, :mod:`rhumbatron.operator.reconciliation`); and the tick's own metrics with
the heartbeat. The sweep role
(:mod:`rhumbatron.entrypoints.sweep`) reads the result through its port and reports it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from rhumbatron.entrypoints.ports import SweepTick
from rhumbatron.queues.context import QueueContext
from rhumbatron.reactions.schedule_firing import ScheduleContext

if TYPE_CHECKING:
    from rhumbatron.messaging.log_state import ReplicaState
    from rhumbatron.messaging.queue_consumer import PollReport
    from rhumbatron.operator.reconciliation import ReconciliationReport, StreamReconciliation
    from rhumbatron.reactions.webhook_retries import WebhookRetrier
    from rhumbatron.router.event_router import EventRouter
    from rhumbatron.router.reports import SweepReport
    from rhumbatron.runtime.lifecycle_assembly import Lifecycle

__all__ = ["SweepHost", "run_sweep_tick"]

_log = logging.getLogger(__name__)


class SweepHost(QueueContext, ScheduleContext, Protocol):
    """What a tick reads of the runtime: the queue handlers' and the schedules' ports, the
    event router, the lifecycle and the webhook retry pass."""

    def router(self) -> EventRouter: ...

    def lifecycle(self) -> Lifecycle: ...

    def webhook_retrier(self) -> WebhookRetrier: ...

    async def reconcile(
        self,
        stream_indexes: Sequence[int] | None = None,
        *,
        now: datetime | None = None,
        within_s: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> ReconciliationReport: ...


async def run_sweep_tick(
    app: SweepHost, now: datetime, should_stop: Callable[[], bool] | None
) -> SweepTick:
    """One sweep tick at ``now``; stops fetching when ``should_stop`` says time is up."""
    report = await app.router().sweep(now=now, should_stop=should_stop)
    # The router's role also runs the dead-letter consumer (spec: DLQ -> event router), and
    # the 5-minute (release-sweep) tick closes the command letters of ended Changes.
    from rhumbatron.queues.dead_letter import (
        close_letters_of_ended_changes,
        run_dead_letter_consumer,
    )

    letters = await run_dead_letter_consumer(app, should_stop=should_stop)
    closed = 0
    if report.release_sweep:
        closed = close_letters_of_ended_changes(app, now_s=now.timestamp())
    # The lifecycle's housekeeping (spec "Sweep housekeeping"): the daily and the 5-minute
    # commands, keyed on the tick so a retried tick sends nothing twice.
    lifecycle = app.lifecycle()
    housekeeping = await lifecycle.housekeeper.run(now)
    causal_rows_pruned = _prune_causal_history(app, report, now)
    # Locally the workflows run in this process: a run cut short by a crash resumes here.
    resume_running = getattr(lifecycle.engine, "resume_running", None)
    resumed: list[str] = await resume_running() if resume_running is not None else []
    # Time events: the tick's own schedule.fired, and the user schedules due at its minute.
    fired, fire_failures = _fire_schedules(app, now)
    # Webhook reactions whose retry is due (the delivery ledger's schedule).
    webhook_retries = await _retry_webhooks(app, should_stop)
    # The router asks before each consume and does not say whether it stopped: time being up
    # now is what the summary can honestly report.
    out_of_time = should_stop is not None and should_stop()
    if out_of_time:
        _log.warning(
            "sweep of stream %d ran out of time; records left wait for its next tick",
            report.run.stream_index,
        )
    log_gaps, log_proof = await _watch_log(
        app, report.run.stream_index, now, should_stop, out_of_time=out_of_time
    )
    open_letters, clef_flash_calls = _record_tick_metrics(
        app, letters, log_gaps, report.capacity_used_percent
    )
    return SweepTick(
        router=report,
        letters=letters,
        letters_closed_as_ended=closed,
        housekeeping=housekeeping,
        workflows_resumed=resumed,
        schedules_fired=fired,
        schedules_failed=fire_failures,
        webhook_retries=webhook_retries,
        dead_letters_open=open_letters,
        clef_flash_calls_today=clef_flash_calls,
        out_of_time=out_of_time,
        log_gaps=log_gaps,
        causal_rows_pruned=causal_rows_pruned,
        log_proof=log_proof,
    )


def _prune_causal_history(app: SweepHost, report: SweepReport, now: datetime) -> int:
    """The causal router's bookkeeping (``causal.sqlite``) past the claims' retention: up to
    the daily cap on the 04:17 tick, and on every other tick the chunk the sizing needs (none
    at the default sizing), like the claims themselves."""
    from rhumbatron.router.capacity import tick_prune_rows

    settings = app.settings
    rows = settings.processed_events_prune_cap if report.maintenance else tick_prune_rows(settings)
    if not rows:
        return 0
    before_s = now.timestamp() - settings.processed_events_retention_days * 86_400
    return app.lifecycle().causal_store.prune(before_s=before_s, limit=rows)


def _fire_schedules(app: SweepHost, at: datetime) -> tuple[list[str], dict[str, str]]:
    """Fire the schedules due at the tick of ``at``; return the IDs fired and those that
    failed (ID -> why).

    Never raises: time events are one part of the tick, and the rest (the metrics, the
    heartbeat) must still be recorded. A schedule that did not fire fires at a later tick,
    for its latest due time then.
    """
    from rhumbatron.reactions.schedule_firing import fire_due_schedules

    try:
        report = fire_due_schedules(app, at)
    except Exception as exc:  # any failure, a bad setting included: the tick goes on
        _log.exception("sweep could not fire the schedules of %s", at.isoformat())
        return [], {"*": f"{type(exc).__name__}: {exc}"}
    return [fire.schedule_id for fire in report.fired], dict(report.failed)


async def _retry_webhooks(
    app: SweepHost, should_stop: Callable[[], bool] | None
) -> dict[str, object]:
    """One webhook retry pass (bounded in count and by ``should_stop``); what it did.

    Never raises, like the schedules: a pass that failed leaves its deliveries due, and the
    next tick retries them.
    """
    try:
        report = await app.webhook_retrier().run(should_stop=should_stop)
    except Exception as exc:  # the product file busy, a bad setting: the tick goes on
        _log.exception("sweep could not run the webhook retry pass")
        return {"error": f"{type(exc).__name__}: {exc}"}
    return report.as_dict()


async def _watch_log(
    app: SweepHost,
    stream_index: int,
    now: datetime,
    should_stop: Callable[[], bool] | None,
    *,
    out_of_time: bool,
) -> tuple[dict[str, int], dict[str, object] | None]:
    """The log's watch on the tick's stream: the cheap check, and the full proof when this
    tick is due to run it and has time left (a tick ``out_of_time`` skips it, and
    ``should_stop`` ends one whose time runs out: it then proves nothing). Returns the
    events each damaged replica lacks by node (the larger count of the two), and the
    proof's summary when it ran."""
    log_gaps = await _check_log(app, stream_index, now)
    proved = None if out_of_time else await _prove_log(app, stream_index, now, should_stop)
    if proved is None:
        return log_gaps, None
    log_proof, lacking = proved
    merged = {
        node: max(log_gaps.get(node, 0), lacking.get(node, 0))
        for node in log_gaps.keys() | lacking.keys()
    }
    return merged, log_proof


async def _check_log(app: SweepHost, stream_index: int, now: datetime) -> dict[str, int]:
    """The events each replica of the tick's stream lost inside its own sequence range (its
    ``/jsz``), by node. Each loss is a warning naming the way to the proof, and a
    ``log.gap_detected`` fact on the clock project's stream (once a day per loss). Never
    raises: a monitor that does not answer is a warning, and the tick goes on."""
    import asyncio

    from rhumbatron.messaging.log_state import read_replica_states
    from rhumbatron.protocol.ids import event_stream_name

    urls = app.settings.monitor_urls
    if not urls:
        return {}
    stream = event_stream_name(stream_index)
    try:
        states, unread = await asyncio.to_thread(read_replica_states, urls, [stream])
    except Exception:  # the tick goes on; the next tick of this stream looks again
        _log.exception("log check of %s failed", stream)
        return {}
    for node in unread:
        _log.warning("log check of %s could not read %s", stream, node)
    damaged = [state for state in states if state.holes]
    for state in damaged:
        _log.warning(
            "log gap detected: %s's copy of %s lacks %d acknowledged event(s) inside its "
            "sequence range; run `rhumbatron reconcile --stream %d` (docs/operations.md, "
            "Log gap detected)",
            state.node,
            stream,
            state.holes,
            stream_index,
        )
    if damaged:
        losses = [(state.stream, state.node, state.holes, state) for state in damaged]
        _write_log_gap_facts(app, losses, now)
    return {state.node: state.holes for state in damaged}


async def _prove_log(
    app: SweepHost, stream_index: int, now: datetime, should_stop: Callable[[], bool] | None
) -> tuple[dict[str, object], dict[str, int]] | None:
    """The scheduled full proof of the tick's stream, when this tick is due to run it
    (:func:`~rhumbatron.router.ticks.log_proof_due`): every event the outbox published over
    the proof's span, looked up by ID on every replica. Each replica lacking some is a
    warning and a ``log.gap_detected`` fact, like a hole the cheap check finds. Returns the
    proof's summary and the events each damaged replica lacks, by node; never raises (a
    proof that failed is a warning, and the next period proves the span again)."""
    from rhumbatron.messaging.log_state import ScanStopped
    from rhumbatron.protocol.ids import event_stream_name
    from rhumbatron.router.ticks import log_proof_due

    within_s = log_proof_due(app.settings, now)
    if within_s is None:
        return None
    stream = event_stream_name(stream_index)
    try:
        report = await app.reconcile(
            [stream_index], now=now, within_s=within_s, should_stop=should_stop
        )
    except ScanStopped as stopped:  # out of time: nothing proven, no gap claimed
        _log.warning("the scheduled proof of %s did not finish: %s", stream, stopped)
        return {"stream": stream, "unfinished": True}, {}
    except Exception as exc:  # the tick goes on; the cheap check still ran
        _log.exception("the scheduled proof of %s failed", stream)
        return {"stream": stream, "error": f"{type(exc).__name__}: {exc}"}, {}
    [proof] = report.streams
    lacking = _record_proven_losses(app, proof, stream_index, now)
    summary: dict[str, object] = {
        "stream": stream,
        "checkedFrom": report.checked_from.isoformat(),
        "expected": proof.expected,
        "gap": proof.has_gap,
        "missingEverywhere": len(proof.missing_everywhere),
        "seconds": round(report.seconds, 3),
        "requests": report.requests,
    }
    return summary, lacking


def _record_proven_losses(
    app: SweepHost, proof: StreamReconciliation, stream_index: int, now: datetime
) -> dict[str, int]:
    """Warn of each replica the proof could not read, and of each that lacks events (a
    warning naming the way to the repair and a ``log.gap_detected`` fact); return the
    events each lacks, by node."""
    lacking: dict[str, int] = {}
    losses: list[tuple[str, str, int, ReplicaState | None]] = []
    for replica in proof.replicas:
        if replica.error is not None:
            _log.warning(
                "the scheduled proof could not read %s's copy of %s: %s",
                replica.node,
                proof.stream,
                replica.error,
            )
        if replica.missing:
            lacking[replica.node] = len(replica.missing)
            losses.append((proof.stream, replica.node, len(replica.missing), replica.state))
            _log.warning(
                "log gap detected: %s's copy of %s lacks %d event(s) the outbox published "
                "(first %s); run `rhumbatron reconcile --stream %d` (docs/operations.md, "
                "Log gap detected)",
                replica.node,
                proof.stream,
                len(replica.missing),
                replica.missing[0],
                stream_index,
            )
    if losses:
        _write_log_gap_facts(app, losses, now)
    return lacking


def _write_log_gap_facts(
    app: SweepHost,
    losses: Sequence[tuple[str, str, int, ReplicaState | None]],
    now: datetime,
) -> None:
    """One ``log.gap_detected`` fact per damaged replica (stream, node, events lost, its
    ``/jsz`` state when read), in the clock project's shard."""
    from rhumbatron.domain.project import project_admin_key
    from rhumbatron.domain.transition import Transition
    from rhumbatron.operator.reconciliation import log_gap_event
    from rhumbatron.reactions.schedule_firing import ScheduleSettings, ensure_clock_project

    clock = ScheduleSettings()
    try:
        if ensure_clock_project(app, clock) != clock.clock_tenant_id:
            _log.warning(
                "log.gap_detected not written: project %s is not the clock tenant %s's",
                clock.clock_project_id,
                clock.clock_tenant_id,
            )
            return
        shard = app.resource_shard(
            clock.clock_project_id, project_admin_key(clock.clock_project_id)
        )
        facts = tuple(
            log_gap_event(
                stream,
                node,
                lost,
                state,
                tenant_id=clock.clock_tenant_id,
                project_id=clock.clock_project_id,
                now=now,
            )
            for stream, node, lost, state in losses
        )
        shard.transact(lambda db: Transition(facts=facts))
    except Exception:  # the warning and the metric still say it; the next tick writes it
        _log.exception("log.gap_detected could not be written")


def _record_tick_metrics(
    app: SweepHost,
    letters: PollReport,
    log_gaps: dict[str, int],
    capacity_used_percent: float | None,
) -> tuple[int, int]:
    """Record the tick's own METRICS points; return the open letters and today's Clef-flash
    calls.

    Strict, unlike the other roles' :func:`~rhumbatron.entrypoints._lambda.record_metrics`: a
    tick that cannot write the product database fails, and its missing heartbeat is what
    the heartbeat alarm is for.
    """
    from rhumbatron.causal.clef_flash import calls_on
    from rhumbatron.core.clock import utc_day
    from rhumbatron.metrics import (
        MetricsRecorder,
        capacity_used_point,
        clef_flash_calls_point,
        commands_handled_points,
        dead_letters_open_points,
        log_gap_points,
        sweep_heartbeat_point,
    )
    from rhumbatron.queues.dead_letter import open_letter_counts

    counts = open_letter_counts(app.product().connection)
    calls = calls_on(app.lifecycle().causal_store, utc_day(app.clock.now()))
    points = [
        *dead_letters_open_points(counts),
        clef_flash_calls_point(calls),
        *commands_handled_points(letters),
        *log_gap_points(log_gaps),
        sweep_heartbeat_point(),
    ]
    if capacity_used_percent is not None:
        points.append(capacity_used_point(capacity_used_percent))
    MetricsRecorder(app.product(), app.metrics_sink, app.clock).record(points)
    return sum(counts.values()), calls
