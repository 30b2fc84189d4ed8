"""The outbox table of an actor file, and every state change of its rows.

::

    [*] ──► pending ──► published ──► [*]
              │  ▲
              │  └── retry_wait   (backoff 1 s, 2 s, 4 s … max 5 min, ±20 % jitter)
              ▼          │
            failed ◄─────┘        (10th failed attempt; or no producer binding; or a row
              │                    that cannot be sent at all: oversize, damaged)
              ▼
             [*]   (an operator requeue puts failed rows back to pending, attempts reset)

A ``retry_wait`` row is not rewritten to ``pending`` when its backoff ends: it is simply due
again once ``next_attempt_at`` has passed, and is sent like a pending row.

``event_id`` is UNIQUE and rows are inserted with ``INSERT OR IGNORE``: a retried workflow
step that writes the same Event ID is a no-op. The envelope of a row can never be updated
(a trigger refuses it): an Event is an immutable fact.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rhumbatron.actors.row_statements import UPDATE_FROM, values_chunks
from rhumbatron.core.tracing import traceparent_for
from rhumbatron.errors import DomainError, OutboxError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import stream_index

__all__ = [
    "OUTBOX_SCHEMA",
    "OutboxRow",
    "RowState",
    "append_facts",
    "backoff_s",
    "counts_by_state",
    "due_rows",
    "migrate_outbox",
    "next_due_at",
    "prune_published",
    "published_since",
    "requeue_failed",
]


class RowState(StrEnum):
    PENDING = "pending"
    RETRY_WAIT = "retry_wait"
    PUBLISHED = "published"
    FAILED = "failed"

    @property
    def is_open(self) -> bool:
        """Whether a row in this state is backlog: not yet published (failed included)."""
        return self is not RowState.PUBLISHED


OUTBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT    NOT NULL UNIQUE,
    project_id      TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    stream_index    INTEGER NOT NULL,
    envelope        BLOB    NOT NULL,
    state           TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'retry_wait', 'published', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL,
    last_error      TEXT,
    created_at      REAL    NOT NULL,
    published_at    REAL,
    stream_seq      INTEGER,
    traceparent     TEXT
);
CREATE INDEX IF NOT EXISTS outbox_open ON outbox (project_id, seq)
    WHERE state IN ('pending', 'retry_wait');
CREATE INDEX IF NOT EXISTS outbox_published ON outbox (published_at)
    WHERE state = 'published';
-- Rows per state, kept by the triggers below in the transaction that changes a row, so the
-- backlog gauge reads four rows of each actor file instead of counting its outbox. A file
-- made before the table gets its counts from the rows once, as the schema reaches it.
CREATE TABLE IF NOT EXISTS outbox_counts (
    state TEXT PRIMARY KEY,
    n     INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO outbox_counts (state, n)
    SELECT states.state, (SELECT COUNT(*) FROM outbox WHERE outbox.state = states.state)
    FROM (SELECT 'pending' AS state UNION ALL SELECT 'retry_wait'
          UNION ALL SELECT 'published' UNION ALL SELECT 'failed') AS states;
CREATE TRIGGER IF NOT EXISTS outbox_counts_insert AFTER INSERT ON outbox
BEGIN
    UPDATE outbox_counts SET n = n + 1 WHERE state = NEW.state;
END;
CREATE TRIGGER IF NOT EXISTS outbox_counts_update AFTER UPDATE OF state ON outbox
    WHEN OLD.state IS NOT NEW.state
BEGIN
    UPDATE outbox_counts SET n = n - 1 WHERE state = OLD.state;
    UPDATE outbox_counts SET n = n + 1 WHERE state = NEW.state;
END;
CREATE TRIGGER IF NOT EXISTS outbox_counts_delete AFTER DELETE ON outbox
BEGIN
    UPDATE outbox_counts SET n = n - 1 WHERE state = OLD.state;
END;
CREATE TRIGGER IF NOT EXISTS outbox_events_are_immutable
    BEFORE UPDATE OF event_id, project_id, event_type, stream_index, envelope ON outbox
BEGIN
    SELECT RAISE(ABORT, 'outbox events are immutable facts');
END;
"""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One outbox row as the publisher sees it."""

    seq: int
    event_id: str
    project_id: str
    event_type: str
    stream_index: int
    envelope: bytes
    state: RowState
    attempts: int
    next_attempt_at: float | None
    #: The W3C ``traceparent`` of the work that wrote the row, sent as the message's header.
    traceparent: str | None = None

    @classmethod
    def from_sql(cls, row: Sequence[Any]) -> OutboxRow:
        """A row selected as ``_ROW_COLUMNS``, in that order.

        Positional on purpose: the publisher reads up to 100 rows per project per call, and
        looking ten columns up by name (and the enum's ``__call__``) cost more per row than
        SQLite's own step.
        """
        (
            seq,
            event_id,
            project_id,
            event_type,
            stream_index,
            envelope,
            state,
            attempts,
            next_attempt_at,
            traceparent,
        ) = row
        return cls(
            seq,
            event_id,
            project_id,
            event_type,
            stream_index,
            bytes(envelope),
            _ROW_STATES[state],
            attempts,
            next_attempt_at,
            traceparent,
        )


#: The columns :meth:`OutboxRow.from_sql` reads, in its order.
_ROW_COLUMNS = (
    "seq, event_id, project_id, event_type, stream_index, envelope, state, attempts, "
    "next_attempt_at, traceparent"
)
_ROW_STATES = {state.value: state for state in RowState}


def append_facts(
    connection: sqlite3.Connection,
    facts: Iterable[Event],
    *,
    owner: str,
    project_id: str,
    now_s: float,
    max_event_bytes: int,
) -> int:
    """Insert ``facts`` as pending rows inside the caller's transaction; return rows added.

    A fact whose Event ID is already in the outbox is ignored (a retried step). A fact of a
    type this actor class does not own, of another project, or larger than
    ``max_event_bytes`` raises, which rolls the whole transaction back. Each row keeps the
    ``traceparent`` of the work writing it (:func:`~rhumbatron.core.tracing.traceparent_for`:
    a Change's fact is in the Change's trace), which the publisher sends as its header.
    """
    added = 0
    for fact in facts:
        if fact.spec.owner != owner:
            raise DomainError(
                f"{fact.event_type} is written by the {fact.spec.owner} actor, not by a "
                f"{owner}; route the transition to the actor that owns it"
            )
        if fact.project_id != project_id:
            raise DomainError(
                f"event {fact.event_id} is for project {fact.project_id!r}, but this actor "
                f"holds project {project_id!r}"
            )
        envelope = fact.to_json()
        if len(envelope) > max_event_bytes:
            raise OutboxError(
                f"event {fact.event_id} ({fact.event_type}) is {len(envelope)} bytes, over "
                f"RHUMBATRON_MAX_EVENT_BYTES={max_event_bytes}; put large content in S3 and "
                "reference it from the payload"
            )
        cursor = connection.execute(
            "INSERT OR IGNORE INTO outbox "
            "(event_id, project_id, event_type, stream_index, envelope, created_at, traceparent) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                fact.event_id,
                fact.project_id,
                fact.event_type,
                stream_index(fact.project_id),
                envelope,
                now_s,
                traceparent_for(fact.project_id, fact.change_id),
            ),
        )
        added += cursor.rowcount
    return added


def migrate_outbox(connection: sqlite3.Connection) -> None:
    """Give an outbox made before trace context its ``traceparent`` column (NULL in the rows
    it holds: they are sent with no header). A current outbox is left as it is."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(outbox)")}
    if "traceparent" not in columns:
        connection.execute("ALTER TABLE outbox ADD COLUMN traceparent TEXT")


