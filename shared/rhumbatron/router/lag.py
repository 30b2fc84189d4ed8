"""Lag and backlog, recorded by every sweep tick for the dashboards.

Each tick records every consumer's ``num_pending`` and ``num_ack_pending`` and the outbox
backlog (rows pending, waiting to retry, failed) as METRICS data points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rhumbatron.router.ports import MaintainedRouter
    from rhumbatron.router.reports import SweepReport

__all__ = ["record_lag"]


async def record_lag(router: MaintainedRouter, sweep: SweepReport) -> None:
    """Read every consumer's lag and the outbox backlog into ``sweep`` and into METRICS."""
    from rhumbatron.metrics import DataPoint, MetricsRecorder

    sweep.lags = await router.consumer_lags()
    points = []
    for lag in sweep.lags:
        dimensions = {"stream": lag.stream, "consumer": lag.consumer}
        points.append(DataPoint("consumer_num_pending", lag.num_pending, dimensions=dimensions))
        points.append(
            DataPoint("consumer_num_ack_pending", lag.num_ack_pending, dimensions=dimensions)
        )
    if router.outbox_backlog is not None:
        sweep.outbox_backlog = router.outbox_backlog()
        for state in ("pending", "retry_wait", "failed"):
            points.append(DataPoint(f"outbox_{state}", sweep.outbox_backlog.get(state, 0)))
    MetricsRecorder(router.product, router.metrics_sink, router.clock).record(points)
