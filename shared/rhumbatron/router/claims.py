"""Claims: ``processed_events (consumer, event_id)`` rows that make a consumer apply a fact once.

``claimEvents`` in the spec is ``INSERT OR IGNORE processed_events``: one row changed means the
event is fresh, none means a duplicate. A claim lives in the same SQLite file as its effect
wherever the effect is a SQLite write (the project view, the metrics rows), and is written in
the same transaction, so a router killed after the claim and before the effect loses both
together and the redelivery applies the event (RELIABILITY F10).

Where the effect leaves the file (an S3 object, a command on JetStream) no transaction can
cover both. There the claim is a *lease*: ``status = 'claimed'`` until the effect is done,
then ``'done'``. A lease whose holder died expires after the ack wait — exactly when JetStream
redelivers the batch — and the redelivery takes it over. Those effects are idempotent by key
(the archive object's key, a command's message ID), so applying one twice leaves one result.

The functions here run inside the caller's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rhumbatron.actors.row_statements import write_rows

__all__ = [
    "CLAIMS_SCHEMA",
    "LeaseClaims",
    "claim_events",
    "claim_leases",
    "complete_claims",
    "done_event_ids",
    "prune_claims",
    "release_claims",
]

CLAIMS_SCHEMA = """
CREATE TABLE IF NOT EXISTS processed_events (
    consumer        TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('claimed', 'done')),
    lease_until_s   REAL,
    processed_at_s  REAL NOT NULL,
    PRIMARY KEY (consumer, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS processed_events_age ON processed_events (processed_at_s);
"""


def claim_events(
    connection: sqlite3.Connection,
    consumer: str,
    event_ids: Sequence[str],
    *,
    now_s: float,
    lease_s: float | None = None,
) -> list[str]:
    """Claim ``event_ids`` for ``consumer``; return the fresh ones, in the given order.

    Without ``lease_s`` the claim is final (``done``): use it when the effect commits in the
    same transaction. With ``lease_s`` the claim is a lease; an expired lease left by a dead
    holder is taken over and its event counts as fresh again.
    """
    fresh: list[str] = []
    status = "done" if lease_s is None else "claimed"
    lease_until = None if lease_s is None else now_s + lease_s
    for event_id in event_ids:
        inserted = connection.execute(
            "INSERT OR IGNORE INTO processed_events "
            "(consumer, event_id, status, lease_until_s, processed_at_s) VALUES (?, ?, ?, ?, ?)",
            (consumer, event_id, status, lease_until, now_s),
        ).rowcount
        if inserted == 1:
            fresh.append(event_id)
        elif lease_until is not None:
            taken_over = connection.execute(
                "UPDATE processed_events SET lease_until_s = ?, processed_at_s = ? "
                "WHERE consumer = ? AND event_id = ? AND status = 'claimed' "
                "AND lease_until_s <= ?",
                (lease_until, now_s, consumer, event_id, now_s),
            ).rowcount
            if taken_over == 1:
                fresh.append(event_id)
    return fresh


@dataclass
class LeaseClaims:
    """What :func:`claim_leases` found: events now leased to this run, and events whose
    lease another run still holds (it may be working on them, or dead with its lease
    not yet expired)."""

    fresh: list[str] = field(default_factory=list)
    held: set[str] = field(default_factory=set)


def claim_leases(
    connection: sqlite3.Connection,
    consumer: str,
    event_ids: Sequence[str],
    *,
    now_s: float,
    lease_s: float,
) -> LeaseClaims:
    """Lease ``event_ids`` for ``consumer``; tell fresh, held and done apart.

    A held event is not a duplicate: its effect may never have happened. Acking it would
    drop the message while the lease outlives the redelivery, losing the effect; the caller
    must retry it after the lease (RELIABILITY F10).
    """
    result = LeaseClaims(
        fresh=claim_events(connection, consumer, event_ids, now_s=now_s, lease_s=lease_s)
    )
    fresh = set(result.fresh)
    for event_id in event_ids:
        if event_id in fresh:
            continue
        row = connection.execute(
            "SELECT status FROM processed_events WHERE consumer = ? AND event_id = ?",
            (consumer, event_id),
        ).fetchone()
        if row is not None and row[0] == "claimed":
            result.held.add(event_id)
    return result


def complete_claims(
    connection: sqlite3.Connection, consumer: str, event_ids: Iterable[str], *, now_s: float
) -> None:
    """Mark claims done (the effect happened), creating any that are missing.

    Also used to mark a dead-lettered event processed, so a later redelivery skips it.
    """
    write_rows(
        connection,
        "INSERT INTO processed_events (consumer, event_id, status, lease_until_s, processed_at_s) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (consumer, event_id) DO UPDATE SET "
        "status = 'done', lease_until_s = NULL, processed_at_s = excluded.processed_at_s",
        [(consumer, event_id, "done", None, now_s) for event_id in event_ids],
    )


def release_claims(connection: sqlite3.Connection, consumer: str, event_ids: Iterable[str]) -> int:
    """Release leases whose effect did not happen, so the redelivery applies the events.

    Only ``claimed`` rows go: a ``done`` claim is never released.
    """
    cursor = connection.executemany(
        "DELETE FROM processed_events WHERE consumer = ? AND event_id = ? AND status = 'claimed'",
        [(consumer, event_id) for event_id in event_ids],
    )
    return cursor.rowcount


def done_event_ids(
    connection: sqlite3.Connection, consumer: str, event_ids: Sequence[str]
) -> set[str]:
    """The subset of ``event_ids`` that ``consumer`` has already processed."""
    done: set[str] = set()
    for event_id in event_ids:
        row = connection.execute(
            "SELECT 1 FROM processed_events WHERE consumer = ? AND event_id = ? "
            "AND status = 'done'",
            (consumer, event_id),
        ).fetchone()
        if row is not None:
            done.add(event_id)
    return done


def prune_claims(connection: sqlite3.Connection, *, older_than_s: float, limit: int) -> int:
    """Delete at most ``limit`` done claims processed before ``older_than_s``."""
    if limit <= 0:
        return 0
    return connection.execute(
        "DELETE FROM processed_events WHERE (consumer, event_id) IN ("
        " SELECT consumer, event_id FROM processed_events"
        " WHERE processed_at_s < ? AND status = 'done' LIMIT ?)",
        (older_than_s, limit),
    ).rowcount
