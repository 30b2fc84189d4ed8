"""Housekeeping the router owns: the prune of claims, and the archive expiry pass.

At the daily maintenance tick (04:17 UTC) at most ``processed_events_prune_cap`` (5,000)
``processed_events`` rows older than 14 days are deleted, across every file that holds claims:
the 8 router stream files, the product database and the 8 view stores. The project views'
feed rows age out with the same cap, and so does the reactions' bookkeeping older than
``reaction_history_days`` (finished webhook deliveries, suppressions, cause chains,
admissions); ``platform_metrics`` rows past their binding's retention go too, up to
``metrics_prune_cap`` of each. Where the archive store has no lifecycle rule (moto
locally) the same tick deletes archive objects older than 365 days, in a bounded pass.

Above the volume that daily cap keeps up with, every other tick prunes the same tables too,
in chunks :func:`~rhumbatron.router.capacity.tick_prune_rows` sizes for twice the inflow
(``expected_events_per_day``, or the observed rate when higher), and stops when the sweep's
time is up: the state stays bounded at any volume the settings are sized for. At the default
sizing only the daily tick prunes, as the spec has it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT
from rhumbatron.router.capacity import tick_prune_rows
from rhumbatron.router.claims import prune_claims
from rhumbatron.router.view_store import view_store_path

if TYPE_CHECKING:
    from rhumbatron.router.ports import MaintainedRouter
    from rhumbatron.router.reports import SweepReport

__all__ = [
    "prune_audit_log",
    "prune_metrics",
    "prune_processed_events",
    "run_daily_maintenance",
    "run_maintenance",
]

_log = logging.getLogger(__name__)
_DAY_S = 86_400.0


def prune_processed_events(
    router: MaintainedRouter,
    *,
    now_s: float,
    cap: int,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[int, int]:
    """Delete old claims and feed rows, at most ``cap`` of each (and of the failure counts
    per stream), file by file until ``should_stop``. Returns the claims and feed rows."""
    settings = router.settings
    cutoff = now_s - settings.processed_events_retention_days * _DAY_S
    claims_left = feed_left = cap

    def out_of_time() -> bool:
        return should_stop is not None and should_stop()

    stores: list[SqliteStore] = [router.stream_state(i) for i in range(EVENT_STREAM_COUNT)]
    stores.append(router.product)
    views = [
        router.projector.views(i)
        for i in range(EVENT_STREAM_COUNT)
        if view_store_path(settings, i).exists()
    ]
    stores += views
    for store in stores:
        if claims_left <= 0 or out_of_time():
            break
        with store.transaction() as db:
            claims_left -= prune_claims(db, older_than_s=cutoff, limit=claims_left)
    for index in range(EVENT_STREAM_COUNT):
        if out_of_time():
            break
        # Failure counts of events long gone from their stream (acked or dead-lettered).
        with router.stream_state(index).transaction() as db:
            db.execute(
                "DELETE FROM k2_batch_failures WHERE batch_key IN (SELECT batch_key FROM "
                "k2_batch_failures WHERE last_failed_at_s < ? LIMIT ?)",
                (cutoff, cap),
            )
    for view_store in views:
        if feed_left <= 0 or out_of_time():
            break
        feed_left -= view_store.prune_feed(older_than_s=cutoff, limit=feed_left)
    return cap - claims_left, cap - feed_left


def prune_metrics(router: MaintainedRouter, *, now_s: float, cap: int) -> int:
    """Delete ``platform_metrics`` rows past their binding's retention, at most ``cap`` of
    each binding; returns the rows deleted.

    METRICS rows go after ``lag_metrics_retention_days`` (30): every tick writes 83 lag and
    backlog points (119,520 a day), and the dashboards read CloudWatch in the cloud, so the
    table keeps a window, not a history. EVENT_METRICS rows (one per lifecycle Event, the
    analytics) go after ``event_metrics_retention_days`` (90): they grow with the events, so
    without a retention the table would grow for ever at any volume.
    """
    settings = router.settings
    windows = (
        ("METRICS", settings.lag_metrics_retention_days),
        ("EVENT_METRICS", settings.event_metrics_retention_days),
    )
    deleted = 0
    with router.product.transaction() as db:
        for binding, days in windows:
            deleted += db.execute(
                "DELETE FROM platform_metrics WHERE id IN (SELECT id FROM platform_metrics "
                "WHERE binding = ? AND recorded_at_s < ? LIMIT ?)",
                (binding, now_s - days * _DAY_S, cap),
            ).rowcount
    return deleted


def prune_audit_log(router: MaintainedRouter, *, now_s: float, cap: int) -> int:
    """Delete at most ``cap`` rows of the audit log older than ``audit_retention_days``
    (365): API mutations are few, so one daily pass keeps up."""
    from rhumbatron.product.audit import prune_audit

    older_than_s = now_s - router.settings.audit_retention_days * _DAY_S
    with router.product.transaction() as db:
        return prune_audit(db, older_than_s=older_than_s, limit=cap)


async def run_maintenance(
    router: MaintainedRouter,
    sweep: SweepReport,
    now: datetime,
    *,
    observed_per_day: float | None,
    should_stop: Callable[[], bool] | None,
) -> None:
    """The router's housekeeping on a sweep tick: the daily maintenance on its tick, and on
    every other tick the prune that keeps up with the volume (when the sizing needs one)."""
    if sweep.maintenance:
        await run_daily_maintenance(router, sweep, now)
        return
    rows = tick_prune_rows(router.settings, observed_per_day)
    if rows and not (should_stop is not None and should_stop()):
        now_s = now.timestamp()
        sweep.pruned_claims, sweep.pruned_feed_rows = prune_processed_events(
            router, now_s=now_s, cap=rows, should_stop=should_stop
        )
        sweep.pruned_reaction_rows = router.prune_reaction_history(now_s, rows)
        sweep.pruned_metric_rows = prune_metrics(router, now_s=now_s, cap=rows)


async def run_daily_maintenance(
    router: MaintainedRouter, sweep: SweepReport, now: datetime
) -> None:
    """The router's part of the 04:17 UTC tick."""
    settings = router.settings
    cap = settings.processed_events_prune_cap
    sweep.pruned_claims, sweep.pruned_feed_rows = prune_processed_events(
        router, now_s=now.timestamp(), cap=cap
    )
    sweep.pruned_metric_rows = prune_metrics(
        router, now_s=now.timestamp(), cap=settings.metrics_prune_cap
    )
    sweep.pruned_reaction_rows = router.prune_reaction_history(now.timestamp(), cap)
    sweep.pruned_audit_rows = prune_audit_log(
        router, now_s=now.timestamp(), cap=settings.metrics_prune_cap
    )
    if router.settings.archive_expiry_pass:
        from rhumbatron.archive import expire_archive

        try:
            report = expire_archive(
                router.s3(),
                router.settings.evidence_bucket,
                now=now,
                max_age_days=router.settings.archive_max_age_days,
                max_objects=router.settings.archive_expiry_max_objects,
            )
        except Exception as exc:
            # Expiry is retried tomorrow; the archived events are not at risk.
            _log.error("archive expiry pass failed: %s", exc)
        else:
            sweep.archive_objects_expired = report.deleted
