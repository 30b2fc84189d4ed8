"""The router-nudge role: everything ``functions/router_nudge/app.py`` runs.

One invocation reaches it: ``{"streamIndex": 3}`` (:class:`NudgeRouter`), an asynchronous
invoke the outbox publisher sends after a publish that moved stream 3. It runs
:meth:`~rhumbatron.router.event_router.EventRouter.nudge` for that stream — the
``project-view-projector`` then the ``causal-router``, a bounded number of consumes each — and
stops fetching before the Lambda's remaining time runs out.

A nudge only cuts latency. The every-minute sweep (:mod:`rhumbatron.entrypoints.sweep`) is
the correctness path: it visits every stream within 8 minutes whether nudges come or not,
so a nudge that fails or runs out of time loses nothing.

The process's runtime, NATS connection and event loop are built once per warm container
and shared with the other roles (:mod:`rhumbatron.runtime.process`, handed in by the
function; :mod:`rhumbatron.entrypoints._lambda`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from rhumbatron.core import event_loop
from rhumbatron.entrypoints._lambda import (
    InvocationContext,
    deadline,
    flush_metrics,
    prepare,
    stopper,
    validate_event,
)
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT

if TYPE_CHECKING:
    from rhumbatron.entrypoints.ports import NudgeRuntime, RuntimeProvider
    from rhumbatron.router.reports import RunReport, SubscriptionReport

__all__ = [
    "InvocationContext",
    "NudgeRouter",
    "counts_of",
    "handle",
    "parse_invocation",
    "run_summary",
]

_log = logging.getLogger(__name__)

_SHAPES = f'expected {{"streamIndex": <0..{EVENT_STREAM_COUNT - 1}>}} (the stream a publish moved)'

#: The counts of one subscription's run, in the order the summary lists them.
_COUNTS = (
    "consumes",
    "fetched",
    "applied",
    "duplicates",
    "deferred",
    "retried",
    "failed",
    "dead_lettered",
)


class NudgeRouter(BaseModel):
    """Read one event stream soon: ``{"streamIndex": 3}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Strict: an async invoke payload is JSON the publisher wrote, so "3" or true is a bug
    # upstream, not something to coerce.
    stream_index: int = Field(alias="streamIndex", strict=True, ge=0, lt=EVENT_STREAM_COUNT)


def parse_invocation(event: object) -> NudgeRouter:
    """Validate the Lambda event; raise :class:`EnvelopeError` naming the bad field and value."""
    return validate_event(NudgeRouter, event, role="router nudge", shapes=_SHAPES)


def handle(
    event: object,
    context: InvocationContext | None,
    *,
    runtime: RuntimeProvider[NudgeRuntime],
) -> dict[str, Any]:
    """Run one nudge; return a JSON-able summary (per subscription, and totals).

    Raises :class:`~rhumbatron.errors.EnvelopeError` for a bad event,
    :class:`~rhumbatron.errors.NatsUnavailableError` when no NATS server answers on a cold
    start, and :class:`~rhumbatron.errors.ConfigurationError` for unsafe settings. Records
    the run did not reach stay on their consumer for the next nudge or the sweep.
    """
    invocation = parse_invocation(event)
    app = runtime()
    until = deadline(context, _stop_margin_s(app))
    hold_s = (
        context.get_remaining_time_in_millis() / 1000
        if context is not None
        else app.settings.router_nudge_turn_s
    )
    try:
        return event_loop.run(_handle(app, invocation.stream_index, stopper(until), hold_s))
    finally:
        flush_metrics(app)


def _stop_margin_s(app: NudgeRuntime) -> float:
    # One consume at its slowest ordinary pace: a pull that waits out the fetch timeout, then
    # settling up to 100 records (SQLite on EFS, one ack each), plus a reconnect. The router
    # asks before each fetch; start none later than that.
    settings = app.settings
    return 2 * settings.router_fetch_timeout_s + settings.nats_connect_timeout_s


async def _handle(
    app: NudgeRuntime, stream_index: int, should_stop: Callable[[], bool] | None, hold_s: float
) -> dict[str, Any]:
    from rhumbatron.router.nudge_turn import nudge_in_turn

    await prepare(app)
    # One run in flight per stream across containers: a nudge that finds one running is
    # merged into it (the holder runs once more) instead of running beside it.
    turn = await nudge_in_turn(app.router(), stream_index, hold_s=hold_s, should_stop=should_stop)
    if turn.merged:
        _log.info("router nudge for stream %d merged into the run in flight", stream_index)
    # The router asks before each consume and does not say whether it stopped: time being up
    # now is what the summary can honestly report.
    out_of_time = should_stop is not None and should_stop()
    if out_of_time:
        _log.warning(
            "router nudge for stream %d ran out of time; records left wait for the next "
            "nudge or the sweep",
            stream_index,
        )
    return {
        "job": "nudge",
        **run_summary(turn.report),
        "runs": turn.runs,
        "merged": turn.merged,
        "out_of_time": out_of_time,
    }


def counts_of(report: SubscriptionReport) -> dict[str, int]:
    """One subscription's counts of a run, as JSON-able data."""
    return {count: getattr(report, count) for count in _COUNTS}


def run_summary(report: RunReport) -> dict[str, Any]:
    """A run's counts as JSON-able data: per subscription, and totals over them."""
    from rhumbatron.protocol.ids import event_stream_name

    return {
        "stream_index": report.stream_index,
        "stream": event_stream_name(report.stream_index),
        "subscriptions": {name: counts_of(sub) for name, sub in report.subscriptions.items()},
        "totals": {count: report.total(count) for count in _COUNTS},
    }
