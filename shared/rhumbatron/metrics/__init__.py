"""Platform metrics: ``platform_metrics`` rows, the two bindings, EMF output, analytics.

* :mod:`~rhumbatron.metrics.platform_metrics`: the table, :class:`DataPoint`, writes and reads.
* :mod:`~rhumbatron.metrics.emf`: sinks; :class:`EmfSink` writes CloudWatch EMF lines.
* :mod:`~rhumbatron.metrics.analytics`: lifecycle Event type → metric name.
* :mod:`~rhumbatron.metrics.recorder`: the ``METRICS`` recorder and the analytics write path.
* :mod:`~rhumbatron.metrics.operational`: the points the CloudWatch dashboard and alarms read.

Powertools is imported only when an :class:`EmfSink` first emits.
"""

from __future__ import annotations

from rhumbatron.metrics.analytics import ANALYTICS_METRICS, analytics_point
from rhumbatron.metrics.emf import EmfSink, MetricsSink, NoEmf, RecordingSink
from rhumbatron.metrics.operational import (
    CAPACITY_USED_METRIC,
    CLEF_FLASH_CALLS_TODAY_METRIC,
    COMMAND_OUTCOMES,
    COMMANDS_HANDLED_METRIC,
    DEAD_LETTERS_OPEN_METRIC,
    LOG_GAP_METRIC,
    PUBLISH_ERROR_KINDS,
    PUBLISH_ERRORS_METRIC,
    SWEEP_HEARTBEAT_METRIC,
    capacity_used_point,
    clef_flash_calls_point,
    commands_handled_points,
    dead_letters_open_points,
    log_gap_points,
    publish_error_points,
    sweep_heartbeat_point,
)
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
    "CAPACITY_USED_METRIC",
    "CLEF_FLASH_CALLS_TODAY_METRIC",
    "CLOUDWATCH_UNITS",
    "COMMANDS_HANDLED_METRIC",
    "COMMAND_OUTCOMES",
    "DEAD_LETTERS_OPEN_METRIC",
    "EVENT_METRICS_PER_TICK",
    "LOG_GAP_METRIC",
    "MAX_DIMENSIONS",
    "PLATFORM_METRICS_SCHEMA",
    "PUBLISH_ERRORS_METRIC",
    "PUBLISH_ERROR_KINDS",
    "SWEEP_HEARTBEAT_METRIC",
    "DataPoint",
    "EmfSink",
    "MetricBinding",
    "MetricsRecorder",
    "MetricsSink",
    "NoEmf",
    "RecordingSink",
    "StoredPoint",
    "analytics_point",
    "capacity_used_point",
    "clef_flash_calls_point",
    "commands_handled_points",
    "dead_letters_open_points",
    "insert_points",
    "log_gap_points",
    "metric_counts",
    "publish_error_points",
    "recent_points",
    "record_event_points",
    "sweep_heartbeat_point",
    "write_points",
]
