"""The causal router's own SQLite file: Clef-flash decisions and calls, the command-cap counters.

One file, ``<state>/causal.sqlite``, kept apart from the product database (which this package
does not own). Every counter moves by a single conditional ``INSERT … ON CONFLICT DO UPDATE
… WHERE`` inside ``BEGIN IMMEDIATE``, so two routers (two processes, or two Lambda
invocations sharing EFS) can never push a daily cap past its limit: the second writer waits
for the first one's commit and then sees its count.

Metric rows are **not** kept here. :mod:`~rhumbatron.causal.clef_flash` and
:mod:`~rhumbatron.causal.command_cap` build their data points and hand them to the caller's
:class:`~rhumbatron.metrics.MetricsRecorder` (the ``METRICS`` binding in the product file),
so every ``platform_metrics`` row lives in one table that dashboards already read.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.clock import utc_day
from rhumbatron.core.settings import Settings

__all__ = [
    "CAUSAL_SCHEMA",
    "CausalStore",
    "CommandCount",
    "StoredDecision",
    "Verdict",
]

#: What Clef-flash answered for one (event, agent): wake, skip, or abstain (which wakes).
Verdict = Literal["wake", "skip", "abstain"]

CAUSAL_SCHEMA = """
CREATE TABLE IF NOT EXISTS clef_flash_decisions (
    event_id      TEXT NOT NULL,
    agent_id      TEXT NOT NULL,
    verdict       TEXT NOT NULL CHECK (verdict IN ('wake', 'skip', 'abstain')),
    probability   REAL,
    reason        TEXT NOT NULL,
    source        TEXT NOT NULL,
    model         TEXT NOT NULL,
    tenant_id     TEXT,
    decided_at_s  REAL NOT NULL,
    PRIMARY KEY (event_id, agent_id)
);
CREATE INDEX IF NOT EXISTS clef_flash_decisions_time ON clef_flash_decisions (decided_at_s);
CREATE TABLE IF NOT EXISTS clef_flash_calls (
    day    TEXT NOT NULL /* UTC YYYY-MM-DD */,
    scope  TEXT NOT NULL /* '*' for the deployment, else 'tenant:<id>' */,
    calls  INTEGER NOT NULL,
    PRIMARY KEY (day, scope)
);
CREATE TABLE IF NOT EXISTS change_command_counts (
    day        TEXT NOT NULL /* UTC YYYY-MM-DD */,
    change_id  TEXT NOT NULL,
    admitted   INTEGER NOT NULL DEFAULT 0,
    dropped    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, change_id)
);
CREATE TABLE IF NOT EXISTS change_command_admissions (
    day         TEXT NOT NULL,
    command_id  TEXT NOT NULL,
    change_id   TEXT NOT NULL,
    admitted    INTEGER NOT NULL CHECK (admitted IN (0, 1)),
    PRIMARY KEY (day, command_id)
);
"""


@dataclass(frozen=True, slots=True)
class StoredDecision:
    """A ``clef_flash_decisions`` row: the first answer for one (event, agent)."""

    event_id: str
    agent_id: str
    verdict: Verdict
    probability: float | None
    reason: str
    source: str
    model: str
    tenant_id: str | None
    decided_at_s: float


@dataclass(frozen=True, slots=True)
class CommandCount:
    """One Change's counted commands on one UTC day: admitted, and dropped past the cap."""

    admitted: int = 0
    dropped: int = 0


