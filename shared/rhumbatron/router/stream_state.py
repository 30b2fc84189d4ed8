"""Router state per event stream: ``<state>/router/stream-NN.sqlite``.

One file per stream, so the 8 streams never queue behind one writer. It holds the claims of
the subscriptions whose effect leaves SQLite (causal-router, audit-archiver), the failure
counts of every subscription on the stream (``k2_batch_failures``), and the stream's nudge
turn (``nudge_turn``): which process runs its nudges now, and whether one more was asked for.

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


# One row: the process whose nudge run holds the stream until ``expires_at_s`` (its
# invocation's deadline: a holder that dies frees the turn then), and whether a nudge arrived
# while it ran (``pending``), to be run by the holder instead of beside it.
_NUDGE_TURN_SCHEMA = """
CREATE TABLE IF NOT EXISTS nudge_turn (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    holder       TEXT,
    expires_at_s REAL NOT NULL,
    pending      INTEGER NOT NULL
);
"""


class StreamState(SqliteStore):
    """The router's SQLite file for one event stream."""

    def __init__(self, settings: Settings, stream_index: int) -> None:
        super().__init__(
            settings.state_dir / "router" / f"stream-{stream_index:02d}.sqlite",
            settings,
            CLAIMS_SCHEMA + _FAILURES_SCHEMA + _NUDGE_TURN_SCHEMA,
        )

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

    # -- the nudge turn: one nudge run in flight per stream, at most one pending ------------

    def take_nudge_turn(self, holder: str, *, now_s: float, hold_s: float) -> bool:
        """Take the stream's nudge turn for ``hold_s``; False when another live run holds it.

        A nudge that finds the turn held is merged: the turn is marked pending, and its holder
        runs once more when its run ends (:meth:`next_nudge_turn`), so nudges arriving during a
        run cost one more run, not one each. A turn whose holder's time ran out is free.
        """
        with self.transaction() as db:
            row = db.execute("SELECT holder, expires_at_s FROM nudge_turn WHERE id = 1").fetchone()
            if row is not None and row[0] is not None and row[0] != holder and row[1] > now_s:
                db.execute("UPDATE nudge_turn SET pending = 1 WHERE id = 1")
                return False
            db.execute(
                "INSERT INTO nudge_turn (id, holder, expires_at_s, pending) VALUES (1, ?, ?, 0) "
                "ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, "
                "expires_at_s = excluded.expires_at_s, pending = 0",
                (holder, now_s + hold_s),
            )
            return True

    def next_nudge_turn(
        self, holder: str, *, now_s: float, hold_s: float, left_waiting: bool = False
    ) -> bool:
        """After ``holder``'s run: True, still holding, when a nudge was merged meanwhile or
        the run ``left_waiting`` records it fetched (run again); otherwise the turn is given
        back. False too when the turn is no longer ``holder``'s (its time ran out and another
        run took it)."""
        with self.transaction() as db:
            row = db.execute("SELECT holder, pending FROM nudge_turn WHERE id = 1").fetchone()
            if row is None or row[0] != holder:
                return False
            if row[1] or left_waiting:
                db.execute(
                    "UPDATE nudge_turn SET pending = 0, expires_at_s = ? WHERE id = 1",
                    (now_s + hold_s,),
                )
                return True
            db.execute("UPDATE nudge_turn SET holder = NULL WHERE id = 1")
            return False

    def last_nudge_turn_s(self) -> float | None:
        """When the last nudge turn taken on this stream ends (its holder's deadline); None
        when no nudge ever took one."""
        row = self.connection.execute("SELECT expires_at_s FROM nudge_turn WHERE id = 1").fetchone()
        return None if row is None else float(row[0])

    def give_back_nudge_turn(self, holder: str) -> None:
        """Give the turn back now (out of time, or the run failed); a pending nudge stays
        pending, for the next nudge or the sweep."""
        with self.transaction() as db:
            db.execute("UPDATE nudge_turn SET holder = NULL WHERE id = 1 AND holder = ?", (holder,))
