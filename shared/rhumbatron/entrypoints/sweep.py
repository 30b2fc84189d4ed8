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
    prepare,
    stopper,
    validate_event,
)

if TYPE_CHECKING:
    from rhumbatron.entrypoints.ports import RuntimeProvider, SweepRuntime
    from rhumbatron.messaging.queue_consumer import PollReport
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
    return event_loop.run(_handle(app, stopper(until), at=tick.scheduled_time))


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
    now = at or app.clock.now()
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
    open_letters, clef_flash_calls = _record_tick_metrics(app, letters)
    return {
        "job": "sweep",
        **sweep_summary(report),
        "dead_letter_queue": {
            "fetched": letters.fetched,
            "recorded": letters.done,
            "retried": letters.retried,
            "terminated": letters.terminated,
        },
        "letters_closed_as_ended": closed,
        "housekeeping": {
            "sent": dict(housekeeping.sent),
            "duplicates": dict(housekeeping.duplicates),
            "failed": dict(housekeeping.failed),
        },
        "workflows_resumed": resumed,
        "schedules_fired": fired,
        "schedules_failed": fire_failures,
        "webhook_retries": webhook_retries,
        "dead_letters_open": open_letters,
        "clef_flash_calls_today": clef_flash_calls,
        "out_of_time": out_of_time,
    }


def _fire_schedules(app: SweepRuntime, at: datetime) -> tuple[list[str], dict[str, str]]:
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
    app: SweepRuntime, should_stop: Callable[[], bool] | None
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


def _record_tick_metrics(app: SweepRuntime, letters: PollReport) -> tuple[int, int]:
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
        clef_flash_calls_point,
        commands_handled_points,
        dead_letters_open_points,
        sweep_heartbeat_point,
    )
    from rhumbatron.queues.dead_letter import open_letter_counts

    counts = open_letter_counts(app.product().connection)
    calls = calls_on(app.lifecycle().causal_store, utc_day(app.clock.now()))
    points = [
        *dead_letters_open_points(counts),
        clef_flash_calls_point(calls),
        *commands_handled_points(letters),
        sweep_heartbeat_point(),
    ]
    MetricsRecorder(app.product(), app.metrics_sink, app.clock).record(points)
    return sum(counts.values()), calls


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
        "archive_objects_expired": report.archive_objects_expired,
        # the reactions batch of every other stream (the tick's own is under subscriptions)
        "reactions_elsewhere": {
            stream: counts_of(sub) for stream, sub in report.reactions_elsewhere.items()
        },
        # capacity warnings the router raised at its first sweep in this process
        "warnings": list(report.warnings),
    }
