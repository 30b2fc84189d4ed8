"""The sweep role: everything ``functions/sweep/app.py`` runs.

One invocation reaches it: ``{"source": "schedule", "job": "sweep"}`` (:class:`ScheduledSweep`),
from EventBridge Scheduler at the start of every minute. It runs one
:meth:`~rhumbatron.router.event_router.EventRouter.sweep` tick for the minute of the clock's
now: stream ``minute-of-day mod 8`` through all its subscriptions (the archive batch, and the
analytics batch on an ordinary tick), the daily maintenance at 04:17 UTC, and every
consumer's lag and the outbox backlog into the metrics — which also go out as CloudWatch EMF
lines when ``RHUMBATRON_METRICS_EMF`` is on (the template turns it on). The router's role
also drains the dead-letter queue into ``dead_letters`` each tick, and on the 5-minute
(release-sweep) ticks closes the command letters of ended Changes. At its end every tick
records the open dead letters per queue and kind, the day's Clef-flash calls, the
dead-letter poll's commands and a heartbeat (``sweep_heartbeat``, which the template's
heartbeat alarm watches; :mod:`rhumbatron.metrics.operational`). Each tick also fires the
time events (:mod:`rhumbatron.reactions.schedule_firing`): its own ``schedule.fired`` in the
clock project, and one for each user schedule due at its minute; a schedule that cannot fire
is reported in the summary and fires at a later tick, without failing this one.

The sweep is the router's correctness path: with every nudge lost, each event is still
applied within 8 minutes. A tick must end within its minute, so the run stops fetching
before the Lambda's remaining time runs out; the stream's next tick continues.

The process's runtime, NATS connection and event loop are built once per warm container
and shared with the other roles (:mod:`rhumbatron.runtime.process`, handed in by the
function; :mod:`rhumbatron.entrypoints._lambda`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from rhumbatron.core import event_loop
from rhumbatron.entrypoints._lambda import (
    InvocationContext,
    deadline,
    flush_metrics,
    prepare,
    stopper,
    validate_event,
)

if TYPE_CHECKING:
    from rhumbatron.entrypoints.ports import RuntimeProvider, SweepRuntime
    from rhumbatron.router.reports import SweepReport

__all__ = [
    "InvocationContext",
    "ScheduledSweep",
    "handle",
    "parse_invocation",
    "sweep_summary",
]

_log = logging.getLogger(__name__)

_SHAPES = 'expected {"source": "schedule", "job": "sweep"} (the every-minute schedule)'


class ScheduledSweep(BaseModel):
    """The every-minute schedule: ``{"source": "schedule", "job": "sweep"}``, optionally with
    ``scheduledTime`` (EventBridge Scheduler's ``<aws.scheduler.scheduled-time>``): a tick
    retried in a later minute is still the tick it was scheduled as, so its housekeeping
    commands keep their IDs and JetStream drops the repeat."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    source: Literal["schedule"]
    job: Literal["sweep"]
    scheduled_time: AwareDatetime | None = Field(default=None, alias="scheduledTime")


def parse_invocation(event: object) -> ScheduledSweep:
    """Validate the Lambda event; raise :class:`EnvelopeError` naming the bad field and value."""
    return validate_event(ScheduledSweep, event, role="sweep", shapes=_SHAPES)


def handle(
    event: object,
    context: InvocationContext | None,
    *,
    runtime: RuntimeProvider[SweepRuntime],
) -> dict[str, Any]:
    """Run one sweep tick; return a JSON-able summary of what it did.

    Raises :class:`~rhumbatron.errors.EnvelopeError` for a bad event,
    :class:`~rhumbatron.errors.NatsUnavailableError` when no NATS server answers on a cold
    start (the next tick tries again), and :class:`~rhumbatron.errors.ConfigurationError` for
    unsafe settings.
    """
    tick = parse_invocation(event)
    app = runtime()
    until = deadline(context, _stop_margin_s(app))
    try:
        return event_loop.run(_handle(app, stopper(until), at=tick.scheduled_time))
    finally:
        flush_metrics(app)


def _stop_margin_s(app: SweepRuntime) -> float:
    # One consume at its slowest ordinary pace — a pull that waits out the fetch timeout,
    # settling the batch, an archive upload that times out once and is retried — plus a
    # reconnect. After the last consume the tick still reads 32 consumers' lag and the
    # outbox backlog; the fetch-timeout term covers those round trips.
    settings = app.settings
    return (
        2 * settings.router_fetch_timeout_s
        + 2 * settings.s3_timeout_s
        + settings.nats_connect_timeout_s
    )


async def _handle(
    app: SweepRuntime, should_stop: Callable[[], bool] | None, *, at: datetime | None = None
) -> dict[str, Any]:
    await prepare(app)
    tick = await app.sweep_tick(at or app.clock.now(), should_stop=should_stop)
    letters, housekeeping = tick.letters, tick.housekeeping
    return {
        "job": "sweep",
        **sweep_summary(tick.router),
        "dead_letter_queue": {
            "fetched": letters.fetched,
            "recorded": letters.done,
            "retried": letters.retried,
            "terminated": letters.terminated,
        },
        "letters_closed_as_ended": tick.letters_closed_as_ended,
        "housekeeping": {
            "sent": dict(housekeeping.sent),
            "duplicates": dict(housekeeping.duplicates),
            "failed": dict(housekeeping.failed),
        },
        "workflows_resumed": tick.workflows_resumed,
        "schedules_fired": tick.schedules_fired,
        "schedules_failed": tick.schedules_failed,
        "webhook_retries": tick.webhook_retries,
        "dead_letters_open": tick.dead_letters_open,
        "clef_flash_calls_today": tick.clef_flash_calls_today,
        "out_of_time": tick.out_of_time,
        "log_gaps": tick.log_gaps,
        "causal_rows_pruned": tick.causal_rows_pruned,
        "log_proof": tick.log_proof,
    }


def sweep_summary(report: SweepReport) -> dict[str, Any]:
    """A sweep tick as JSON-able data: the run, the tick's kind and its housekeeping."""
    # Imported here: the nudge role's module reads the stream count from the settings module,
    # whose pydantic-settings import the sweep's cold start need not pay before its first tick.
    from rhumbatron.entrypoints.router_nudge import counts_of, run_summary

    return {
        **run_summary(report.run),
        "minute_of_day": report.minute_of_day,
        "maintenance": report.maintenance,
        "release_sweep": report.release_sweep,
        "analytics": report.analytics,
        "archive_objects": [{"key": key, "events": count} for key, count in report.archive_objects],
        "lags": [
            {
                "stream": lag.stream,
                "consumer": lag.consumer,
                "num_pending": lag.num_pending,
                "num_ack_pending": lag.num_ack_pending,
                "exists": lag.exists,
            }
            for lag in report.lags
        ],
        "outbox_backlog": dict(report.outbox_backlog),
        "pruned_claims": report.pruned_claims,
        "pruned_feed_rows": report.pruned_feed_rows,
        "pruned_metric_rows": report.pruned_metric_rows,
        "pruned_reaction_rows": report.pruned_reaction_rows,
        "pruned_audit_rows": report.pruned_audit_rows,
        "archive_objects_expired": report.archive_objects_expired,
        # the reactions batch of every other stream (the tick's own is under subscriptions)
        "reactions_elsewhere": {
            stream: counts_of(sub) for stream, sub in report.reactions_elsewhere.items()
        },
        # drain mode: the archiver, analytics and reactions of every other stream
        "drained_elsewhere": {
            stream: {name: counts_of(sub) for name, sub in run.subscriptions.items()}
            for stream, run in report.drained_elsewhere.items()
        },
        # capacity warnings of the router's check (its first sweep, then hourly)
        "warnings": list(report.warnings),
    }
