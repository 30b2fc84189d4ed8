"""The reactions' tables in the product database: suppressions, causes, fires, the gate, and
the webhook delivery ledger.

Everything the guards and the gate decide across streams and processes lives in the one
product file, so a decision and its bookkeeping commit in one transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.reactions.webhook_ledger import WEBHOOK_LEDGER_SCHEMA, prune_deliveries

__all__ = ["REACTIONS_SCHEMA", "ReactionHistoryPruner", "prune_reaction_history"]

_DAY_S = 86_400.0

REACTIONS_SCHEMA = (
    WEBHOOK_LEDGER_SCHEMA
    + """
CREATE TABLE IF NOT EXISTS reaction_suppressions (
    delivery_key     TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    project_id       TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    subscription_id  TEXT NOT NULL,
    reason           TEXT NOT NULL,
    detail           TEXT NOT NULL,
    depth            INTEGER NOT NULL,
    cause_chain      TEXT NOT NULL,
    recorded_at_s    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS reaction_suppressions_tenant
    ON reaction_suppressions (tenant_id, recorded_at_s);
CREATE TABLE IF NOT EXISTS reaction_causes (
    cause_key      TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    depth          INTEGER NOT NULL,
    chain          TEXT NOT NULL,
    recorded_at_s  REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reaction_fires (
    subscription_id  TEXT PRIMARY KEY,
    delivery_key     TEXT NOT NULL,
    fired_at_s       REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reaction_admissions (
    delivery_key    TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    day             TEXT NOT NULL,
    admitted_at_s   REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS reaction_admissions_day ON reaction_admissions (tenant_id, day);
CREATE TABLE IF NOT EXISTS reaction_in_flight (
    delivery_key  TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    until_s       REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS reaction_in_flight_tenant ON reaction_in_flight (tenant_id);
CREATE TABLE IF NOT EXISTS reaction_budget_facts (
    tenant_id  TEXT NOT NULL,
    day        TEXT NOT NULL,
    PRIMARY KEY (tenant_id, day)
) WITHOUT ROWID;
"""
)


#: The bookkeeping that ages out: its table, key, and the column saying when it was written.
_AGING: tuple[tuple[str, str, str], ...] = (
    ("reaction_suppressions", "delivery_key", "recorded_at_s"),
    ("reaction_causes", "cause_key", "recorded_at_s"),
    ("reaction_admissions", "delivery_key", "admitted_at_s"),
    # The ready wakes the agents' runtime took (the wake consumer's duplicate check).
    ("delivered_ready_wakes", "command_id", "delivered_at_s"),
)
#: The wake consumer's (agent, event) record ages out with them (a wake older than the
#: history cannot be redelivered any more).
_AGING_WAKES = ("agent_event_wakes", "woken_at_s")


def prune_reaction_history(db: sqlite3.Connection, *, before_s: float, limit: int) -> int:
    """Delete at most ``limit`` rows of the reactions' bookkeeping written before
    ``before_s`` (inside the caller's transaction); return how many.

    Finished webhook deliveries go (skipped ones and those with an open letter stay); so do
    suppressions, cause chains and admissions — none is read past a day or a chain's life.
    The one row per subscription of ``reaction_fires`` (its cooldown) and the in-flight
    slots (each freed by its lease) are kept.
    """
    left = limit - prune_deliveries(db, before_s=before_s, limit=limit)
    for table, key, written_at in _AGING:
        if left <= 0:
            break
        left -= db.execute(
            f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} "
            f"WHERE {written_at} < ? LIMIT ?)",
            (before_s, left),
        ).rowcount
    if left > 0:
        table, written_at = _AGING_WAKES
        left -= db.execute(
            f"DELETE FROM {table} WHERE (agent_id, event_id) IN (SELECT agent_id, event_id "
            f"FROM {table} WHERE {written_at} < ? LIMIT ?)",
            (before_s, left),
        ).rowcount
    return limit - left


@dataclass(frozen=True, slots=True)
class ReactionHistoryPruner:
    """The router maintenance's prune of the reactions' bookkeeping in the product database:
    rows older than ``history_days``, at most ``limit`` per call (the router calls it with the
    tick's time and its pass, and reports the count)."""

    product: SqliteStore
    history_days: float

    def __call__(self, now_s: float, limit: int) -> int:
        with self.product.transaction() as db:
            return prune_reaction_history(
                db, before_s=now_s - self.history_days * _DAY_S, limit=limit
            )