class CausalStore(SqliteStore):
    """``<state>/causal.sqlite``: see the module docstring.

    Every method is one short transaction; none calls the network. Opened on first use.
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings.state_dir / "causal.sqlite", settings, CAUSAL_SCHEMA)

    # -- Clef-flash decisions ---------------------------------------------------------------

    def decision(self, event_id: str, agent_id: str) -> StoredDecision | None:
        """The recorded decision for ``(event_id, agent_id)``, or None if never asked."""
        row = self._read(
            "SELECT event_id, agent_id, verdict, probability, reason, source, model, "
            "tenant_id, decided_at_s FROM clef_flash_decisions "
            "WHERE event_id = ? AND agent_id = ?",
            (event_id, agent_id),
        )
        return None if not row else _decision(row[0])

    def record_decision(self, decision: StoredDecision) -> StoredDecision:
        """Keep ``decision`` unless one exists already; return the one that is kept.

        The first writer wins: when two routers asked for the same (event, agent) at the same
        time, both go on with the same stored answer, so a later replay agrees with them.
        """
        with self.transaction() as connection:
            connection.execute(
                "INSERT OR IGNORE INTO clef_flash_decisions (event_id, agent_id, verdict, "
                "probability, reason, source, model, tenant_id, decided_at_s) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    decision.event_id,
                    decision.agent_id,
                    decision.verdict,
                    decision.probability,
                    decision.reason,
                    decision.source,
                    decision.model,
                    decision.tenant_id,
                    decision.decided_at_s,
                ),
            )
            row = connection.execute(
                "SELECT event_id, agent_id, verdict, probability, reason, source, model, "
                "tenant_id, decided_at_s FROM clef_flash_decisions "
                "WHERE event_id = ? AND agent_id = ?",
                (decision.event_id, decision.agent_id),
            ).fetchone()
        return _decision(row)

    def decisions(self, event_id: str | None = None) -> list[StoredDecision]:
        """Recorded decisions (of one event when given), oldest first: for demos and tests."""
        sql = (
            "SELECT event_id, agent_id, verdict, probability, reason, source, model, "
            "tenant_id, decided_at_s FROM clef_flash_decisions"
        )
        params: tuple[str, ...] = ()
        if event_id is not None:
            sql += " WHERE event_id = ?"
            params = (event_id,)
        return [_decision(row) for row in self._read(sql + " ORDER BY decided_at_s, rowid", params)]

    # -- Clef-flash daily calls -------------------------------------------------------------

    def reserve_call(self, day: str, scope: str, cap: int) -> bool:
        """Count one model call for ``scope`` on ``day`` if fewer than ``cap`` were counted.

        Called **before** the call: a reservation is spent even if the call then fails, which
        is what keeps concurrent routers (and a crash after the HTTP request) under the cap.
        """
        if cap <= 0:
            return False
        with self.transaction() as connection:
            # The WHERE of the upsert makes the increment conditional: at the cap, the row
            # stays as it is and rowcount is 0.
            cursor = connection.execute(
                "INSERT INTO clef_flash_calls (day, scope, calls) VALUES (?, ?, 1) "
                "ON CONFLICT (day, scope) DO UPDATE SET calls = calls + 1 WHERE calls < ?",
                (day, scope, cap),
            )
            return cursor.rowcount == 1

    def calls(self, day: str, scope: str) -> int:
        """Model calls counted for ``scope`` on ``day``."""
        rows = self._read(
            "SELECT calls FROM clef_flash_calls WHERE day = ? AND scope = ?", (day, scope)
        )
        return int(rows[0][0]) if rows else 0

    # -- the command cap --------------------------------------------------------------------

    def admit_command(
        self, day: str, change_id: str, cap: int, command_id: str | None = None
    ) -> tuple[bool, bool]:
        """Admit one counted command of ``change_id`` on ``day`` if under ``cap``.

        Returns ``(admitted, first_time)``. With a ``command_id``, a repeat of the same
        command on the same day (a redelivered Event plans the same command IDs) gets the
        first verdict again and counts nothing: ``first_time`` is then False.
        """
        with self.transaction() as connection:
            if command_id is not None:
                row = connection.execute(
                    "SELECT admitted FROM change_command_admissions "
                    "WHERE day = ? AND command_id = ?",
                    (day, command_id),
                ).fetchone()
                if row is not None:
                    return bool(row[0]), False
            cursor = connection.execute(
                "INSERT INTO change_command_counts (day, change_id, admitted) VALUES (?, ?, 1) "
                "ON CONFLICT (day, change_id) DO UPDATE SET admitted = admitted + 1 "
                "WHERE admitted < ?",
                (day, change_id, cap),
            )
            admitted = cursor.rowcount == 1
            if not admitted:
                connection.execute(
                    "UPDATE change_command_counts SET dropped = dropped + 1 "
                    "WHERE day = ? AND change_id = ?",
                    (day, change_id),
                )
            if command_id is not None:
                connection.execute(
                    "INSERT INTO change_command_admissions (day, command_id, change_id, admitted)"
                    " VALUES (?, ?, ?, ?)",
                    (day, command_id, change_id, int(admitted)),
                )
            return admitted, True

    def command_count(self, day: str, change_id: str) -> CommandCount:
        """What the cap counted for ``change_id`` on ``day``."""
        rows = self._read(
            "SELECT admitted, dropped FROM change_command_counts WHERE day = ? AND change_id = ?",
            (day, change_id),
        )
        return CommandCount(int(rows[0][0]), int(rows[0][1])) if rows else CommandCount()

    # -- retention --------------------------------------------------------------------------

    def prune(self, *, before_s: float, limit: int) -> int:
        """Delete at most ``limit`` rows of each table written before ``before_s`` (decisions
        by their time, the daily counters and admissions by their UTC day); return how many.

        Every table here grows with the routed Events (a decision per ambiguous (event,
        agent), an admission per counted command, a counter per Change and day), and none is
        read once its Event can no longer come back: the router calls this with its claims'
        retention (14 days), past which a redelivery is no longer deduplicated anyway.
        """
        before_day = utc_day(datetime.fromtimestamp(before_s, UTC))
        deleted = 0
        with self.transaction() as connection:
            deleted += connection.execute(
                "DELETE FROM clef_flash_decisions WHERE rowid IN (SELECT rowid FROM "
                "clef_flash_decisions WHERE decided_at_s < ? LIMIT ?)",
                (before_s, limit),
            ).rowcount
            for table in ("change_command_admissions", "change_command_counts", "clef_flash_calls"):
                deleted += connection.execute(
                    f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
                    "WHERE day < ? LIMIT ?)",
                    (before_day, limit),
                ).rowcount
        return deleted

    def _read(self, sql: str, params: tuple[object, ...]) -> list[sqlite3.Row]:
        # Under the store's lock: the connection is shared by the process's threads, and a
        # read between another thread's BEGIN and COMMIT would see its uncommitted rows.
        with self._lock:
            rows: list[sqlite3.Row] = self.connection.execute(sql, params).fetchall()
        return rows


def _decision(row: sqlite3.Row) -> StoredDecision:
    return StoredDecision(
        event_id=str(row[0]),
        agent_id=str(row[1]),
        verdict=_verdict(str(row[2])),
        probability=None if row[3] is None else float(row[3]),
        reason=str(row[4]),
        source=str(row[5]),
        model=str(row[6]),
        tenant_id=None if row[7] is None else str(row[7]),
        decided_at_s=float(row[8]),
    )


def _verdict(text: str) -> Verdict:
    # The CHECK constraint keeps the column to these three; this narrows the type for mypy.
    if text == "wake":
        return "wake"
    if text == "skip":
        return "skip"
    if text == "abstain":
        return "abstain"
    raise ValueError(f"clef_flash_decisions.verdict {text!r} is not wake, skip or abstain")
