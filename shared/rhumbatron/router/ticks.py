"""The sweep's tick arithmetic: which stream a minute visits, which housekeeping it runs, and
what it consumes there."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT

if TYPE_CHECKING:
    from datetime import datetime

    from rhumbatron.core.settings import Settings

__all__ = ["drain_plan", "in_fetches", "log_proof_due", "sweep_plan", "tick_kind"]


def tick_kind(settings: Settings, now: datetime) -> tuple[int, bool, bool]:
    """``(stream index, maintenance tick?, release-sweep tick?)`` for the minute of ``now``
    (UTC): the stream is the minute of the day mod 8; the release sweep ticks at minutes
    4, 9, 14 … of every hour (``release_sweep_every_min`` = 5)."""
    minute_of_day = now.hour * 60 + now.minute
    every = settings.release_sweep_every_min
    return (
        minute_of_day % EVENT_STREAM_COUNT,
        minute_of_day == settings.maintenance_minute_of_day,
        now.minute % every == every - 1,
    )


def log_proof_due(settings: Settings, now: datetime) -> float | None:
    """Whether the tick of ``now`` runs the scheduled full proof of its stream, and over how
    many seconds back: the first tick of a stream in each ``reconcile_proof_every_hours``
    period does (a stream's ticks are eight minutes apart, so exactly one of them starts each
    period), over that period and two of the stream's visits more (a proof slower than a
    visit still overlaps the next). ``None``: not this tick (or the schedule is off)."""
    period_s = settings.reconcile_proof_every_hours * 3_600
    if period_s <= 0:
        return None
    visit_s = EVENT_STREAM_COUNT * 60
    minute_s = (now.timestamp() // 60) * 60
    if minute_s // period_s == (minute_s - visit_s) // period_s:
        return None
    return period_s + 2 * visit_s


def in_fetches(settings: Settings, batches: int, batch_size: int) -> tuple[int, int]:
    """``batches`` batches of ``batch_size`` records as ``(fetches, records per fetch)``: a
    fetch brings at most ``router_fetch_max_records`` (the spec's 100), so a batch of 1,000
    is ten fetches, each settled (and archived) on its own."""
    per_fetch = min(batch_size, settings.router_fetch_max_records)
    return batches * math.ceil(batch_size / per_fetch), per_fetch


def drain_plan(
    settings: Settings, *, analytics: bool = True
) -> list[tuple[Subscription, int, int]]:
    """Drain mode's consumes of one stream: the archiver, analytics (unless ``analytics`` is
    False: the sweep's housekeeping minutes) and reactions, each up to
    ``router_drain_max_fetches`` fetches (a run stops sooner on a short fetch, caught up, or
    when its time is up). The archive's objects stay one per fetch, keyed by its events'
    IDs."""
    fetches = settings.router_drain_max_fetches
    plan = [
        (
            Subscription.AUDIT_ARCHIVER,
            fetches,
            in_fetches(settings, 1, settings.archive_batch_size)[1],
        ),
        (
            Subscription.ANALYTICS_PROJECTOR,
            fetches,
            in_fetches(settings, 1, settings.analytics_batch_size)[1],
        ),
        (Subscription.REACTIONS, fetches, settings.router_fetch_max_records),
    ]
    return [step for step in plan if analytics or step[0] is not Subscription.ANALYTICS_PROJECTOR]


def sweep_plan(
    settings: Settings, *, analytics: bool, drain: bool = False
) -> list[tuple[Subscription, int, int]]:
    """The subscriptions a sweep tick consumes on its stream, in order, each with its number
    of consumes and its batch size. In drain mode the archiver, analytics and reactions
    drain (:func:`drain_plan`) instead of taking the tick's batches."""
    plan: list[tuple[Subscription, int, int]] = [
        (
            Subscription.PROJECT_VIEW_PROJECTOR,
            settings.router_consumes_per_run,
            settings.router_fetch_max_records,
        ),
        (
            Subscription.CAUSAL_ROUTER,
            settings.router_consumes_per_run,
            settings.router_fetch_max_records,
        ),
    ]
    if drain:
        return [*plan, *drain_plan(settings, analytics=analytics)]
    plan.append(
        (
            Subscription.AUDIT_ARCHIVER,
            *in_fetches(settings, settings.archive_batches_per_tick, settings.archive_batch_size),
        )
    )
    if analytics:
        plan.append(
            (
                Subscription.ANALYTICS_PROJECTOR,
                *in_fetches(
                    settings, settings.analytics_batches_per_tick, settings.analytics_batch_size
                ),
            )
        )
    # One reactions batch per tick and stream (this one here, the others on every other
    # stream): the gate decides, the streams buffer the rest.
    plan.append((Subscription.REACTIONS, 1, settings.router_fetch_max_records))
    return plan
