"""Where data points go besides ``platform_metrics``: CloudWatch EMF lines in Lambda.

In Lambda, a JSON line in CloudWatch embedded metric format (EMF) on stdout becomes a
CloudWatch metric asynchronously: no API call, no latency on the invocation. :class:`EmfSink`
gathers an invocation's points and, at :meth:`~EmfSink.flush` (the end of every Lambda
invocation, :func:`rhumbatron.entrypoints._lambda.flush_metrics`), writes one EMF document per
binding and dimension set, each metric's points as its array of values. It builds each
document with aws-lambda-powertools and writes it itself, so a test can pass a ``stream`` and
parse what came out. Locally the default is :class:`NoEmf`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TextIO

from rhumbatron.metrics.platform_metrics import DataPoint, MetricBinding

if TYPE_CHECKING:
    from aws_lambda_powertools.metrics import MetricUnit

__all__ = ["EmfSink", "MetricsSink", "NoEmf", "RecordingSink"]


class MetricsSink(Protocol):
    """Receives data points after their ``platform_metrics`` rows are committed."""

    def emit(self, binding: MetricBinding, points: Sequence[DataPoint]) -> None:
        """Publish ``points`` of ``binding``; called only with points actually written."""
        ...

    def flush(self) -> None:
        """Send what :meth:`emit` gathered (a Lambda invocation's end calls it)."""
        ...


class NoEmf:
    """Publishes nothing: the local default, where ``platform_metrics`` is the only record."""

    def emit(self, binding: MetricBinding, points: Sequence[DataPoint]) -> None:
        return None

    def flush(self) -> None:
        return None


@dataclass
class RecordingSink:
    """Keeps every emitted point in order, with its binding: a test double."""

    emitted: list[tuple[MetricBinding, DataPoint]] = field(default_factory=list)

    def emit(self, binding: MetricBinding, points: Sequence[DataPoint]) -> None:
        self.emitted.extend((MetricBinding(binding), point) for point in points)

    def flush(self) -> None:
        return None

    def points(self, binding: MetricBinding | None = None) -> list[DataPoint]:
        """The emitted points, only ``binding``'s when given."""
        return [point for bound, point in self.emitted if binding is None or bound == binding]


def _metric_unit(unit: str) -> MetricUnit:
    from aws_lambda_powertools.metrics import MetricUnit

    try:
        return MetricUnit(unit)
    except ValueError:
        raise ValueError(
            f"unit {unit!r} is not a CloudWatch unit; use one of "
            f"{', '.join(sorted(member.value for member in MetricUnit))}"
        ) from None


#: EMF's limits for one document: metrics per directive, and values in one metric's array.
MAX_METRICS_PER_DOCUMENT = 100
MAX_VALUES_PER_METRIC = 100
#: The longest a gathered point waits for its invocation's flush: a function killed at its
#: timeout (a queue function's is 15 minutes) never reaches the flush, and loses at most the
#: points of this last stretch.
MAX_HOLD_S = 60.0

#: What one document gathers: its binding and the point's dimensions (sorted, as DataPoint
#: keeps them).
_GroupKey = tuple[MetricBinding, tuple[tuple[str, str], ...]]


@dataclass
class _Series:
    unit: MetricUnit
    values: list[float] = field(default_factory=list)


class EmfSink:
    """Gathers data points, and writes them as CloudWatch EMF documents at :meth:`flush`.

    One document per binding and dimension set (namespace and service are the sink's):
    each metric of the set once, with the values of all its points in order as its array.
    CloudWatch takes each value of the array as one sample, so sums, counts and maxima are
    those of the points, as with one line per point, for a fraction of the log lines (one
    sweep tick printed 95 lines, one per point). A document holds at most
    :data:`MAX_METRICS_PER_DOCUMENT` metrics and :data:`MAX_VALUES_PER_METRIC` values each
    (EMF's limits): a group that would pass one is written at once, and gathering goes on.
    Each document carries its dimensions plus ``binding`` (and powertools' ``service``); its
    timestamp is the time of the flush. Lines go to ``stream``, or to ``sys.stdout`` at the
    time of the flush when ``stream`` is None (Lambda forwards stdout to CloudWatch Logs,
    which extracts the metrics). A point gathered ``max_hold_s`` ago (on ``monotonic``) makes
    the next :meth:`emit` flush everything first, so a long invocation writes at least that
    often. Points may come from worker threads (a flush of the freshness gauge): a lock
    keeps a flush from losing a point gathered meanwhile.
    """

    def __init__(
        self,
        namespace: str = "Rhumbatron",
        service: str = "rhumbatron",
        stream: TextIO | None = None,
        *,
        max_hold_s: float = MAX_HOLD_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not namespace.strip():
            raise ValueError(f"EMF namespace {namespace!r} must not be empty")
        if not service.strip():
            raise ValueError(f"EMF service {service!r} must not be empty")
        self.namespace = namespace
        self.service = service
        self._stream = stream
        # Insertion-ordered: documents come out in the order their first point came.
        self._pending: dict[_GroupKey, dict[str, _Series]] = {}
        self._max_hold_s = max_hold_s
        self._monotonic = monotonic
        self._oldest_at: float | None = None
        self._lock = threading.Lock()

    def emit(self, binding: MetricBinding, points: Sequence[DataPoint]) -> None:
        """Gather ``points`` until :meth:`flush`; raises :class:`ValueError` for an unknown
        unit, before gathering any of them (a bad point must not leave half a batch)."""
        if not points:
            return
        binding = MetricBinding(binding)
        units = [_metric_unit(point.unit) for point in points]
        now = self._monotonic()
        with self._lock:
            if self._oldest_at is not None and now - self._oldest_at >= self._max_hold_s:
                self._flush_locked()
            if self._oldest_at is None:
                self._oldest_at = now
            self._gather(binding, points, units)

    def _gather(
        self, binding: MetricBinding, points: Sequence[DataPoint], units: list[MetricUnit]
    ) -> None:
        for point, unit in zip(points, units, strict=True):
            key: _GroupKey = (binding, tuple(point.dimensions.items()))
            group = self._pending.setdefault(key, {})
            series = group.get(point.name)
            full = series is not None and (
                series.unit != unit or len(series.values) >= MAX_VALUES_PER_METRIC
            )
            if full or (series is None and len(group) >= MAX_METRICS_PER_DOCUMENT):
                self._write([self._document(key, self._pending.pop(key))])
                group = self._pending.setdefault(key, {})
                series = None
            if series is None:
                series = group[point.name] = _Series(unit)
            series.values.append(point.value)

    def flush(self) -> None:
        """Write every gathered group as one EMF document, and forget them."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        self._oldest_at = None
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        self._write([self._document(key, group) for key, group in pending.items()])

    def _write(self, documents: list[str]) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write("".join(document + "\n" for document in documents))
        stream.flush()

    def _document(self, key: _GroupKey, group: dict[str, _Series]) -> str:
        # Imported here, not at module level: cold starts pay for every import, and a local
        # run with NoEmf never needs powertools.
        from aws_lambda_powertools.metrics import EphemeralMetrics

        binding, dimensions = key
        # A fresh provider per document: its dimension set is per instance. The metric set is
        # handed to serialize_metric_set() whole: add_metric() would print a document of its
        # own at 100 values, and serialize_metric_set() returns the document without printing.
        provider = EphemeralMetrics(namespace=self.namespace, service=self.service)
        for name, value in dimensions:
            provider.add_dimension(name=name, value=value)
        provider.add_dimension(name="binding", value=binding.value)
        metrics = {
            name: {"Unit": series.unit.value, "StorageResolution": 60, "Value": series.values}
            for name, series in group.items()
        }
        document = provider.serialize_metric_set(metrics=metrics)
        return json.dumps(document, separators=(",", ":"))
