"""The subscriptions' tables in the product database (:data:`SUBSCRIPTIONS_SCHEMA`), and a
:class:`~rhumbatron.reactions.subscription_models.SubscriptionRecord` read from its row or
written to one.

``subscriptions`` holds the records; ``subscription_disablements`` why the platform disabled a
webhook subscription's endpoint, and ``subscription_endpoint_health`` since when it has been
failing (both written by :mod:`~rhumbatron.reactions.webhook_attempts`).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import SubscriptionRecord

__all__ = [
    "SELECT_SUBSCRIPTIONS",
    "SUBSCRIPTIONS_SCHEMA",
    "insert_subscription",
    "stored_json",
    "subscription_by_name",
    "subscription_from_row",
]

SUBSCRIPTIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS subscriptions (
    subscription_id TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    name            TEXT NOT NULL,
    selector        TEXT NOT NULL,
    reaction        TEXT NOT NULL,
    cooldown_s      INTEGER NOT NULL DEFAULT 60 CHECK (cooldown_s >= 0),
    enabled         INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE TABLE IF NOT EXISTS subscription_disablements (
    subscription_id  TEXT PRIMARY KEY,
    reason           TEXT NOT NULL CHECK (reason IN ('gone', 'failing')),
    detail           TEXT NOT NULL,
    delivery_key     TEXT NOT NULL,
    status_code      INTEGER,
    failing_since_s  REAL,
    disabled_at_s    REAL NOT NULL,
    fact_recorded    INTEGER NOT NULL DEFAULT 0 CHECK (fact_recorded IN (0, 1))
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscription_endpoint_health (
    subscription_id  TEXT PRIMARY KEY,
    failing_since_s  REAL NOT NULL,
    failures         INTEGER NOT NULL
) WITHOUT ROWID;
"""


#: Every read of a record: the row, and why its endpoint was disabled, if it was.
SELECT_SUBSCRIPTIONS = (
    "SELECT s.*, d.reason AS disabled_reason, d.detail AS disabled_detail, "
    "d.disabled_at_s AS disabled_at_s FROM subscriptions s "
    "LEFT JOIN subscription_disablements d USING (subscription_id)"
)


def insert_subscription(
    connection: sqlite3.Connection, record: SubscriptionRecord, now: datetime
) -> None:
    """Insert ``record``, created and updated at ``now``."""
    connection.execute(
        "INSERT INTO subscriptions (subscription_id, tenant_id, name, selector, "
        "reaction, cooldown_s, enabled, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.subscription_id,
            record.tenant_id,
            record.name,
            stored_json(record.selector),
            stored_json(record.reaction),
            record.governance.cooldown_s,
            int(record.governance.enabled),
            now.isoformat(),
            now.isoformat(),
        ),
    )


def stored_json(model: BaseModel) -> str:
    """``model`` as the tables store it: its JSON, keys sorted, no spaces."""
    return json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def subscription_by_name(
    connection: sqlite3.Connection, tenant_id: str, name: str
) -> SubscriptionRecord | None:
    """The tenant's subscription ``name``, if there is one."""
    row = connection.execute(
        SELECT_SUBSCRIPTIONS + " WHERE tenant_id = ? AND name = ?", (tenant_id, name)
    ).fetchone()
    return None if row is None else subscription_from_row(row)


def subscription_from_row(row: sqlite3.Row) -> SubscriptionRecord:
    """The record a :data:`SELECT_SUBSCRIPTIONS` row holds."""
    raw: dict[str, Any] = {
        "subscription_id": row["subscription_id"],
        "tenant_id": row["tenant_id"],
        "name": row["name"],
        "selector": Selector.parse(json.loads(row["selector"])),
        "reaction": json.loads(row["reaction"]),
        "governance": {"cooldown_s": row["cooldown_s"], "enabled": bool(row["enabled"])},
        "created_at": datetime.fromisoformat(row["created_at"]),
        "updated_at": datetime.fromisoformat(row["updated_at"]),
    }
    if row["disabled_reason"] is not None:
        raw["endpoint_disabled"] = {
            "reason": row["disabled_reason"],
            "detail": row["disabled_detail"],
            "disabled_at": datetime.fromtimestamp(row["disabled_at_s"], UTC),
        }
    return SubscriptionRecord.model_validate(raw)
