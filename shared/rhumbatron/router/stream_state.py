"""Router state per event stream: ``<state>/router/stream-NN.sqlite``.

One file per stream, so the 8 streams never queue behind one writer. It holds the claims of
the subscriptions whose effect leaves SQLite (causal-router, audit-archiver) and the failure
counts of every subscription on the stream (``k2_batch_failures``).

Failures count per ``(consumer, event key)`` (DECISIONS): JetStream redelivers per message, so
a batch recomposed on redelivery still brings each failing event to its 5th failure.
"""

from __future__ import annotations

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.settings import Settings
from rhumbatron.router.claims import CLAIMS_SCHEMA

__all__ = ["StreamState"]

_FAILURES_SCHEMA = """
CREATE TABLE IF NOT EXISTS k2_batch_failures (
    consumer          TEXT NOT NULL,
    batch_key         TEXT NOT NULL,
    failures          INTEGER NOT NULL,
    first_failed_at_s REAL NOT NULL,
    last_failed_at_s  REAL NOT NULL,
    last_error        TEXT NOT NULL,
    PRIMARY KEY (consumer, batch_key)
) WITHOUT ROWID;
"""


class StreamState(SqliteStore):
    """The router's SQLite file for one event stream."""

    def __init__(self, settings: Settings, stream_index: int) -> None:
        super().__init__(
            settings.state_dir / "router" / f"stream-{stream_index:02d}.sqlite",
            settings,
            CLAIMS_SCHEMA + _FAILURES_SCHEMA,
        )
        self.stream_index = stream_index

    def count_failure(self, consumer: str, key: str, error: str, *, now_s: float) -> int:
        """Count one more failure of ``key`` for ``consumer``; return the new count."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO k2_batch_failures (consumer, batch_key, failures, "
                "first_failed_at_s, last_failed_at_s, last_error) VALUES (?, ?, 1, ?, ?, ?) "
                "ON CONFLICT (consumer, batch_key) DO UPDATE SET failures = failures + 1, "
                "last_failed_at_s = excluded.last_failed_at_s, last_error = excluded.last_error",
                (consumer, key, now_s, now_s, error[:2000]),
            )
            row = db.execute(
                "SELECT failures FROM k2_batch_failures WHERE consumer = ? AND batch_key = ?",
                (consumer, key),
            ).fetchone()
        return int(row[0])

    def failures(self, consumer: str, key: str) -> int:
        row = self.connection.execute(
            "SELECT failures FROM k2_batch_failures WHERE consumer = ? AND batch_key = ?",
            (consumer, key),
        ).fetchone()
        return 0 if row is None else int(row[0])
