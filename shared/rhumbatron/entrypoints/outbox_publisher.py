"""The outbox publisher role: everything ``functions/outbox_publisher/app.py`` runs.

Two invocations reach it, each validated at the edge by a small frozen model:

* ``{"actor": "resource_shard:acme-web:06"}`` (:class:`FireAlarm`): one actor's alarm, by an
  asynchronous invoke when a write sets it. No cloud alarm sink exists yet, so actors here
  announce nothing (:class:`~rhumbatron.actors.alarms.NoAlarmSink`) and the schedule below
  is the path that fires alarms;
* ``{"source": "schedule", "job": "fire_due_alarms"}`` (:class:`ScheduledJob`): EventBridge
  Scheduler, every minute: fire every due alarm, and stop before the Lambda's remaining
  time runs out.

Per process (one warm Lambda container) the runtime is built once from the ``RHUMBATRON_*``
environment (:mod:`rhumbatron.runtime.process`, handed in by the function), the streams are
ensured once, and one NATS connection and one event loop serve every
invocation (:mod:`rhumbatron.entrypoints._lambda`, shared with the router's roles). NATS and
the actors are imported on first use, not at import: cold starts pay for every import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from rhumbatron.core import event_loop
from rhumbatron.entrypoints._lambda import (
    InvocationContext,
    deadline,
    flush_metrics,
    prepare,
    record_metrics,
    stopper,
    validate_event,
)

if TYPE_CHECKING:
    from rhumbatron.actors.publisher import PublishReport
    from rhumbatron.entrypoints.ports import PublisherRuntime, RuntimeProvider

__all__ = [
    "FireAlarm",
    "InvocationContext",
    "ScheduledJob",
    "handle",
    "parse_invocation",
]

_log = logging.getLogger(__name__)

_SHAPES = (
    'expected {"actor": "<actor key>"} (an alarm) or '
    '{"source": "schedule", "job": "fire_due_alarms"} (the every-minute schedule)'
)


class FireAlarm(BaseModel):
    """An actor's alarm fired: ``{"actor": "<actor key>"}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    actor: str

    @field_validator("actor")
    @classmethod
    def _is_actor_key(cls, value: str) -> str:
        from rhumbatron.actors.actor import ActorRef
        from rhumbatron.errors import ActorError

        try:
            ActorRef.parse(value)
        except ActorError as exc:
            raise ValueError(str(exc)) from None
        return value


class ScheduledJob(BaseModel):
    """The every-minute schedule: ``{"source": "schedule", "job": "fire_due_alarms"}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["schedule"]
    job: Literal["fire_due_alarms"]


def parse_invocation(event: object) -> FireAlarm | ScheduledJob:
    """Validate the Lambda event; raise :class:`EnvelopeError` naming the bad field and value."""
    model: type[FireAlarm | ScheduledJob] = ScheduledJob
    if isinstance(event, Mapping) and "actor" in event:
        model = FireAlarm
    return validate_event(model, event, role="outbox publisher", shapes=_SHAPES)


# -- the handler -----------------------------------------------------------------------------


def handle(
    event: object,
    context: InvocationContext | None,
    *,
    runtime: RuntimeProvider[PublisherRuntime],
) -> dict[str, Any]:
    """Run one invocation; return a JSON-able summary (per actor, and totals).

    Raises :class:`EnvelopeError` for an event of neither shape,
    :class:`~rhumbatron.errors.NatsUnavailableError` when no NATS server answers on a cold
    start (rows stay pending; the next schedule tries again), and
    :class:`~rhumbatron.errors.ConfigurationError` for unsafe settings.
    """
    invocation = parse_invocation(event)
    app = runtime()
    until = deadline(context, _stop_margin_s(app))
    try:
        return event_loop.run(_handle(app, invocation, stopper(until)))
    finally:
        flush_metrics(app)


def _stop_margin_s(app: PublisherRuntime) -> float:
    # One actor's slowest ordinary run: a batch whose PubAck times out, then the first
    # one-by-one send timing out too, plus a reconnect. Start no actor later than that.
    settings = app.settings
    return 2 * settings.publish_ack_timeout_s + settings.nats_connect_timeout_s


async def _handle(
    app: PublisherRuntime,
    invocation: FireAlarm | ScheduledJob,
    should_stop: Callable[[], bool] | None,
) -> dict[str, Any]:
    from rhumbatron.metrics import publish_error_points

    await prepare(app)
    if isinstance(invocation, FireAlarm):
        report = await app.fire_alarm(invocation.actor, should_stop=should_stop)
        record_metrics(app, publish_error_points([report]), what="publish error")
        return _summary("fire_alarm", [report], stopped_early=False, actors_left=0)
    scan = await app.fire_due_alarms(should_stop=should_stop, rotate=True)
    reports, left = scan.reports, scan.actors_left
    record_metrics(app, publish_error_points(reports), what="publish error")
    if left:
        _log.warning(
            "fire_due_alarms stopped before the Lambda's time ran out; %d actors not examined "
            "(the next schedule continues)",
            left,
        )
    summary = _summary("fire_due_alarms", reports, stopped_early=left > 0, actors_left=left)
    # What the scan cost: the actor files it opened, and whether this was the day's full walk.
    summary["actors_visited"] = scan.actors_visited
    summary["full_walk"] = scan.full_walk
    return summary


def _summary(
    job: str, reports: list[PublishReport], *, stopped_early: bool, actors_left: int
) -> dict[str, Any]:
    actors = [
        {
            "actor": report.actor_key,
            "alarm": None if report.alarm is None else str(report.alarm),
            "published": report.published,
            "duplicates": report.duplicates,
            "retry_wait": report.retry_wait,
            "failed": report.failed,
            "busy": report.busy,
            "unavailable": report.unavailable,
            "nudged": list(report.nudged),
            "next_alarm_at": report.next_alarm_at,
            "error": report.error,
        }
        for report in reports
    ]
    totals = {
        "published": sum(report.published for report in reports),
        "duplicates": sum(report.duplicates for report in reports),
        "retry_wait": sum(report.retry_wait for report in reports),
        "failed": sum(report.failed for report in reports),
        "busy": sum(report.busy for report in reports),
        "unavailable": sum(report.unavailable for report in reports),
    }
    return {
        "job": job,
        "actors": actors,
        "totals": totals,
        "stopped_early": stopped_early,
        "actors_left": actors_left,
    }
