"""Freshness: how long an Event took from its commit to its application to the project view.

The measure is the Event's own ``timestamp`` (set by the actor when the fact committed)
against the apply time on the router's clock, so it spans the outbox, the publish, the nudge
or sweep and the projector — the latency a reader of the view sees. The project-view
projector records one ``event_freshness_s`` METRICS point per applied batch: the batch's
oldest Event (the maximum), with the stream as the dimension, so a tick writes at most one
point per stream it applied, however many Events the batch held.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from rhumbatron.errors import RhumbatronError
from rhumbatron.metrics.platform_metrics import DataPoint

if TYPE_CHECKING:
    from rhumbatron.core.clock import Clock
    from rhumbatron.metrics.emf import MetricsSink
    from rhumbatron.metrics.recorder import MetricsRecorder
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.protocol.envelopes import Event

__all__ = ["EVENT_FRESHNESS_METRIC", "FreshnessGauge", "freshness_gauge", "freshness_point"]

_log = logging.getLogger(__name__)

#: Commit-to-apply seconds of the oldest Event of an applied batch; dimension ``stream``.
EVENT_FRESHNESS_METRIC = "event_freshness_s"


def freshness_point(stream: str, events: Iterable[Event], applied_at: datetime) -> DataPoint | None:
    """The ``event_freshness_s`` point of a batch applied at ``applied_at``: the largest
    ``applied_at - event.timestamp`` in seconds; None for no Events.

    A producer clock ahead of the router's would give a negative age: it counts as 0, the
    freshest an Event can be, rather than pulling the graph below the axis.
    """
    ages = [(applied_at - event.timestamp).total_seconds() for event in events]
    if not ages:
        return None
    return DataPoint(
        EVENT_FRESHNESS_METRIC, max(0.0, *ages), unit="Seconds", dimensions={"stream": stream}
    )


@dataclass
class FreshnessGauge:
    """Records the freshness of each applied batch through a METRICS recorder.

    ``clock`` is read when :meth:`observe` is called — after the apply committed.
    """

    recorder: MetricsRecorder
    clock: Clock

    def observe(self, stream: str, events: Iterable[Event]) -> DataPoint | None:
        """Record the batch's point (if any Event); return it.

        A point that cannot be written is logged and dropped: a metric must never turn an
        applied batch into a retry (the Events are applied and their claims committed).
        """
        point = freshness_point(stream, events, self.clock.now())
        if point is None:
            return None
        try:
            self.recorder.record([point])
        except RhumbatronError as exc:
            _log.warning("freshness of %s not recorded: %s", stream, exc)
            return None
        return point


def freshness_gauge(product: ProductDatabase, sink: MetricsSink, clock: Clock) -> FreshnessGauge:
    """The gauge the router's projector records with: the METRICS recorder of the product
    database (as the lag points), opened at the first point, not at construction."""
    from rhumbatron.metrics.recorder import MetricsRecorder

    return FreshnessGauge(MetricsRecorder(product, sink, clock), clock)
