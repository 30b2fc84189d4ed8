"""What a run does beyond its own stream's projector and causal router: drain mode's drains,
the sweep's reactions batch on every other stream, and the local drain of everything.

In drain mode (:func:`~rhumbatron.router.capacity.drain_mode`) a nudge drains its stream's
archiver, analytics and reactions after the projector and the causal router, and a sweep tick
drains them on every other stream too. Otherwise a tick takes one reactions batch on every
other stream, so a reaction follows its fact within a minute, not the 8 a stream waits for its
own tick.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name
from rhumbatron.router.handlers import AuditArchiver
from rhumbatron.router.reports import RunReport
from rhumbatron.router.ticks import drain_plan

if TYPE_CHECKING:
    from rhumbatron.router.ports import ConsumingRouter
    from rhumbatron.router.reports import SweepReport

__all__ = ["drain_everything", "drain_other_streams", "drain_stream", "reactions_elsewhere"]


async def drain_stream(
    router: ConsumingRouter,
    stream_index: int,
    report: RunReport,
    should_stop: Callable[[], bool] | None,
    *,
    analytics: bool,
) -> None:
    """Drain the archiver, analytics (when ``analytics``) and reactions of ``stream_index``,
    each until caught up, its fetches spent or ``should_stop``, into ``report``."""
    run = router.run_context(stream_index)
    for subscription, consumes, batch in drain_plan(router.settings, analytics=analytics):
        if should_stop is not None and should_stop():
            return
        report.subscriptions[subscription.value] = await router.consume(
            run, subscription, consumes=consumes, batch=batch, should_stop=should_stop
        )


async def drain_other_streams(
    router: ConsumingRouter,
    sweep: SweepReport,
    stream_index: int,
    should_stop: Callable[[], bool] | None,
    *,
    analytics: bool,
) -> None:
    """Drain mode's tick on every stream but ``stream_index``; the objects archived go into
    the sweep's report."""
    for other in range(EVENT_STREAM_COUNT):
        if other == stream_index or (should_stop is not None and should_stop()):
            continue
        archiver = router.handler(other, Subscription.AUDIT_ARCHIVER)
        assert isinstance(archiver, AuditArchiver)
        archived_before = len(archiver.objects_written)
        report = RunReport(other, "sweep")
        await drain_stream(router, other, report, should_stop, analytics=analytics)
        sweep.drained_elsewhere[event_stream_name(other)] = report
        sweep.archive_objects += archiver.objects_written[archived_before:]
        # A warm process keeps no list of every object it ever wrote.
        archiver.objects_written.clear()


async def reactions_elsewhere(
    router: ConsumingRouter,
    sweep: SweepReport,
    stream_index: int,
    should_stop: Callable[[], bool] | None,
) -> None:
    """One reactions batch on every stream but ``stream_index``."""
    for other in range(EVENT_STREAM_COUNT):
        if other == stream_index or (should_stop is not None and should_stop()):
            continue
        sweep.reactions_elsewhere[event_stream_name(other)] = await router.consume(
            router.run_context(other),
            Subscription.REACTIONS,
            consumes=1,
            batch=router.settings.router_fetch_max_records,
            should_stop=should_stop,
        )


async def drain_everything(router: ConsumingRouter, *, max_rounds: int) -> dict[str, int]:
    """Every subscription of every stream, one fetch each per round, until a round moves
    nothing (at most ``max_rounds``); then what a projector run left waiting is nacked. The
    local demo and tests use it: the deployed router only nudges and sweeps."""
    totals: dict[str, int] = {}
    for _ in range(max_rounds):
        moved = 0
        for index in range(EVENT_STREAM_COUNT):
            run = router.run_context(index)
            for subscription in Subscription:
                sub = await router.consume(
                    run, subscription, consumes=1, batch=router.settings.router_fetch_max_records
                )
                moved += sub.applied + sub.duplicates + sub.dead_lettered
                for name in ("applied", "duplicates", "deferred", "failed", "dead_lettered"):
                    totals[name] = totals.get(name, 0) + getattr(sub, name)
        if moved == 0:
            break
    await router.release_held()
    return totals
