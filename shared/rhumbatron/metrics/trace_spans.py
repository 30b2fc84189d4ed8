"""The local span store: ``<state>/traces.sqlite``, what the dashboard draws a Change's
timeline from.

Installed as the process's :class:`~rhumbatron.core.tracing.SpanSink` when ``trace_spans``
is on (``rhumbatron up``, ``make demo``; never in Lambda, where X-Ray holds the traces). A
span is kept once per trace it belongs to: its own, and the trace of each Change of another
trace it stamped (an API call that created a Change).

Spans are buffered and written in one transaction every ``flush_every_s`` or
``flush_rows`` spans, without fsync (``synchronous=OFF``: a crash loses the last spans, never
anything else), and each flush deletes the oldest rows beyond ``trace_spans_max_rows``, so
the file never grows without end. A file of its own: span writes never queue behind the
product database's writers.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rhumbatron.actors.storage import open_with_schema, schema_version
from rhumbatron.core.settings import Settings
from rhumbatron.core.tracing import Span, install_span_sink
from rhumbatron.protocol.tracecontext import change_trace_id

__all__ = ["SPANS_SCHEMA", "SpanRow", "SpanStore", "install_span_store"]

SPANS_SCHEMA = """
CREATE TABLE IF NOT EXISTS spans (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    trace_id   TEXT NOT NULL,
    span_id    TEXT NOT NULL,
    parent_id  TEXT,
    name       TEXT NOT NULL,
    start_s    REAL NOT NULL,
    end_s      REAL NOT NULL,
    project_id TEXT,
    change_id  TEXT,
    link       TEXT,
    error      TEXT
);
CREATE INDEX IF NOT EXISTS spans_by_trace ON spans (trace_id, start_s);
CREATE INDEX IF NOT EXISTS spans_by_change ON spans (change_id, seq)
    WHERE change_id IS NOT NULL;
"""

_COLUMNS = "trace_id, span_id, parent_id, name, start_s, end_s, project_id, change_id, link, error"


@dataclass(frozen=True, slots=True)
class SpanRow:
    """One stored span, in one trace."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_s: float
    end_s: float
    project_id: str | None
    change_id: str | None
    link: str | None
    error: str | None


class SpanStore:
    """``<state>/traces.sqlite``: buffered writes, bounded rows, reads by trace."""

    def __init__(
        self,
        settings: Settings,
        *,
        flush_every_s: float = 0.5,
        flush_rows: int = 256,
    ) -> None:
        self.path: Path = settings.state_dir / "traces.sqlite"
        self._settings = settings
        self._max_rows = settings.trace_spans_max_rows
        self._flush_every_s = flush_every_s
        self._flush_rows = flush_rows
        self._buffer: list[tuple[object, ...]] = []
        self._flushed_at = time.monotonic()
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = open_with_schema(
                self.path,
                self._settings,
                SPANS_SCHEMA,
                version=schema_version(SPANS_SCHEMA),
                what="trace spans",
            )
            self._connection.execute("PRAGMA synchronous=OFF")
        return self._connection

    def record(self, finished: Span) -> None:
        """Keep ``finished`` in its trace and in the trace of each Change it touched."""
        end_s = finished.end_s if finished.end_s is not None else time.time()
        common = (finished.parent_id, finished.name, finished.start_s, end_s)
        rows: list[tuple[object, ...]] = [
            (
                finished.context.trace_id,
                finished.context.span_id,
                *common,
                finished.project_id,
                finished.change_id,
                finished.link,
                finished.error,
            )
        ]
        for project_id, change_id in sorted(finished.touched):
            rows.append(
                (
                    change_trace_id(project_id, change_id),
                    finished.context.span_id,
                    *common,
                    project_id,
                    change_id,
                    finished.link,
                    finished.error,
                )
            )
        with self._lock:
            self._buffer.extend(rows)
            due = time.monotonic() - self._flushed_at >= self._flush_every_s
            if due or len(self._buffer) >= self._flush_rows:
                self._flush_locked()

    def flush(self) -> None:
        """Write the buffered spans now (a read does it first)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        self._flushed_at = time.monotonic()
        if not self._buffer:
            return
        rows, self._buffer = self._buffer, []
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                f"INSERT INTO spans ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )
            db.execute(
                "DELETE FROM spans WHERE seq <= (SELECT MAX(seq) FROM spans) - ?",
                (self._max_rows,),
            )
            db.execute("COMMIT")
        except sqlite3.Error:
            db.execute("ROLLBACK")
            raise

    def trace(self, trace_id: str) -> list[SpanRow]:
        """The spans of ``trace_id``, by start time."""
        with self._lock:
            self._flush_locked()
            cursor = self._db().execute(
                f"SELECT {_COLUMNS} FROM spans WHERE trace_id = ? ORDER BY start_s, seq",
                (trace_id,),
            )
            return [SpanRow(*tuple(row)) for row in cursor]

    def change(self, project_id: str, change_id: str) -> list[SpanRow]:
        """The spans of the Change's trace, by start time."""
        return self.trace(change_trace_id(project_id, change_id))

    def recent_changes(self, limit: int = 20) -> list[tuple[str, str]]:
        """``(project_id, change_id)`` of the Changes with spans, the latest first."""
        with self._lock:
            self._flush_locked()
            cursor = self._db().execute(
                "SELECT project_id, change_id, MAX(seq) AS last FROM spans "
                "WHERE change_id IS NOT NULL AND project_id IS NOT NULL "
                "GROUP BY project_id, change_id ORDER BY last DESC LIMIT ?",
                (limit,),
            )
            return [(str(row[0]), str(row[1])) for row in cursor]

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._flush_locked()
                self._connection.close()
                self._connection = None


_stores: dict[Path, SpanStore] = {}
_stores_lock = threading.Lock()


def install_span_store(settings: Settings) -> SpanStore:
    """The process's span store for ``settings.state_dir``, installed as a span sink once
    (the API's runtime and the roles' runtime of ``rhumbatron up`` share it)."""
    path = settings.state_dir / "traces.sqlite"
    with _stores_lock:
        store = _stores.get(path)
        if store is None:
            store = _stores[path] = SpanStore(settings)
            install_span_sink(store)
        return store
