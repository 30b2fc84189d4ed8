"""The queue-consumer role: everything ``functions/<queue function>/app.py`` runs.

Four functions run it, each for its own queues: ``agent_wakeups`` (agent-wakeups),
``integration`` (integration, verification and release: one handler serves the three),
``indexing`` (indexing) and ``dead_letter`` (dead-letter). Two invocations reach it, each
validated at the edge by a small frozen model:

* ``{"source": "schedule", "job": "queues", "queues": ["integration", ...]}``
  (:class:`ScheduledQueues`): EventBridge Scheduler, every minute;
* ``{"source": "nudge", "queue": "integration"}`` (:class:`NudgeQueue`): an asynchronous
  invoke after a send, to cut the wait for the next tick.

Each named queue is polled — the lifecycle's handler of the queue
(:meth:`~rhumbatron.runtime.lifecycle_assembly.Lifecycle.handler`), or the
:class:`~rhumbatron.queues.dead_letter.DeadLetterConsumer` for dead-letter — by
:meth:`~rhumbatron.messaging.queue_consumer.QueueConsumerRuntime.poll`, with the batch size,
concurrency, retries and delays of its ``QUEUE_CONSUMERS`` row, until the queue is empty or
the Lambda's time is nearly up. The queues of one invocation are polled side by side, each
with its own workers, so a long integration batch does not hold up verification. Each poll's
settled commands are recorded per outcome (``commands_handled``, the dashboards' commands per
queue).

The process's runtime, NATS connection and event loop are built once per warm container
and shared with the other roles (:mod:`rhumbatron.runtime.process`, handed in by the
function; :mod:`rhumbatron.entrypoints._lambda`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
from rhumbatron.errors import EnvelopeError

if TYPE_CHECKING:
    from rhumbatron.entrypoints.ports import QueueWorkerRuntime, RuntimeProvider
    from rhumbatron.messaging.queue_consumer import PollReport

__all__ = [
    "InvocationContext",
    "NudgeQueue",
    "ScheduledQueues",
    "handle",
    "parse_invocation",
    "poll_summary",
]

_log = logging.getLogger(__name__)

_ROLE = "queue worker"
_SHAPES = (
    'expected {"source": "schedule", "job": "queues", "queues": ["<queue>", ...]} (the '
    'every-minute schedule) or {"source": "nudge", "queue": "<queue>"} (a nudge after a send)'
)


def _known_queue(queue: str) -> str:
    # Imported here: the queue table pulls in the whole message registry, which a cold
    # start should not pay for before the first event arrives.
    from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS

    if queue not in QUEUE_CONSUMERS:
        raise ValueError(f"unknown queue {queue!r}; queues are {', '.join(QUEUE_CONSUMERS)}")
    return queue


class ScheduledQueues(BaseModel):
    """The every-minute schedule: ``{"source": "schedule", "job": "queues", "queues": [...]}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["schedule"]
    job: Literal["queues"]
    queues: tuple[str, ...] = Field(min_length=1)

    @field_validator("queues")
    @classmethod
    def _known_queues(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for queue in value:
            _known_queue(queue)
        if len(set(value)) != len(value):
            raise ValueError("a queue is named twice; name each queue once")
        return value


class NudgeQueue(BaseModel):
    """Poll one queue soon: ``{"source": "nudge", "queue": "integration"}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["nudge"]
    queue: str

    @field_validator("queue")
    @classmethod
    def _known(cls, value: str) -> str:
        return _known_queue(value)

    @property
    def queues(self) -> tuple[str, ...]:
        return (self.queue,)


def parse_invocation(
    event: object, *, serves: Collection[str] | None = None
) -> ScheduledQueues | NudgeQueue:
    """Validate the Lambda event; raise :class:`EnvelopeError` naming the bad field and value.

    ``serves`` is the function's own queues: an event naming another queue is refused too
    (it would poll a queue some other function owns, past that function's concurrency).
    """
    model: type[ScheduledQueues | NudgeQueue] = ScheduledQueues
    if isinstance(event, Mapping) and event.get("source") == "nudge":
        model = NudgeQueue
    invocation = validate_event(model, event, role=_ROLE, shapes=_SHAPES)
    if serves is not None:
        foreign = [queue for queue in invocation.queues if queue not in serves]
        if foreign:
            field = "queue" if isinstance(invocation, NudgeQueue) else "queues"
            raise EnvelopeError(
                f"invalid {_ROLE} event: field {field!r} names {', '.join(map(repr, foreign))}, "
                f"which this function does not poll; it polls {', '.join(serves)}"
            )
    return invocation


# -- the handler -----------------------------------------------------------------------------


def handle(
    event: object,
    context: InvocationContext | None,
    *,
    runtime: RuntimeProvider[QueueWorkerRuntime],
    serves: Collection[str] | None = None,
) -> dict[str, Any]:
    """Poll the event's queues; return a JSON-able summary per queue (the poll's counts).

    Raises :class:`EnvelopeError` for a bad event, or one naming a queue outside ``serves``;
    :class:`~rhumbatron.errors.NatsUnavailableError` when no NATS server answers on a cold
    start (the commands wait on their queues for the next tick); and
    :class:`~rhumbatron.errors.ConfigurationError` for unsafe settings. A queue whose poll
    fails midway is reported with its error while the others carry on.
    """
    invocation = parse_invocation(event, serves=serves)
    app = runtime()
    until = deadline(context, _stop_margin_s(app))
    try:
        return event_loop.run(_handle(app, invocation, stopper(until)))
    finally:
        flush_metrics(app)


def _stop_margin_s(app: QueueWorkerRuntime) -> float:
    # A handler may hold its message up to 15 minutes (command_max_hold_s, marked in
    # progress every 30 s), and the function's Timeout is 900 s, Lambda's most: no margin can
    # promise that a handler started late still ends. The margin is one ack wait (plus a
    # reconnect) instead: no fetch and no record starts with less than that left. Ordinary
    # handlers (a webhook, a Clef-flash call, a few sends, each bounded well below a minute)
    # end within it; the rare one still running when Lambda stops the invocation is neither
    # acked nor marked any more, so JetStream redelivers it one ack wait later, and every
    # handler is idempotent on its command. Records fetched but not started are nacked at
    # once (F23). A 15-minute margin would leave the function no time to work at all.
    settings = app.settings
    return settings.command_ack_wait_s + settings.nats_connect_timeout_s


async def _handle(
    app: QueueWorkerRuntime,
    invocation: ScheduledQueues | NudgeQueue,
    should_stop: Callable[[], bool] | None,
) -> dict[str, Any]:
    await prepare(app)
    reports = await event_loop.run_together(
        *(_poll(app, queue, should_stop) for queue in invocation.queues)
    )
    queues = dict(zip(invocation.queues, reports, strict=True))
    out_of_time = any(report["out_of_time"] for report in reports)
    if out_of_time:
        _log.warning(
            "queue worker ran out of time on %s; what is left waits for the next tick",
            ", ".join(q for q, r in queues.items() if r["out_of_time"]),
        )
    job = "queues" if isinstance(invocation, ScheduledQueues) else "nudge"
    return {"job": job, "queues": queues, "out_of_time": out_of_time}


async def _poll(
    app: QueueWorkerRuntime, queue: str, should_stop: Callable[[], bool] | None
) -> dict[str, Any]:
    """Poll one queue; a failure (NATS gone midway, a consumer that cannot be created) is
    this queue's outcome, not its siblings': their handlers keep running to their acks."""
    from rhumbatron.protocol.queue_consumers import DEAD_LETTER_QUEUE

    try:
        runtime_ = await app.queue_runtime()
        if queue == DEAD_LETTER_QUEUE:
            from rhumbatron.queues.dead_letter import DeadLetterConsumer

            consumer = DeadLetterConsumer(app)
            report = await runtime_.poll(
                queue, consumer, should_stop=should_stop, on_undecodable=consumer.on_undecodable
            )
        else:
            handler = app.lifecycle().handler(queue)
            report = await runtime_.poll(queue, handler, should_stop=should_stop)
    except Exception as exc:
        _log.error("polling %s failed: %s: %s", queue, type(exc).__name__, exc)
        from rhumbatron.messaging.queue_consumer import PollReport

        return poll_summary(PollReport(queue), error=f"{type(exc).__name__}: {exc}")
    from rhumbatron.metrics import commands_handled_points

    record_metrics(app, commands_handled_points(report), what=f"{queue} commands")
    return poll_summary(report)


def poll_summary(report: PollReport, *, error: str | None = None) -> dict[str, Any]:
    """A poll's counts as JSON-able data (every :class:`PollReport` field), and its error."""
    summary = asdict(report)
    summary["error"] = error
    return summary
