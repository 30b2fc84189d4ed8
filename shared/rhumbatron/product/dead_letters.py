"""Dead letters: what an operator must see because delivery gave up.

Three kinds share the table. A ``command`` letter (the command plane's dead-letter queue) is
unique on ``command_id``. A ``poison_event`` letter is an Event a router subscription failed
to apply 5 times; it is unique on ``(consumer, event_id)`` and can only be dismissed
(spec: poison-batch.ts). A ``reaction`` letter is a webhook delivery whose retry schedule ran
out (seed 002: a reaction that keeps failing parks with its event); its ``event_id`` is the
delivery key ``<eventId>:<subscriptionId>`` under the consumer ``reactions``, and a Retry
sends it once more. The functions here run inside the caller's transaction unless they
say otherwise.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from enum import StrEnum

from rhumbatron.errors import DeadLetterClosedError, DeadLetterNotFoundError
from rhumbatron.protocol.values import MAX_ATTEMPT

__all__ = [
    "DEAD_LETTERS_SCHEMA",
    "DeadLetter",
    "DeadLetterKind",
    "DeadLetterStatus",
    "Resolution",
    "claim_retry",
    "close_command_dead_letter",
    "close_dead_letters_of_change",
    "close_reaction_dead_letter",
    "command_dead_letter_id",
    "dismiss_dead_letter",
    "get_dead_letter",
    "list_dead_letters",
    "migrate_dead_letters",
    "open_command_ids",
    "poison_dead_letter_id",
    "reaction_dead_letter_id",
    "record_command_dead_letter",
    "record_poison_event",
    "record_reaction_dead_letter",
]


class DeadLetterKind(StrEnum):
    COMMAND = "command"
    POISON_EVENT = "poison_event"
    REACTION = "reaction"


class DeadLetterStatus(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


class Resolution(StrEnum):
    """Why a letter closed."""

    DISMISSED = "dismissed"  # an operator dismissed it
    SUCCEEDED = "succeeded"  # the same command (or webhook delivery) succeeded later
    SUPERSEDED = "superseded"  # a later change.settle of the same Change ran
    ENDED = "ended"  # the 5-minute sweep closed it: its Change ended


DEAD_LETTERS_SCHEMA = """
CREATE TABLE IF NOT EXISTS dead_letters (
    dead_letter_id TEXT PRIMARY KEY,
    kind           TEXT NOT NULL CHECK (kind IN ('command', 'poison_event', 'reaction')),
    tenant_id      TEXT,
    project_id     TEXT,
    change_id      TEXT,
    task_id        TEXT,
    command_id     TEXT UNIQUE,
    command_type   TEXT,
    queue          TEXT,
    attempt        INTEGER,
    consumer       TEXT,
    event_id       TEXT,
    stream         TEXT,
    stream_seq     INTEGER,
    reason         TEXT NOT NULL,
    body           TEXT NOT NULL,
    status         TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    resolution     TEXT,
    retried_attempt INTEGER,
    retried_at_s   REAL,
    created_at_s   REAL NOT NULL,
    updated_at_s   REAL,
    closed_at_s    REAL,
    UNIQUE (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS dead_letters_open ON dead_letters (status, created_at_s);
CREATE INDEX IF NOT EXISTS dead_letters_change ON dead_letters (change_id, status);
"""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead_letters row."""

    dead_letter_id: str
    kind: DeadLetterKind
    status: DeadLetterStatus
    reason: str
    body: str
    created_at_s: float
    tenant_id: str | None = None
    project_id: str | None = None
    change_id: str | None = None
    task_id: str | None = None
    command_id: str | None = None
    command_type: str | None = None
    queue: str | None = None
    attempt: int | None = None
    consumer: str | None = None
    event_id: str | None = None
    stream: str | None = None
    stream_seq: int | None = None
    resolution: str | None = None
    retried_attempt: int | None = None
    retried_at_s: float | None = None
    updated_at_s: float | None = None
    closed_at_s: float | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> DeadLetter:
        values = dict(row)
        values["kind"] = DeadLetterKind(values["kind"])
        values["status"] = DeadLetterStatus(values["status"])
        return cls(**values)


def poison_dead_letter_id(consumer: str, event_key: str) -> str:
    """``dl_`` + 24 hex characters derived from ``(consumer, event key)``: stable, so a
    redelivery after a crash finds the letter it already wrote."""
    digest = hashlib.sha256(f"{consumer}\x1f{event_key}".encode()).hexdigest()
    return f"dl_{digest[:24]}"


def record_poison_event(
    connection: sqlite3.Connection,
    *,
    consumer: str,
    event_key: str,
    stream: str,
    stream_seq: int,
    reason: str,
    body: str,
    now_s: float,
    tenant_id: str | None = None,
    project_id: str | None = None,
    change_id: str | None = None,
    task_id: str | None = None,
) -> bool:
    """Write the poison-event letter once; return whether this call wrote it."""
    return (
        connection.execute(
            "INSERT OR IGNORE INTO dead_letters (dead_letter_id, kind, tenant_id, project_id, "
            "change_id, task_id, consumer, event_id, stream, stream_seq, reason, body, "
            "created_at_s) VALUES (?, 'poison_event', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                poison_dead_letter_id(consumer, event_key),
                tenant_id,
                project_id,
                change_id,
                task_id,
                consumer,
                event_key,
                stream,
                stream_seq,
                reason,
                body,
                now_s,
            ),
        ).rowcount
        == 1
    )


def migrate_dead_letters(connection: sqlite3.Connection) -> None:
    """Bring a ``dead_letters`` table made before ``reaction`` letters existed up to date.

    Its ``kind`` CHECK listed two kinds, and SQLite cannot alter a CHECK: the table is copied
    into a new one of the current shape, inside the caller's (schema) transaction. (Not
    sqlite-utils' ``transform``, as the agents' migration is: it keeps a column's CHECK and
    has no way to change one.)
    """
    row = connection.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'dead_letters'"
    ).fetchone()
    if row is None or "'reaction'" in row[0]:
        return
    connection.execute("ALTER TABLE dead_letters RENAME TO dead_letters_before_reactions")
    for index in ("dead_letters_open", "dead_letters_change"):
        connection.execute(f"DROP INDEX IF EXISTS {index}")
    for statement in DEAD_LETTERS_SCHEMA.split(";"):
        if statement.strip():
            connection.execute(statement)
    connection.execute("INSERT INTO dead_letters SELECT * FROM dead_letters_before_reactions")
    connection.execute("DROP TABLE dead_letters_before_reactions")


