"""The ``platform_metrics`` table: one row per data point, from either metrics binding.

Two bindings write here (spec, analytics-projector): ``EVENT_METRICS`` gets one data point per
fresh lifecycle Event from the analytics projector, ``METRICS`` gets the data points other
modules record themselves. A row is deduplicated on ``(binding, event_id, name)`` when it has
an ``event_id``, so a redelivered Event never counts twice; points without one always append.

The functions here never ``BEGIN`` or ``COMMIT``: they run inside the caller's transaction so
the rows commit (or roll back) together with whatever else the caller writes.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

__all__ = [
    "CLOUDWATCH_UNITS",
    "MAX_DIMENSIONS",
    "PLATFORM_METRICS_SCHEMA",
    "DataPoint",
    "MetricBinding",
    "StoredPoint",
    "insert_points",
    "metric_counts",
    "recent_points",
    "write_points",
]

# Each statement ends with ``;`` and there is no BEGIN/COMMIT, so the text can be concatenated
# into a larger ``executescript`` that runs inside an existing transaction.
PLATFORM_METRICS_SCHEMA = """
CREATE TABLE IF NOT EXISTS platform_metrics (
    id            INTEGER PRIMARY KEY,
    binding       TEXT NOT NULL CHECK (binding IN ('EVENT_METRICS', 'METRICS')),
    name          TEXT NOT NULL,
    value         REAL NOT NULL,
    unit          TEXT NOT NULL,
    dimensions    TEXT NOT NULL /* canonical JSON, sorted keys */,
    event_id      TEXT,
    project_id    TEXT,
    recorded_at_s REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS platform_metrics_event
    ON platform_metrics (binding, event_id, name) WHERE event_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS platform_metrics_name_time
    ON platform_metrics (name, recorded_at_s);
CREATE INDEX IF NOT EXISTS platform_metrics_binding_time
    ON platform_metrics (binding, recorded_at_s);
"""

#: The units CloudWatch accepts, spelled as CloudWatch spells them (``"None"`` included).
#: Checked when a :class:`DataPoint` is built, so a bad unit never reaches the table; a test
#: keeps this list equal to powertools' ``MetricUnit``.
CLOUDWATCH_UNITS: frozenset[str] = frozenset(
    {
        "Seconds",
        "Microseconds",
        "Milliseconds",
        "Bytes",
        "Kilobytes",
        "Megabytes",
        "Gigabytes",
        "Terabytes",
        "Bits",
        "Kilobits",
        "Megabits",
        "Gigabits",
        "Terabits",
        "Percent",
        "Count",
        "Bytes/Second",
        "Kilobytes/Second",
        "Megabytes/Second",
        "Gigabytes/Second",
        "Terabytes/Second",
        "Bits/Second",
        "Kilobits/Second",
        "Megabits/Second",
        "Gigabits/Second",
        "Terabits/Second",
        "Count/Second",
        "None",
    }
)

#: Dimensions a point may carry. Powertools allows 29 per EMF line (its MAX_DIMENSIONS); the
#: EMF sink adds ``binding`` and powertools adds ``service``, which leaves 27.
MAX_DIMENSIONS = 27

_METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
#: Added by the EMF sink to every line; a point may not set it itself.
_RESERVED_DIMENSIONS = frozenset({"binding", "service"})


class MetricBinding(StrEnum):
    """Which binding wrote a row (spec: both write to ``platform_metrics``)."""

    #: One point per fresh lifecycle Event, written by the analytics projector.
    EVENT_METRICS = "EVENT_METRICS"
    #: Points other modules record about themselves.
    METRICS = "METRICS"


def _frozen_dimensions(dimensions: Mapping[str, str]) -> Mapping[str, str]:
    problems = [
        f"{key!r}={value!r}"
        for key, value in dimensions.items()
        if not isinstance(key, str)
        or not isinstance(value, str)
        or not key.strip()
        or not value.strip()
    ]
    if problems:
        raise ValueError(
            f"dimensions {', '.join(problems)} are invalid: names and values must be "
            "non-empty strings (CloudWatch drops empty ones)"
        )
    reserved = sorted(_RESERVED_DIMENSIONS.intersection(dimensions))
    if reserved:
        raise ValueError(
            f"dimension name(s) {', '.join(map(repr, reserved))} are reserved: the EMF sink "
            "sets them on every line; rename the dimension"
        )
    if len(dimensions) > MAX_DIMENSIONS:
        raise ValueError(
            f"{len(dimensions)} dimensions ({', '.join(sorted(dimensions))}) exceed the "
            f"{MAX_DIMENSIONS} a point may carry; drop some"
        )
    # A private sorted copy: the caller's dict may change later, this point must not.
    return MappingProxyType(dict(sorted(dimensions.items())))


@dataclass(frozen=True, slots=True)
class DataPoint:
    """One measurement: ``value`` of ``unit`` for metric ``name``, with its dimensions.

    ``event_id`` makes the point idempotent: a second point with the same binding, event
    and name is ignored by :func:`write_points`. Raises :class:`ValueError` naming the value
    for a name that is not snake_case (``^[a-z][a-z0-9_]{0,62}$``), a unit CloudWatch does
    not know, a non-finite value, or bad dimensions.
    """

    name: str
    value: float = 1.0
    unit: str = "Count"
    # hash=False: a mapping is not hashable; equality still compares it.
    dimensions: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    event_id: str | None = None
    project_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _METRIC_NAME.match(self.name):
            raise ValueError(
                f"metric name {self.name!r} is not snake_case: use ^[a-z][a-z0-9_]{{0,62}}$, "
                "e.g. 'task_completed'"
            )
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise ValueError(f"metric {self.name} value {self.value!r} is not a number")
        if not math.isfinite(self.value):
            raise ValueError(
                f"metric {self.name} value {self.value!r} is not finite; CloudWatch rejects it"
            )
        if self.unit not in CLOUDWATCH_UNITS:
            raise ValueError(
                f"metric {self.name} unit {self.unit!r} is not a CloudWatch unit; use one of "
                f"{', '.join(sorted(CLOUDWATCH_UNITS))}"
            )
        for label, text in (("event_id", self.event_id), ("project_id", self.project_id)):
            if text is not None and not (isinstance(text, str) and text.strip()):
                raise ValueError(f"metric {self.name} {label} {text!r} must be non-empty or None")
        if self.name in self.dimensions:
            raise ValueError(
                f"dimension {self.name!r} has the metric's own name; in an EMF line both are "
                "top-level keys and one would overwrite the other; rename the dimension"
            )
        # object.__setattr__: the documented way to normalise a field of a frozen dataclass.
        object.__setattr__(self, "value", float(self.value))
        object.__setattr__(self, "dimensions", _frozen_dimensions(self.dimensions))


@dataclass(frozen=True, slots=True)
class StoredPoint:
    """A ``platform_metrics`` row as read back by :func:`recent_points`."""

    binding: MetricBinding
    name: str
    value: float
    unit: str
    dimensions: Mapping[str, str] = field(hash=False)
    event_id: str | None
    project_id: str | None
    recorded_at_s: float


def _canonical_json(dimensions: Mapping[str, str]) -> str:
    # Sorted keys and fixed separators: equal dimensions give equal text, so SQL can group
    # or compare on the column.
    return json.dumps(dict(dimensions), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def insert_points(
    connection: sqlite3.Connection,
    binding: MetricBinding,
    points: Iterable[DataPoint],
    *,
    now_s: float,
) -> tuple[DataPoint, ...]:
    """Insert ``points`` as rows of ``binding``; return the points actually written.

    Same as :func:`write_points`, but returns which points were new, so a caller can emit
    exactly those (and not a redelivered Event's point a second time) after it commits.
    """
    binding = MetricBinding(binding)
    written: list[DataPoint] = []
    for point in points:
        # INSERT OR IGNORE against the partial unique index: a point whose
        # (binding, event_id, name) is already stored changes no row (rowcount 0).
        cursor = connection.execute(
            "INSERT OR IGNORE INTO platform_metrics "
            "(binding, name, value, unit, dimensions, event_id, project_id, recorded_at_s) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                binding.value,
                point.name,
                point.value,
                point.unit,
                _canonical_json(point.dimensions),
                point.event_id,
                point.project_id,
                now_s,
            ),
        )
        if cursor.rowcount == 1:
            written.append(point)
    return tuple(written)


def write_points(
    connection: sqlite3.Connection,
    binding: MetricBinding,
    points: Iterable[DataPoint],
    *,
    now_s: float,
) -> int:
    """Insert ``points`` as ``platform_metrics`` rows of ``binding``; return rows written.

    Runs inside the **caller's** transaction: it never issues ``BEGIN`` or ``COMMIT``, so the
    rows land atomically with the caller's other writes (open one with ``BEGIN IMMEDIATE``
    first; on an autocommit connection without one, each row commits on its own). A point
    whose ``(binding, event_id, name)`` is already stored is skipped, so writing the same
    Event's point twice leaves one row. ``now_s`` (epoch seconds) becomes ``recorded_at_s``.
    """
    return len(insert_points(connection, binding, points, now_s=now_s))


def metric_counts(
    connection: sqlite3.Connection, binding: MetricBinding | None = None
) -> dict[str, int]:
    """Rows per metric name, sorted by name; only ``binding``'s rows when given."""
    if binding is None:
        rows = connection.execute(
            "SELECT name, COUNT(*) FROM platform_metrics GROUP BY name ORDER BY name"
        ).fetchall()
    else:
        rows = connection.execute(
            "SELECT name, COUNT(*) FROM platform_metrics WHERE binding = ? "
            "GROUP BY name ORDER BY name",
            (MetricBinding(binding).value,),
        ).fetchall()
    # Index by position: works whatever row_factory the connection uses.
    return {str(row[0]): int(row[1]) for row in rows}


def recent_points(connection: sqlite3.Connection, name: str, limit: int = 20) -> list[StoredPoint]:
    """The newest ``limit`` rows of metric ``name``, newest first (for dashboards and demos)."""
    if limit < 1:
        raise ValueError(f"limit={limit!r} must be at least 1")
    rows = connection.execute(
        "SELECT binding, name, value, unit, dimensions, event_id, project_id, recorded_at_s "
        "FROM platform_metrics WHERE name = ? ORDER BY recorded_at_s DESC, id DESC LIMIT ?",
        (name, limit),
    ).fetchall()
    return [
        StoredPoint(
            binding=MetricBinding(row[0]),
            name=row[1],
            value=float(row[2]),
            unit=row[3],
            dimensions=MappingProxyType(json.loads(row[4])),
            event_id=row[5],
            project_id=row[6],
            recorded_at_s=float(row[7]),
        )
        for row in rows
    ]
