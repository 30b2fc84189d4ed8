"""The outbox publisher role: everything ``functions/outbox_publisher/app.py`` runs.

Two invocations reach it, each validated at the edge by a small frozen model:

* ``{"actor": "resource_shard:acme-web:06"}`` (:class:`FireAlarm`): one actor's alarm, by an
  asynchronous invoke when a write sets it. No cloud alarm sink exists yet, so actors here
  announce nothing (:class:`~rhumbatron.actors.alarms.NoAlarmSink`) and the schedule below
  is the path that fires alarms;
* ``{"source": "schedule", "job": "fire_due_alarms"}`` (:class:`ScheduledJob`): EventBridge
  Scheduler, every minute: fire every due alarm, and stop before the Lambda's remaining
  time runs out.

Per process (one warm Lambda container) the runtime is built once by
:func:`~rhumbatron.runtime.bootstrap.bootstrap` from the ``RHUMBATRON_*`` environment, the
streams are ensured once, and one NATS connection and one event loop serve every
invocation. NATS and the actors are imported on first use, not at import: cold starts pay
for every import.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from rhumbatron.errors import EnvelopeError
from rhumbatron.runtime import event_loop

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.actors.publisher import PublishReport
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = [
    "FireAlarm",
    "InvocationContext",
    "ScheduledJob",
    "handle",
    "parse_invocation",
    "reset_for_tests",
    "runtime",
]

_log = logging.getLogger(__name__)

_SHAPES = (
    'expected {"actor": "<actor key>"} (an alarm) or '
    '{"source": "schedule", "job": "fire_due_alarms"} (the every-minute schedule)'
)


class InvocationContext(Protocol):
    """The part of the Lambda context object the publisher uses."""

    def get_remaining_time_in_millis(self) -> int: ...


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
    if not isinstance(event, Mapping):
        raise EnvelopeError(
            f"outbox publisher event must be a JSON object, got {type(event).__name__} "
            f"{event!r:.200}; {_SHAPES}"
        )
    model: type[FireAlarm | ScheduledJob] = FireAlarm if "actor" in event else ScheduledJob
    try:
        return model.model_validate(event)
    except ValidationError as exc:
        problems = "; ".join(_describe(err, event) for err in exc.errors(include_url=False))
        raise EnvelopeError(f"invalid outbox publisher event: {problems}; {_SHAPES}") from None


def _describe(err: Any, event: Mapping[Any, Any]) -> str:
    field = ".".join(str(part) for part in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"field {field!r} is missing"
    return f"field {field!r}={event.get(field, err.get('input'))!r}: {message}"


# -- the process's state ---------------------------------------------------------------------


@dataclass
class _Process:
    """What a warm container keeps between invocations."""

    app: Rhumbatron | None = None
    streams_ready: bool = False


_process = _Process()


def runtime() -> Rhumbatron:
    """The process's runtime, built on first use from the ``RHUMBATRON_*`` environment."""
    if _process.app is None:
        from rhumbatron.actors.alarms import NoAlarmSink
        from rhumbatron.runtime.bootstrap import bootstrap

        # No alarm sink in the cloud yet: the every-minute schedule fires due alarms.
        _process.app = bootstrap(alarms=NoAlarmSink())
    return _process.app


def reset_for_tests() -> None:
    """Forget the process's runtime, as a fresh container would (tests only).

    Closes the actor files and the NATS connection on the process's loop; the next
    :func:`handle` builds everything again from the environment.
    """
    app, _process.app, _process.streams_ready = _process.app, None, False
    if app is not None:
        try:
            event_loop.run(app.close())
        except Exception as exc:  # a test's server may already be gone: nothing left to drain
            _log.debug("closing the outbox publisher runtime: %s", exc)


# -- the handler -----------------------------------------------------------------------------


def handle(event: object, context: InvocationContext | None) -> dict[str, Any]:
    """Run one invocation; return a JSON-able summary (per actor, and totals).

    Raises :class:`EnvelopeError` for an event of neither shape,
    :class:`~rhumbatron.errors.NatsUnavailableError` when no NATS server answers on a cold
    start (rows stay pending; the next schedule tries again), and
    :class:`~rhumbatron.errors.ConfigurationError` for unsafe settings.
    """
    invocation = parse_invocation(event)
    started = time.monotonic()
    app = runtime()
    deadline: float | None = None
    if context is not None:
        deadline = started + context.get_remaining_time_in_millis() / 1000 - _stop_margin_s(app)
    return event_loop.run(_handle(app, invocation, deadline))


def _stop_margin_s(app: Rhumbatron) -> float:
    # One actor's slowest ordinary run: a batch whose PubAck times out, then the first
    # one-by-one send timing out too, plus a reconnect. Start no actor later than that.
    settings = app.settings
    return 2 * settings.publish_ack_timeout_s + settings.nats_connect_timeout_s


async def _handle(
    app: Rhumbatron, invocation: FireAlarm | ScheduledJob, deadline: float | None
) -> dict[str, Any]:
    await _prepare(app)
    should_stop = None if deadline is None else lambda: time.monotonic() >= deadline
    if isinstance(invocation, FireAlarm):
        report = await app.fire_alarm(invocation.actor, should_stop=should_stop)
        return _summary("fire_alarm", [report], stopped_early=False, actors_left=0)
    scan = await app.fire_due_alarms(should_stop=should_stop, rotate=True)
    reports, left = scan.reports, scan.actors_left
    if left:
        _log.warning(
            "fire_due_alarms stopped before the Lambda's time ran out; %d actors not examined "
            "(the next schedule continues)",
            left,
        )
    return _summary("fire_due_alarms", reports, stopped_early=left > 0, actors_left=left)


async def _prepare(app: Rhumbatron) -> None:
    """Connect (once per process), ensure the streams (once), or revive a warm connection.

    A first connect that nobody answers fails within a bound (``connect_nats``), so an
    unreachable cluster ends the invocation with ``NatsUnavailableError`` instead of holding
    it until the Lambda's timeout.
    """
    nc = await app.nats()
    if not _process.streams_ready:
        await app.ensure_streams()
        _process.streams_ready = True
    else:
        await _revive(nc, app.settings.nats_connect_timeout_s)


async def _revive(nc: NATS, timeout_s: float) -> None:
    """A warm invocation after a long freeze: the server may have dropped the connection.

    While Lambda froze the process nothing read the socket. A round trip makes the client
    notice a dead connection now and reconnect, instead of the first publish finding it;
    then wait (bounded) for the reconnect. If it does not come, the publisher reports
    ``unavailable`` and counts no attempt.
    """
    try:
        await nc.flush(timeout=max(1, round(timeout_s)))
    except Exception as exc:  # a dead socket shows up as a timeout or a closed-connection error
        _log.info("NATS round trip failed after a freeze (%s); waiting for the reconnect", exc)
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout_s
    while not nc.is_connected and loop.time() < until:
        await asyncio.sleep(0.05)


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
