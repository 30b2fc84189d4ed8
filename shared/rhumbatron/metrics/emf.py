"""Where data points go besides ``platform_metrics``: CloudWatch EMF lines in Lambda.

In Lambda, a JSON line in CloudWatch embedded metric format (EMF) on stdout becomes a
CloudWatch metric asynchronously: no API call, no latency on the invocation. :class:`EmfSink`
builds each line with aws-lambda-powertools and writes it itself, so a test can pass a
``stream`` and parse what came out. Locally the default is :class:`NoEmf`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
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


class NoEmf:
    """Publishes nothing: the local default, where ``platform_metrics`` is the only record."""

    def emit(self, binding: MetricBinding, points: Sequence[DataPoint]) -> None:
        return None


@dataclass
class RecordingSink:
    """Keeps every emitted point in order, with its binding: a test double."""

    emitted: list[tuple[MetricBinding, DataPoint]] = field(default_factory=list)

    def emit(self, binding: MetricBinding, points: Sequence[DataPoint]) -> None:
        self.emitted.extend((MetricBinding(binding), point) for point in points)

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


class EmfSink:
    """Writes one CloudWatch EMF JSON line per data point.

    Each line carries the point's dimensions plus ``binding`` (and powertools' ``service``),
    so points with different dimensions never share a line. The EMF timestamp is the time of
    emission. Lines go to ``stream``, or to ``sys.stdout`` at the time of the call when
    ``stream`` is None (Lambda forwards stdout to CloudWatch Logs, which extracts the metric).
    """

    def __init__(
        self,
        namespace: str = "Rhumbatron",
        service: str = "rhumbatron",
        stream: TextIO | None = None,
    ) -> None:
        if not namespace.strip():
            raise ValueError(f"EMF namespace {namespace!r} must not be empty")
        if not service.strip():
            raise ValueError(f"EMF service {service!r} must not be empty")
        self.namespace = namespace
        self.service = service
        self._stream = stream

    def emit(self, binding: MetricBinding, points: Sequence[DataPoint]) -> None:
        """Write one EMF line per point; raises :class:`ValueError` for an unknown unit."""
        if not points:
            return
        binding = MetricBinding(binding)
        # Convert every unit before writing anything: a bad point must not leave half a batch.
        units = [_metric_unit(point.unit) for point in points]
        lines = [
            self._line(binding, point, unit) for point, unit in zip(points, units, strict=True)
        ]
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write("".join(line + "\n" for line in lines))
        stream.flush()

    def _line(self, binding: MetricBinding, point: DataPoint, unit: MetricUnit) -> str:
        # Imported here, not at module level: cold starts pay for every import, and a local
        # run with NoEmf never needs powertools.
        from aws_lambda_powertools.metrics import EphemeralMetrics

        # A fresh provider per point: its dimension set is per instance, so each line gets
        # exactly this point's dimensions. serialize_metric_set() returns the EMF document
        # without printing it, unlike flush_metrics() or single_metric().
        provider = EphemeralMetrics(namespace=self.namespace, service=self.service)
        provider.add_metric(name=point.name, unit=unit, value=point.value)
        for name, value in point.dimensions.items():
            provider.add_dimension(name=name, value=value)
        provider.add_dimension(name="binding", value=binding.value)
        document = provider.serialize_metric_set()
        return json.dumps(document, separators=(",", ":"))
