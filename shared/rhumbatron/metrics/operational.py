"""The operational metrics behind the CloudWatch dashboard and alarms of template.yaml.

Each is a ``METRICS`` data point recorded by the role that knows the fact, through a
:class:`~rhumbatron.metrics.MetricsRecorder`: a ``platform_metrics`` row, and in Lambda
(``RHUMBATRON_METRICS_EMF``) a CloudWatch EMF line in namespace ``Rhumbatron``. The EMF sink adds
the dimensions ``binding`` (``METRICS``) and ``service`` (``rhumbatron``) to every line, so a
CloudWatch metric's dimensions are the point's plus those two.

==========================  ================  =====================================================
metric                      dimensions        recorded by, and what it is
==========================  ================  =====================================================
``consumer_num_pending``    stream, consumer  every sweep tick (:mod:`rhumbatron.router.lag`):
                                              records not yet delivered to the consumer
``consumer_num_ack_pending`` stream, consumer every sweep tick: delivered, not yet acknowledged
``outbox_pending``,         —                 every sweep tick: outbox rows in that state over
``outbox_retry_wait``,                        every actor file
``outbox_failed``
``dead_letters_open``       queue, kind       every sweep tick: open dead letters (a gauge)
``commands_handled``        queue, outcome    each poll of a queue (queue worker; the sweep's
                                              dead-letter poll): commands settled, per outcome
``publish_errors``          kind              each outbox publisher run: publish failures
``clef_flash_calls_today``  —                 every sweep tick: Clef-flash model calls counted
                                              so far on the UTC day (a gauge; its daily maximum
                                              is the day's calls)
``sweep_heartbeat``         —                 every sweep tick that got to its end: 1
``log_gap_events``          —                 a sweep tick that found a replica of its stream
                                              short of its own sequence range: the events lost
                                              (no point when none is)
==========================  ================  =====================================================

The dimension values follow the local dashboard (:mod:`rhumbatron_dev.dashboard.summary`), in
snake_case: a poison-event letter has no queue, so its subscription stands in for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rhumbatron.metrics.platform_metrics import DataPoint

if TYPE_CHECKING:
    from rhumbatron.actors.publisher import PublishReport
    from rhumbatron.messaging.queue_consumer import PollReport

__all__ = [
    "CAPACITY_USED_METRIC",
    "CLEF_FLASH_CALLS_TODAY_METRIC",
    "COMMANDS_HANDLED_METRIC",
    "COMMAND_OUTCOMES",
    "DEAD_LETTERS_OPEN_METRIC",
    "LOG_GAP_METRIC",
    "PUBLISH_ERRORS_METRIC",
    "PUBLISH_ERROR_KINDS",
    "SWEEP_HEARTBEAT_METRIC",
    "capacity_used_point",
    "clef_flash_calls_point",
    "commands_handled_points",
    "dead_letters_open_points",
    "log_gap_points",
    "publish_error_points",
    "sweep_heartbeat_point",
]

SWEEP_HEARTBEAT_METRIC = "sweep_heartbeat"
DEAD_LETTERS_OPEN_METRIC = "dead_letters_open"
COMMANDS_HANDLED_METRIC = "commands_handled"
PUBLISH_ERRORS_METRIC = "publish_errors"
CLEF_FLASH_CALLS_TODAY_METRIC = "clef_flash_calls_today"
LOG_GAP_METRIC = "log_gap_events"
CAPACITY_USED_METRIC = "capacity_used_percent"

#: The ``outcome`` values of ``commands_handled``: the :class:`PollReport` counters of a
#: settled command (``left_for_redelivery`` is not settled: the next poll counts it).
COMMAND_OUTCOMES = ("done", "retried", "failed", "dead_lettered", "terminated", "expired")
#: The ``kind`` values of ``publish_errors``, as the local dashboard's publish-error panel
#: counts them: row attempts that failed and wait to retry, rows given up as ``failed``,
#: actors that could not be read at all, and actors left unpublished with NATS unavailable.
PUBLISH_ERROR_KINDS = ("row_retries", "rows_failed", "actor_errors", "unavailable")


def sweep_heartbeat_point() -> DataPoint:
    """One sweep tick got to its end: the heartbeat alarm fires when these stop."""
    return DataPoint(SWEEP_HEARTBEAT_METRIC, 1.0)


def commands_handled_points(report: PollReport) -> list[DataPoint]:
    """A poll's settled commands, one point per outcome that happened (none for an idle poll:
    a queue polled every minute would otherwise write six zero rows a minute)."""
    points = []
    for outcome in COMMAND_OUTCOMES:
        count = getattr(report, outcome)
        if count:
            points.append(
                DataPoint(
                    COMMANDS_HANDLED_METRIC,
                    count,
                    dimensions={"queue": report.queue, "outcome": outcome},
                )
            )
    return points


def publish_error_points(reports: Iterable[PublishReport]) -> list[DataPoint]:
    """A publisher run's failures by kind; only the kinds that happened (a clean run records
    nothing, so the publisher opens no product database just to say so)."""
    counts = dict.fromkeys(PUBLISH_ERROR_KINDS, 0)
    for report in reports:
        counts["row_retries"] += report.retry_wait
        counts["rows_failed"] += report.failed
        if report.error is not None:
            counts["actor_errors"] += 1
        elif report.unavailable:
            counts["unavailable"] += 1
    return [
        DataPoint(PUBLISH_ERRORS_METRIC, count, dimensions={"kind": kind})
        for kind, count in counts.items()
        if count
    ]


def dead_letters_open_points(counts: Mapping[tuple[str, str], int]) -> list[DataPoint]:
    """One gauge point per ``(queue, kind)`` of ``counts``, zeros included: a zero is a
    reading ("none open"), where a missing point only says nobody looked."""
    return [
        DataPoint(DEAD_LETTERS_OPEN_METRIC, count, dimensions={"queue": queue, "kind": kind})
        for (queue, kind), count in sorted(counts.items())
    ]


def log_gap_points(lost_by_replica: Mapping[str, int]) -> list[DataPoint]:
    """The events a tick found lost on its stream's replicas, as one point (none when no
    replica lost any: the alarm reads missing data as no gap)."""
    lost = sum(lost_by_replica.values())
    return [DataPoint(LOG_GAP_METRIC, float(lost))] if lost else []


def capacity_used_point(percent: float) -> DataPoint:
    """The share of its tightest ceiling the streams' measured rate uses (the capacity check,
    hourly): the capacity alarm fires at the 80 % the warnings name."""
    return DataPoint(CAPACITY_USED_METRIC, round(percent, 2), unit="Percent")


def clef_flash_calls_point(calls: int) -> DataPoint:
    """The Clef-flash model calls counted so far on the current UTC day (all cap scopes)."""
    return DataPoint(CLEF_FLASH_CALLS_TODAY_METRIC, calls)