def due_rows(
    connection: sqlite3.Connection, *, now_s: float, limit: int
) -> dict[str, list[OutboxRow]]:
    """Per project, the rows to send now, in outbox order, at most ``limit`` each.

    A row waiting out its backoff blocks the rows after it of the same project, so a
    project's Events reach the stream in outbox order even across retries.
    """
    projects = [
        r[0]
        for r in connection.execute(
            "SELECT DISTINCT project_id FROM outbox WHERE state IN ('pending', 'retry_wait')"
        )
    ]
    result: dict[str, list[OutboxRow]] = {}
    cursor = connection.cursor()
    cursor.row_factory = None  # plain tuples: from_sql reads by position
    for project in projects:
        rows: list[OutboxRow] = []
        for sql_row in cursor.execute(
            f"SELECT {_ROW_COLUMNS} FROM outbox "
            "WHERE project_id = ? AND state IN ('pending', 'retry_wait') ORDER BY seq LIMIT ?",
            (project, limit),
        ):
            row = OutboxRow.from_sql(sql_row)
            if row.state is RowState.RETRY_WAIT and (row.next_attempt_at or 0) > now_s:
                break
            rows.append(row)
        if rows:
            result[project] = rows
    return result


def next_due_at(connection: sqlite3.Connection, *, now_s: float) -> float | None:
    """When this outbox next has work it can send, or None when it has none.

    Per project only the first open row decides: a pending row is due now, a row waiting out
    its backoff is due at its retry time — and it blocks the rows behind it, so pending rows
    behind a waiting row are not due yet (counting them would fire alarms in a hot loop).
    """
    # SQLite's bare columns with MIN() come from the row that has the minimum seq.
    heads = connection.execute(
        "SELECT project_id, MIN(seq), state, next_attempt_at FROM outbox "
        "WHERE state IN ('pending', 'retry_wait') GROUP BY project_id"
    ).fetchall()
    due = [
        now_s if state == RowState.PENDING else float(retry_at or now_s)
        for _, _, state, retry_at in heads
    ]
    return min(due, default=None)


