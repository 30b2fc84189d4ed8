"""(c) Actor transactions against plain sqlite3 writing the same two rows.

An actor transaction here is ``ResourceShard.apply(AppendChangeEvents(...))`` with one
``task.ready`` fact for a new Change: one ``changes`` row (the state) and one ``outbox`` row,
in one ``BEGIN IMMEDIATE`` … ``COMMIT``. The plain-sqlite3 baseline runs the same two statements
(the upsert the actor's patch compiles to, and the outbox ``INSERT OR IGNORE``) with
pre-built parameters, on a file with the same schema and the same pragmas (journal mode,
``synchronous=FULL``, busy timeout, foreign keys). Both pay one commit, so the ratio is the
cost of the package's work around the SQL: the decision, the Event envelope (validation,
stable ID, JSON) and the alarm check.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

from rhumbatron.actors.actor import ActorKind, ActorRef
from rhumbatron.actors.alarms import ALARM_SCHEMA
from rhumbatron.actors.outbox import OUTBOX_SCHEMA
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.protocol.ids import stable_event_id, stream_index

__all__ = ["PROJECT", "ActorWriter", "PlainWriter"]

PROJECT = "bench-sqlite"
_CALLER = Caller("tenant-bench", "system:bench", "corr-sqlite")
_FACT = (ChangeFact("task.ready", {"agent_role": "builder"}, task_id="task-000001"),)
_UPSERT_CHANGE = (
    "INSERT INTO changes (change_id, status, updated_at) VALUES (?, ?, ?) "
    "ON CONFLICT (change_id) DO UPDATE SET status = excluded.status, "
    "updated_at = excluded.updated_at"
)
_INSERT_OUTBOX = (
    "INSERT OR IGNORE INTO outbox "
    "(event_id, project_id, event_type, stream_index, envelope, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)


def _settings(state_dir: Path, journal_mode: str) -> Settings:
    return load_settings(
        state_dir=state_dir,
        journal_mode=journal_mode,
        sqlite_synchronous="FULL",
        network_filesystem=False,
    )


class ActorWriter:
    """Real ResourceShard transactions on one actor file."""

    def __init__(self, state_dir: Path, journal_mode: str) -> None:
        self.shard = ResourceShard(
            ActorRef(ActorKind.RESOURCE_SHARD, PROJECT, 0), _settings(state_dir, journal_mode)
        )
        _ = self.shard.connection  # open the file and create the schema before timing

    def run(self, label: str, count: int) -> float:
        """``count`` transactions, each a new Change (one state row + one outbox row)."""
        started = time.perf_counter()
        for number in range(count):
            result = self.shard.apply(
                _CALLER,
                AppendChangeEvents(
                    change_id=f"chg-{label}-{number:06d}", status="running", facts=_FACT
                ),
            )
            if result.events_added != 1:
                raise RuntimeError(f"transaction {number} added {result.events_added} rows")
        return time.perf_counter() - started

    def close(self) -> None:
        """Close the actor file."""
        self.shard.close()


class PlainWriter:
    """The same two statements per transaction through plain sqlite3, parameters pre-built."""

    def __init__(self, path: Path, journal_mode: str, envelope: bytes) -> None:
        settings = _settings(path.parent, journal_mode)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.connection = sqlite3.connect(path, isolation_level=None)
        self.connection.execute(f"PRAGMA journal_mode={settings.journal_mode}")
        self.connection.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        self.connection.execute(f"PRAGMA busy_timeout={settings.sqlite_busy_timeout_ms}")
        self.connection.execute("PRAGMA foreign_keys=ON")
        self.connection.executescript(
            "BEGIN IMMEDIATE;"
            + OUTBOX_SCHEMA
            + ALARM_SCHEMA
            + ResourceShard.STATE_SCHEMA
            + "COMMIT;"
        )
        self.envelope = envelope
        self.index = stream_index(PROJECT)

    def run(self, label: str, count: int) -> float:
        """``count`` transactions of the two statements; parameters are built before timing."""
        now = datetime.now(UTC)
        stamp, now_s = now.isoformat(), now.timestamp()
        params = []
        for number in range(count):
            change_id = f"chg-{label}-{number:06d}"
            event_id = stable_event_id(change_id, "task.ready", "task-000001")
            params.append(
                (
                    (change_id, "running", stamp),
                    (event_id, PROJECT, "task.ready", self.index, self.envelope, now_s),
                )
            )
        execute = self.connection.execute
        started = time.perf_counter()
        for change_row, outbox_row in params:
            execute("BEGIN IMMEDIATE")
            execute(_UPSERT_CHANGE, change_row)
            execute(_INSERT_OUTBOX, outbox_row)
            execute("COMMIT")
        return time.perf_counter() - started

    def close(self) -> None:
        """Close the plain sqlite3 connection."""
        self.connection.close()


def sample_envelope(state_dir: Path) -> bytes:
    """One envelope as the actor writes it, so the baseline stores rows of the same size."""
    writer = ActorWriter(state_dir, "WAL")
    try:
        writer.run("sample", 1)
        row = writer.shard.connection.execute("SELECT envelope FROM outbox LIMIT 1").fetchone()
        return bytes(row[0])
    finally:
        writer.close()
