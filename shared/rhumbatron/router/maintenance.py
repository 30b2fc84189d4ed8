"""Housekeeping the router owns: the daily prune of claims, and the archive expiry pass.

At the daily maintenance tick (04:17 UTC) at most ``processed_events_prune_cap`` (5,000)
``processed_events`` rows older than 14 days are deleted, across every file that holds claims:
the 8 router stream files, the product database and the 8 view stores. The project views'
feed rows age out with the same cap, and so does the reactions' bookkeeping older than
``reaction_history_days`` (finished webhook deliveries, suppressions, cause chains,
admissions). Where the archive store has no lifecycle rule (moto
locally) the same tick deletes archive objects older than 365 days, in a bounded pass.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT
from rhumbatron.router.claims import prune_claims
from rhumbatron.router.view_store import view_store_path

if TYPE_CHECKING:
    from rhumbatron.router.ports import MaintainedRouter
    from rhumbatron.router.reports import SweepReport

__all__ = ["prune_lag_metrics", "prune_processed_events", "run_daily_maintenance"]

_log = logging.getLogger(__name__)
_DAY_S = 86_400.0


def prune_processed_events(router: MaintainedRouter, *, now_s: float) -> tuple[int, int]:
    """Delete old claims and feed rows, each within the prune cap. Returns both counts."""
    settings = router.settings
    cutoff = now_s - settings.processed_events_retention_days * _DAY_S
    claims_left = feed_left = settings.processed_events_prune_cap
    stores: list[SqliteStore] = [router.stream_state(i) for i in range(EVENT_STREAM_COUNT)]
    stores.append(router.product)
    views = [
        router.projector.views(i)
        for i in range(EVENT_STREAM_COUNT)
        if view_store_path(settings, i).exists()
    ]
    stores += views
    for store in stores:
        if claims_left <= 0:
            break
        with store.transaction() as db:
            claims_left -= prune_claims(db, older_than_s=cutoff, limit=claims_left)
    for index in range(EVENT_STREAM_COUNT):
        # Failure counts of events long gone from their stream (acked or dead-lettered).
        with router.stream_state(index).transaction() as db:
            db.execute(
                "DELETE FROM k2_batch_failures WHERE batch_key IN (SELECT batch_key FROM "
                "k2_batch_failures WHERE last_failed_at_s < ? LIMIT ?)",
                (cutoff, settings.processed_events_prune_cap),
            )
    for view_store in views:
        if feed_left <= 0:
            break
        feed_left -= view_store.prune_feed(older_than_s=cutoff, limit=feed_left)
    cap = settings.processed_events_prune_cap
    return cap - claims_left, cap - feed_left


def prune_lag_metrics(router: MaintainedRouter, *, now_s: float) -> int:
    """Delete METRICS rows older than ``lag_metrics_retention_days``, at most the cap.

    Every tick writes 83 lag and backlog points (119,520 a day); the dashboards read
    CloudWatch in the cloud, so the table keeps a window, not a history. EVENT_METRICS rows
    (one per lifecycle Event) are the analytics themselves and are kept.
    """
    settings = router.settings
    cutoff = now_s - settings.lag_metrics_retention_days * _DAY_S
    with router.product.transaction() as db:
        return db.execute(
            "DELETE FROM platform_metrics WHERE id IN (SELECT id FROM platform_metrics "
            "WHERE binding = 'METRICS' AND recorded_at_s < ? LIMIT ?)",
            (cutoff, settings.metrics_prune_cap),
        ).rowcount


async def run_daily_maintenance(
    router: MaintainedRouter, sweep: SweepReport, now: datetime
) -> None:
    """The router's part of the 04:17 UTC tick."""
    sweep.pruned_claims, sweep.pruned_feed_rows = prune_processed_events(
        router, now_s=now.timestamp()
    )
    sweep.pruned_metric_rows = prune_lag_metrics(router, now_s=now.timestamp())
    sweep.pruned_reaction_rows = router.prune_reaction_history(now.timestamp())
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