def backoff_s(
    attempts: int, *, initial_s: float, max_s: float, jitter: float, rng: random.Random
) -> float:
    """Delay after the ``attempts``-th failed attempt: ``initial · 2^(n-1)``, capped, ±jitter."""
    base = min(initial_s * 2 ** max(attempts - 1, 0), max_s)
    return float(base * (1 + rng.uniform(-jitter, jitter)))


def mark_published(
    connection: sqlite3.Connection, sent: Sequence[tuple[int, int | None]], *, now_s: float
) -> None:
    """Mark rows ``(seq, stream_seq)`` published: a few statements, not one per row (the
    commit runs on a worker thread; see :mod:`~rhumbatron.actors.row_statements`)."""
    if len(sent) == 1 or not UPDATE_FROM:  # a one-row fire (the common case under a
        # steady load) needs no join; an SQLite before 3.33 has none
        connection.executemany(
            "UPDATE outbox SET state = 'published', published_at = ?, stream_seq = ?, "
            "next_attempt_at = NULL WHERE seq = ?",
            [(now_s, stream_seq, seq) for seq, stream_seq in sent],
        )
        return
    # A seq sent twice keeps its last position, as one UPDATE per row did (a join matching
    # two rows would pick either).
    for values, parameters in values_chunks(list(dict(sent).items())):
        connection.execute(
            "UPDATE outbox SET state = 'published', published_at = ?, "
            f"stream_seq = sent.column2, next_attempt_at = NULL FROM (VALUES {values}) AS sent "
            "WHERE outbox.seq = sent.column1",
            [now_s, *parameters],
        )


def mark_failed(connection: sqlite3.Connection, seq: int, error: str) -> None:
    """Make a row terminal ``failed`` at once, keeping ``error`` for the operator."""
    connection.execute(
        "UPDATE outbox SET state = 'failed', last_error = ?, next_attempt_at = NULL WHERE seq = ?",
        (error, seq),
    )


