"""The reactions' tables in the product database: suppressions, causes, fires, the gate.

Everything the guards and the gate decide across streams and processes lives in the one
product file, so a decision and its bookkeeping commit in one transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rhumbatron.actors.storage import SqliteStore

__all__ = ["REACTIONS_SCHEMA", "ensure_reactions_schema"]

REACTIONS_SCHEMA = """
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


def ensure_reactions_schema(store: SqliteStore) -> None:
    """Create the reactions' tables in ``store`` (idempotent).

    The product database applies its own schema when it opens; until it lists these tables
    (``REACTIONS_SCHEMA``), the consumer adds them here, statement by statement inside one
    transaction (not ``executescript``, which would commit another thread's transaction on
    the shared connection).
    """
    with store.transaction() as db:
        for statement in REACTIONS_SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
