"""Freshness: how long an Event took from its commit to its application to the project view.

The measure is the Event's own ``timestamp`` (set by the actor when the fact committed)
against the apply time on the router's clock, so it spans the outbox, the publish, the nudge
or sweep and the projector — the latency a reader of the view sees. The project-view
projector records one ``event_freshness_s`` METRICS point per applied batch: the batch's
oldest Event (the maximum), with the stream as the dimension. The points stay in memory and
are written in flushes (:class:`FreshnessGauge`): a run's end writes them at most once a
minute, and a sweep tick always, so a busy stream costs one point a minute, not one commit
per fetch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
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
    """Keeps the freshness of the applied batches in memory and writes it in flushes.

    :meth:`observe` (after an apply committed) keeps, per stream, the oldest age seen since
    the last flush; :meth:`flush` writes those points through the METRICS recorder — at the
    end of a run, at most once per ``flush_interval_s`` (and at every sweep tick, forced).
    Under load the product database sees one freshness commit per stream a minute, not one
    per fetch; a quiet stream's point is written by the run that applied it.
    """

    recorder: MetricsRecorder
    clock: Clock
    flush_interval_s: float = 60.0
    _pending: dict[str, DataPoint] = field(default_factory=dict)
    _flushed_at_s: float | None = None

    def observe(self, stream: str, events: Iterable[Event]) -> DataPoint | None:
        """Keep the batch's point (if any Event) until the next flush; return it."""
        point = freshness_point(stream, events, self.clock.now())
        if point is None:
            return None
        kept = self._pending.get(stream)
        if kept is None or point.value > kept.value:
            self._pending[stream] = point
        return point

    def flush_due(self, *, force: bool = False) -> bool:
        """Whether :meth:`flush` would write anything now: points are kept and a flush is
        due (or ``force``). A read of memory only, so a caller can skip the thread a flush
        runs on (its commit is an fsync) when there is nothing to write."""
        if not self._pending:
            return False
        return (
            force
            or self._flushed_at_s is None
            or self.clock.now().timestamp() - self._flushed_at_s >= self.flush_interval_s
        )

    def flush(self, *, force: bool = False) -> list[DataPoint]:
        """Write the points kept, when any and a flush is due (or ``force``); return them.

        A point that cannot be written is logged and dropped: a metric must never turn an
        applied batch into a retry (the Events are applied and their claims committed).
        """
        if not self.flush_due(force=force):
            return []
        now_s = self.clock.now().timestamp()
        points = list(self._pending.values())
        self._pending.clear()
        self._flushed_at_s = now_s
        try:
            self.recorder.record(points)
        except RhumbatronError as exc:
            _log.warning(
                "freshness of %s not recorded: %s",
                ", ".join(sorted(str(dict(p.dimensions).get("stream")) for p in points)),
                exc,
            )
            return []
        return points


def freshness_gauge(
    product: ProductDatabase, sink: MetricsSink, clock: Clock, *, flush_interval_s: float
) -> FreshnessGauge:
    """The gauge the router's projector records with: the METRICS recorder of the product
    database (as the lag points), opened at the first point, not at construction."""
    from rhumbatron.metrics.recorder import MetricsRecorder

    return FreshnessGauge(MetricsRecorder(product, sink, clock), clock, flush_interval_s)