def mark_attempt_failed(
    connection: sqlite3.Connection,
    row: OutboxRow,
    error: str,
    *,
    now_s: float,
    max_attempts: int,
    delay_s: float,
) -> RowState:
    """Count one failed attempt: ``retry_wait`` with a backoff, or ``failed`` at the last one."""
    attempts = row.attempts + 1
    if attempts >= max_attempts:
        connection.execute(
            "UPDATE outbox SET state = 'failed', attempts = ?, last_error = ?, "
            "next_attempt_at = NULL WHERE seq = ?",
            (attempts, f"attempt {attempts} of {max_attempts}: {error}", row.seq),
        )
        return RowState.FAILED
    connection.execute(
        "UPDATE outbox SET state = 'retry_wait', attempts = ?, last_error = ?, "
        "next_attempt_at = ? WHERE seq = ?",
        (attempts, f"attempt {attempts} of {max_attempts}: {error}", now_s + delay_s, row.seq),
    )
    return RowState.RETRY_WAIT


def requeue_failed(connection: sqlite3.Connection, event_ids: Sequence[str] | None = None) -> int:
    """Operator action: put ``failed`` rows (all, or those listed) back to ``pending``."""
    if event_ids is None:
        cursor = connection.execute(
            "UPDATE outbox SET state = 'pending', attempts = 0, next_attempt_at = NULL "
            "WHERE state = 'failed'"
        )
        return cursor.rowcount
    total = 0
    for event_id in event_ids:
        total += connection.execute(
            "UPDATE outbox SET state = 'pending', attempts = 0, next_attempt_at = NULL "
            "WHERE state = 'failed' AND event_id = ?",
            (event_id,),
        ).rowcount
    return total


def prune_published(connection: sqlite3.Connection, *, older_than_s: float, limit: int) -> int:
    """Delete at most ``limit`` rows published before ``older_than_s`` (a bounded pass)."""
    cursor = connection.execute(
        "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE state = 'published' "
        "AND published_at < ? ORDER BY published_at LIMIT ?)",
        (older_than_s, limit),
    )
    return cursor.rowcount


def published_since(
    connection: sqlite3.Connection, *, since_s: float
) -> list[tuple[str, int, int | None]]:
    """``(event_id, stream_index, stream_seq)`` of every row published at or after
    ``since_s``, in outbox order: what the log must hold (reconciliation). ``stream_seq`` is
    None where the PubAck did not name it (the inner rows of a fast batch)."""
    return [
        (str(event_id), int(index), None if seq is None else int(seq))
        for event_id, index, seq in connection.execute(
            "SELECT event_id, stream_index, stream_seq FROM outbox "
            "WHERE state = 'published' AND published_at >= ? ORDER BY seq",
            (since_s,),
        )
    ]


def published_envelopes(
    connection: sqlite3.Connection, event_ids: Iterable[str]
) -> list[tuple[int, str, bytes]]:
    """``(seq, event_id, envelope)`` of the published rows among ``event_ids``, in outbox
    order: what a re-publish of events the log lost sends again."""
    rows = []
    for event_id in event_ids:
        row = connection.execute(
            "SELECT seq, envelope FROM outbox WHERE event_id = ? AND state = 'published'",
            (event_id,),
        ).fetchone()
        if row is not None:
            rows.append((int(row[0]), event_id, bytes(row[1])))
    return sorted(rows)


def record_stream_seqs(connection: sqlite3.Connection, stored: Sequence[tuple[int, int]]) -> None:
    """Rows ``(seq, stream_seq)`` stored again at a new stream sequence (a re-publish)."""
    connection.executemany(
        "UPDATE outbox SET stream_seq = ? WHERE seq = ? AND state = 'published'",
        [(stream_seq, seq) for seq, stream_seq in stored],
    )


def counts_by_state(connection: sqlite3.Connection) -> dict[str, int]:
    """Rows per state, every state present (0 when none): the counters the outbox's
    triggers keep, four rows read whatever the outbox holds."""
    counts = {state.value: 0 for state in RowState}
    for state, count in connection.execute("SELECT state, n FROM outbox_counts"):
        counts[state] = count
    return counts
