"""Platform metrics: ``platform_metrics`` rows, the two bindings, EMF output, analytics.

* :mod:`~rhumbatron.metrics.platform_metrics`: the table, :class:`DataPoint`, writes and reads.
* :mod:`~rhumbatron.metrics.emf`: sinks; :class:`EmfSink` writes CloudWatch EMF lines.
* :mod:`~rhumbatron.metrics.analytics`: lifecycle Event type → metric name.
* :mod:`~rhumbatron.metrics.recorder`: the ``METRICS`` recorder and the analytics write path.

Powertools is imported only when an :class:`EmfSink` first emits.
"""

from __future__ import annotations

from rhumbatron.metrics.analytics import ANALYTICS_METRICS, analytics_point
from rhumbatron.metrics.emf import EmfSink, MetricsSink, NoEmf, RecordingSink
from rhumbatron.metrics.platform_metrics import (
    CLOUDWATCH_UNITS,
    MAX_DIMENSIONS,
    PLATFORM_METRICS_SCHEMA,
    DataPoint,
    MetricBinding,
    StoredPoint,
    insert_points,
    metric_counts,
    recent_points,
    write_points,
)
from rhumbatron.metrics.recorder import (
    EVENT_METRICS_PER_TICK,
    MetricsRecorder,
    record_event_points,
)

__all__ = [
    "ANALYTICS_METRICS",
    "CLOUDWATCH_UNITS",
    "EVENT_METRICS_PER_TICK",
    "MAX_DIMENSIONS",
    "PLATFORM_METRICS_SCHEMA",
    "DataPoint",
    "EmfSink",
    "MetricBinding",
    "MetricsRecorder",
    "MetricsSink",
    "NoEmf",
    "RecordingSink",
    "StoredPoint",
    "analytics_point",
    "insert_points",
    "metric_counts",
    "recent_points",
    "record_event_points",
    "write_points",
]
