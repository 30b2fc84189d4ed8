"""Recording data points: the ``METRICS`` binding for any module, and the analytics write path.

:class:`MetricsRecorder` is what a module holds to count something about itself: each
:meth:`~MetricsRecorder.record` is one short ``BEGIN IMMEDIATE`` … ``COMMIT`` on the metrics
file, then the committed points go to the sink (EMF in Lambda).

:func:`record_event_points` is the analytics projector's half: it writes ``EVENT_METRICS``
rows inside the projector's own transaction (with its claim rows), and returns the new
points for the projector to emit **after** its ``COMMIT`` — an EMF line sent before a commit
that then rolls back would count an Event the table never kept, and count it again on
redelivery.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from rhumbatron.actors.storage import SqliteStore, sqlite_error, write_transaction
from rhumbatron.core.clock import Clock
from rhumbatron.metrics.emf import MetricsSink
from rhumbatron.metrics.platform_metrics import DataPoint, MetricBinding, insert_points

__all__ = ["EVENT_METRICS_PER_TICK", "MetricsRecorder", "record_event_points"]

#: Spec (analytics-projector): at most 100 ``EVENT_METRICS`` data points per tick.
EVENT_METRICS_PER_TICK = 100


def _database_path(connection: sqlite3.Connection) -> Path:
    # Only for error messages: write_transaction names the file it could not write.
    for row in connection.execute("PRAGMA database_list").fetchall():
        if row[1] == "main":
            return Path(row[2] or ":memory:")
    return Path(":memory:")


class MetricsRecorder:
    """Writes ``METRICS`` rows in their own short transaction, then emits them to the sink.

    ``connection`` is a :class:`~rhumbatron.actors.storage.SqliteStore` (the product
    database: each record then takes the store's transaction, and its lock, so it never meets
    another thread's open transaction on the shared connection), an open connection, or a
    factory called once, at the first :meth:`record` (nothing is opened at construction:
    cold starts pay for it). A connection
    the recorder opened itself is closed by :meth:`close`; one passed in stays the caller's.
    The connection should be in autocommit mode (``isolation_level=None``, as
    :func:`~rhumbatron.actors.storage.open_database` opens it) with the
    :data:`~rhumbatron.metrics.PLATFORM_METRICS_SCHEMA` tables created.
    """

    def __init__(
        self,
        connection: SqliteStore | Callable[[], sqlite3.Connection] | sqlite3.Connection,
        sink: MetricsSink,
        clock: Clock,
    ) -> None:
        self._store: SqliteStore | None = None
        self._connection: sqlite3.Connection | None = None
        self._factory: Callable[[], sqlite3.Connection] | None = None
        if isinstance(connection, SqliteStore):
            self._store = connection
        elif isinstance(connection, sqlite3.Connection):
            self._connection = connection
        else:
            self._factory = connection
        self._sink = sink
        self._clock = clock

    def _open(self) -> sqlite3.Connection:
        if self._connection is None:
            assert self._factory is not None  # one of the two is always set
            self._connection = self._factory()
        return self._connection

    def record(self, points: Sequence[DataPoint]) -> int:
        """Write ``points`` as ``METRICS`` rows, commit, emit the new ones; return how many.

        All points commit together or not at all. On a failed write the transaction rolls
        back, nothing is emitted, and :class:`~rhumbatron.errors.ActorError` (or
        :class:`~rhumbatron.errors.ActorBusyError` past the busy timeout) names the file.
        A point whose ``event_id`` and name were already recorded is neither written nor
        emitted again.
        """
        if not points:
            return 0
        now_s = self._clock.now().timestamp()
        if self._store is not None:
            with self._store.transaction() as connection:
                written = _insert(connection, self._store.path, points, now_s)
        else:
            connection = self._open()
            with write_transaction(connection, _database_path(connection)):
                written = _insert(connection, _database_path(connection), points, now_s)
        # Only after COMMIT: an emitted point must be one the table kept.
        self._sink.emit(MetricBinding.METRICS, written)
        return len(written)

    def record_one(
        self, name: str, value: float = 1.0, unit: str = "Count", **dimensions: str
    ) -> int:
        """Record one point; ``dimensions`` as keyword arguments. Returns rows written (0/1)."""
        return self.record([DataPoint(name=name, value=value, unit=unit, dimensions=dimensions)])

    def close(self) -> None:
        """Close the connection if this recorder opened it; a passed-in one stays open."""
        if self._factory is not None and self._connection is not None:
            self._connection.close()
            self._connection = None


def _insert(
    connection: sqlite3.Connection, path: Path, points: Sequence[DataPoint], now_s: float
) -> tuple[DataPoint, ...]:
    try:
        return insert_points(connection, MetricBinding.METRICS, points, now_s=now_s)
    except sqlite3.Error as exc:
        # Re-raised as a Rhumbatron error; the transaction rolls back on the way out.
        raise sqlite_error(exc, path, "cannot write METRICS rows") from exc


def record_event_points(
    connection: sqlite3.Connection, points: Sequence[DataPoint], *, now_s: float
) -> tuple[DataPoint, ...]:
    """Write ``EVENT_METRICS`` rows inside the caller's transaction; return the new points.

    Does not ``BEGIN`` or ``COMMIT``. The caller emits the returned points with
    ``sink.emit(MetricBinding.EVENT_METRICS, new_points)`` after its own ``COMMIT``.
    Raises :class:`ValueError` for more than :data:`EVENT_METRICS_PER_TICK` points: the
    projector must fetch smaller batches.
    """
    if len(points) > EVENT_METRICS_PER_TICK:
        raise ValueError(
            f"{len(points)} EVENT_METRICS points in one tick exceed the cap of "
            f"{EVENT_METRICS_PER_TICK}; fetch at most {EVENT_METRICS_PER_TICK} Events per tick"
        )
    return insert_points(connection, MetricBinding.EVENT_METRICS, points, now_s=now_s)