def get_dead_letter(connection: sqlite3.Connection, dead_letter_id: str) -> DeadLetter:
    row = connection.execute(
        "SELECT * FROM dead_letters WHERE dead_letter_id = ?", (dead_letter_id,)
    ).fetchone()
    if row is None:
        raise DeadLetterNotFoundError(f"no dead letter {dead_letter_id!r}")
    return DeadLetter.from_row(row)


def list_dead_letters(
    connection: sqlite3.Connection,
    *,
    status: DeadLetterStatus | None = DeadLetterStatus.OPEN,
    kind: DeadLetterKind | None = None,
    tenant_id: str | None = None,
    project_id: str | None = None,
    queue: str | None = None,
    after: str | None = None,
    limit: int = 100,
) -> list[DeadLetter]:
    """Dead letters, oldest first, filtered; ``after`` is the last ID of the previous page."""
    clauses: list[str] = []
    params: list[object] = []
    for column, value in (
        ("status", status.value if status else None),
        ("kind", kind.value if kind else None),
        ("tenant_id", tenant_id),
        ("project_id", project_id),
        ("queue", queue),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if after is not None:
        mark = connection.execute(
            "SELECT created_at_s FROM dead_letters WHERE dead_letter_id = ?", (after,)
        ).fetchone()
        if mark is None:
            raise DeadLetterNotFoundError(f"page cursor {after!r} names no dead letter")
        clauses.append("(created_at_s, dead_letter_id) > (?, ?)")
        params += [mark[0], after]
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = connection.execute(
        f"SELECT * FROM dead_letters {where} ORDER BY created_at_s, dead_letter_id LIMIT ?",
        [*params, limit],
    ).fetchall()
    return [DeadLetter.from_row(row) for row in rows]


def dismiss_dead_letter(
    connection: sqlite3.Connection, dead_letter_id: str, *, now_s: float
) -> DeadLetter:
    """Close an open letter with the resolution ``dismissed``.

    Raises :class:`DeadLetterNotFoundError` for an unknown ID and
    :class:`DeadLetterClosedError` for a letter already closed.
    """
    letter = get_dead_letter(connection, dead_letter_id)
    if letter.status is DeadLetterStatus.CLOSED:
        raise DeadLetterClosedError(
            f"dead letter {dead_letter_id} is already closed ({letter.resolution})"
        )
    connection.execute(
        "UPDATE dead_letters SET status = 'closed', resolution = 'dismissed', closed_at_s = ? "
        "WHERE dead_letter_id = ? AND status = 'open'",
        (now_s, dead_letter_id),
    )
    return get_dead_letter(connection, dead_letter_id)


# -- command letters (the dead-letter queue) ------------------------------------------------


def command_dead_letter_id(command_id: str) -> str:
    """``dl_`` + 24 hex characters derived from the command ID: one letter per command."""
    return f"dl_{hashlib.sha256(command_id.encode()).hexdigest()[:24]}"


def record_command_dead_letter(
    connection: sqlite3.Connection,
    *,
    command_id: str,
    command_type: str,
    queue: str,
    attempt: int,
    reason: str,
    body: str,
    now_s: float,
    tenant_id: str | None = None,
    project_id: str | None = None,
    change_id: str | None = None,
    task_id: str | None = None,
) -> bool:
    """Write the command's letter, idempotent on ``command_id``; return whether it changed.

    A redelivery of the same dead-lettered attempt changes nothing. A later attempt (an
    operator's Retry that failed again) updates the letter and opens it again.
    """
    return (
        connection.execute(
            "INSERT INTO dead_letters (dead_letter_id, kind, tenant_id, project_id, change_id, "
            "task_id, command_id, command_type, queue, attempt, reason, body, created_at_s, "
            "updated_at_s) VALUES (?, 'command', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (command_id) DO UPDATE SET attempt = excluded.attempt, "
            "queue = excluded.queue, reason = excluded.reason, body = excluded.body, "
            "status = 'open', resolution = NULL, closed_at_s = NULL, "
            "updated_at_s = excluded.updated_at_s "
            "WHERE excluded.attempt > dead_letters.attempt",
            (
                command_dead_letter_id(command_id),
                tenant_id,
                project_id,
                change_id,
                task_id,
                command_id,
                command_type,
                queue,
                attempt,
                reason,
                body,
                now_s,
                now_s,
            ),
        ).rowcount
        == 1
    )


def claim_retry(
    connection: sqlite3.Connection, dead_letter_id: str, *, now_s: float
) -> tuple[DeadLetter, bool]:
    """Reserve the Retry of an open command letter as attempt ``attempt + 1``.

    Returns the letter and whether this caller won the reservation: a double click or a
    second operator finds the same attempt already reserved and sends nothing (F14). Raises
    :class:`DeadLetterNotFoundError`, or :class:`DeadLetterClosedError` for a closed letter;
    a poison-event letter cannot be retried (:class:`DeadLetterError`).
    """
    from rhumbatron.errors import DeadLetterError

    letter = get_dead_letter(connection, dead_letter_id)
    if letter.kind is DeadLetterKind.POISON_EVENT:
        raise DeadLetterError(
            f"dead letter {dead_letter_id} is a poison event of {letter.consumer}; it can only "
            "be dismissed"
        )
    if letter.status is DeadLetterStatus.CLOSED:
        raise DeadLetterClosedError(
            f"dead letter {dead_letter_id} is already closed ({letter.resolution})"
        )
    attempt = (letter.attempt or 1) + 1
    if attempt > MAX_ATTEMPT:
        raise DeadLetterError(
            f"dead letter {dead_letter_id} was attempt {letter.attempt}, the most a command "
            f"may have ({MAX_ATTEMPT}); it can only be dismissed"
        )
    won = (
        connection.execute(
            "UPDATE dead_letters SET retried_attempt = ?, retried_at_s = ? "
            "WHERE dead_letter_id = ? AND status = 'open' "
            "AND (retried_attempt IS NULL OR retried_attempt < ?)",
            (attempt, now_s, dead_letter_id, attempt),
        ).rowcount
        == 1
    )
    return get_dead_letter(connection, dead_letter_id), won


def open_command_ids(connection: sqlite3.Connection) -> frozenset[str]:
    """The command IDs that have an open letter."""
    rows = connection.execute(
        "SELECT command_id FROM dead_letters WHERE status = 'open' AND command_id IS NOT NULL"
    )
    return frozenset(row[0] for row in rows)


def close_command_dead_letter(
    connection: sqlite3.Connection, command_id: str, resolution: Resolution, *, now_s: float
) -> bool:
    """Close the open letter of ``command_id`` (the same command succeeded later)."""
    return (
        connection.execute(
            "UPDATE dead_letters SET status = 'closed', resolution = ?, closed_at_s = ? "
            "WHERE command_id = ? AND status = 'open'",
            (resolution.value, now_s, command_id),
        ).rowcount
        == 1
    )


def close_dead_letters_of_change(
    connection: sqlite3.Connection, change_id: str, resolution: Resolution, *, now_s: float
) -> int:
    """Close every open command letter of ``change_id`` (superseded, or the Change ended).
    Poison-event letters close only by dismissal."""
    return connection.execute(
        "UPDATE dead_letters SET status = 'closed', resolution = ?, closed_at_s = ? "
        "WHERE change_id = ? AND status = 'open' AND kind = 'command'",
        (resolution.value, now_s, change_id),
    ).rowcount


# -- reaction letters (webhook deliveries whose retries ran out) -------------------------------

#: The consumer a reaction letter names: the reactions subscription.
REACTIONS_CONSUMER = "reactions"


def reaction_dead_letter_id(delivery_key: str) -> str:
    """``dl_`` + 24 hex characters derived from the delivery key: one letter per delivery."""
    return poison_dead_letter_id(REACTIONS_CONSUMER, delivery_key)


def record_reaction_dead_letter(
    connection: sqlite3.Connection,
    *,
    delivery_key: str,
    tenant_id: str,
    project_id: str,
    attempts: int,
    reason: str,
    body: str,
    now_s: float,
) -> DeadLetter:
    """Open the delivery's letter, or open it again with the new attempt count and reason
    when a Retry failed too (the same letter: one per delivery). Reopening clears the Retry
    it reserved, so the next Retry is one again."""
    connection.execute(
        "INSERT INTO dead_letters (dead_letter_id, kind, tenant_id, project_id, consumer, "
        "event_id, attempt, reason, body, created_at_s) "
        "VALUES (?, 'reaction', ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (dead_letter_id) DO UPDATE SET status = 'open', resolution = NULL, "
        "closed_at_s = NULL, attempt = excluded.attempt, reason = excluded.reason, "
        "retried_attempt = NULL, retried_at_s = NULL, updated_at_s = ?",
        (
            reaction_dead_letter_id(delivery_key),
            tenant_id,
            project_id,
            REACTIONS_CONSUMER,
            delivery_key,
            attempts,
            reason,
            body,
            now_s,
            now_s,
        ),
    )
    return get_dead_letter(connection, reaction_dead_letter_id(delivery_key))


def close_reaction_dead_letter(
    connection: sqlite3.Connection, delivery_key: str, resolution: Resolution, *, now_s: float
) -> bool:
    """Close the open letter of the delivery (it was delivered after a Retry)."""
    return (
        connection.execute(
            "UPDATE dead_letters SET status = 'closed', resolution = ?, closed_at_s = ? "
            "WHERE dead_letter_id = ? AND status = 'open'",
            (resolution.value, now_s, reaction_dead_letter_id(delivery_key)),
        ).rowcount
        == 1
    )
