"""The webhook delivery ledger: each webhook reaction's attempts, retries, dead letter and the
health of its endpoint (seed 002 §4: "a reaction that keeps failing parks with its event and
surfaces, never silently retries forever").

The reactions consumer tries a webhook once. Whatever the receiver answers, the event is then
done for the consumer — one slow or broken receiver never holds its stream — and the delivery
is written here, keyed ``<eventId>:<subscriptionId>`` (its ``webhook-id``):

* ``delivered``: a 2xx answer.
* ``retrying``: a failed attempt with a retry due at ``next_attempt_at_s``. The waits follow
  ``reaction_webhook_retry_schedule_s`` (DECISIONS: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h);
  the sweep's retry pass (:mod:`~rhumbatron.reactions.webhook_retries`) sends them.
* ``dead``: the last retry failed too. A ``reaction`` dead letter opens (Retry sends it once
  more; Dismiss closes it).
* ``skipped``: not sent because the platform disabled the subscription's endpoint — kept, so
  an operator who enables it again can replay them.

This module holds the table, its records, and the moves of a delivery that no attempt makes
(a new row, the retry pass's claims, an operator's replay, Retry and Dismiss, pruning); what
follows an attempt, and disabling a failing endpoint, is
:mod:`~rhumbatron.reactions.webhook_attempts`'.

Every function here runs inside the caller's product-database transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DELIVERIES_PER_PAGE",
    "WEBHOOK_LEDGER_SCHEMA",
    "Attempt",
    "DeliveryStatus",
    "Disablement",
    "RetryPolicy",
    "WebhookDelivery",
    "claim_due",
    "get_delivery",
    "insert_delivery",
    "list_deliveries",
    "park_dead",
    "prune_deliveries",
    "rearm_for_retry",
    "record_skipped",
    "replay_skipped",
    "reschedule",
    "skip",
]

WEBHOOK_LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    delivery_key       TEXT PRIMARY KEY,
    tenant_id          TEXT NOT NULL,
    project_id         TEXT NOT NULL,
    event_id           TEXT NOT NULL,
    event_type         TEXT NOT NULL,
    subscription_id    TEXT NOT NULL,
    body               TEXT NOT NULL,
    status             TEXT NOT NULL
        CHECK (status IN ('retrying', 'delivered', 'dead', 'skipped')),
    attempts           INTEGER NOT NULL,
    next_attempt_at_s  REAL,
    last_error         TEXT,
    last_status_code   INTEGER,
    created_at_s       REAL NOT NULL,
    updated_at_s       REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_due
    ON webhook_deliveries (status, next_attempt_at_s);
CREATE INDEX IF NOT EXISTS webhook_deliveries_subscription
    ON webhook_deliveries (subscription_id, status, created_at_s);
"""


class DeliveryStatus(StrEnum):
    """Where a delivery stands (see the module docstring)."""

    RETRYING = "retrying"
    DELIVERED = "delivered"
    DEAD = "dead"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The retry schedule (one wait per retry) and the disable window."""

    schedule_s: tuple[float, ...]
    disable_after_s: float

    @property
    def max_attempts(self) -> int:
        """The first attempt and one per scheduled retry."""
        return 1 + len(self.schedule_s)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One POST's outcome: a 2xx, or why not (``status_code`` None: no answer)."""

    ok: bool
    status_code: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """One ``webhook_deliveries`` row."""

    delivery_key: str
    tenant_id: str
    project_id: str
    event_id: str
    event_type: str
    subscription_id: str
    body: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at_s: float | None
    last_error: str | None
    last_status_code: int | None
    created_at_s: float
    updated_at_s: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> WebhookDelivery:
        """The delivery a ``SELECT *`` row holds."""
        values = dict(row)
        values["status"] = DeliveryStatus(values["status"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Disablement:
    """A subscription the ledger disabled, with what its ``reaction.disabled`` fact says."""

    subscription_id: str
    tenant_id: str
    project_id: str
    name: str
    reason: str
    detail: str
    delivery_key: str
    status_code: int | None
    failing_since_s: float | None
    disabled_at_s: float


# -- new deliveries ----------------------------------------------------------------------------


def record_skipped(
    db: sqlite3.Connection,
    *,
    delivery_key: str,
    tenant_id: str,
    project_id: str,
    event_id: str,
    event_type: str,
    subscription_id: str,
    body: bytes,
    now_s: float,
) -> None:
    """Keep a delivery matched while its endpoint is disabled, to replay it later."""
    insert_delivery(
        db,
        (delivery_key, tenant_id, project_id, event_id, event_type, subscription_id),
        body=body,
        status=DeliveryStatus.SKIPPED,
        last_error="not sent: the subscription's endpoint is disabled",
        now_s=now_s,
    )


def insert_delivery(
    db: sqlite3.Connection,
    identity: tuple[str, str, str, str, str, str],
    *,
    body: bytes,
    status: DeliveryStatus,
    last_error: str | None,
    now_s: float,
) -> bool:
    """A new row with no attempt made: ``identity`` is (delivery key, tenant, project,
    event, event type, subscription). False when the delivery is recorded already."""
    return (
        db.execute(
            "INSERT OR IGNORE INTO webhook_deliveries (delivery_key, tenant_id, project_id, "
            "event_id, event_type, subscription_id, body, status, attempts, last_error, "
            "created_at_s, updated_at_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
            (*identity, body.decode("utf-8"), status.value, last_error, now_s, now_s),
        ).rowcount
        == 1
    )


# -- the retry pass ----------------------------------------------------------------------------


def claim_due(
    db: sqlite3.Connection, *, now_s: float, limit: int, lease_s: float
) -> list[WebhookDelivery]:
    """The deliveries due now, oldest due first, each leased for ``lease_s`` (its
    ``next_attempt_at_s`` moved past the send), so an overlapping pass leaves them alone and
    a pass that died mid-send is retried once the lease is over."""
    rows = db.execute(
        "SELECT * FROM webhook_deliveries WHERE status = 'retrying' AND next_attempt_at_s <= ? "
        "ORDER BY next_attempt_at_s, delivery_key LIMIT ?",
        (now_s, limit),
    ).fetchall()
    db.executemany(
        "UPDATE webhook_deliveries SET next_attempt_at_s = ? WHERE delivery_key = ?",
        [(now_s + lease_s, row["delivery_key"]) for row in rows],
    )
    return [WebhookDelivery.from_row(row) for row in rows]


def reschedule(db: sqlite3.Connection, delivery_key: str, *, at_s: float) -> None:
    """Give a claimed delivery back, due at ``at_s`` (the gate had no room for it)."""
    db.execute(
        "UPDATE webhook_deliveries SET next_attempt_at_s = ? "
        "WHERE delivery_key = ? AND status = 'retrying'",
        (at_s, delivery_key),
    )


def skip(db: sqlite3.Connection, delivery_key: str, why: str, *, now_s: float) -> None:
    """Set a claimed delivery aside as skipped, saying why (its subscription is off or gone,
    or the tenant's budget is spent); a replay can send it later."""
    db.execute(
        "UPDATE webhook_deliveries SET status = 'skipped', next_attempt_at_s = NULL, "
        "last_error = ?, updated_at_s = ? WHERE delivery_key = ?",
        (why, now_s, delivery_key),
    )


# -- operators -------------------------------------------------------------------------------


def get_delivery(db: sqlite3.Connection, delivery_key: str) -> WebhookDelivery:
    """The delivery ``delivery_key``; raises :class:`LookupError` when there is none."""
    row = db.execute(
        "SELECT * FROM webhook_deliveries WHERE delivery_key = ?", (delivery_key,)
    ).fetchone()
    if row is None:
        raise LookupError(f"no webhook delivery {delivery_key!r}")
    return WebhookDelivery.from_row(row)


#: A listing's page of deliveries when the caller names no limit (the API takes 1 to 500).
DELIVERIES_PER_PAGE = 100


def list_deliveries(
    db: sqlite3.Connection,
    subscription_id: str,
    *,
    statuses: Sequence[DeliveryStatus] = (),
    limit: int = DELIVERIES_PER_PAGE,
) -> list[WebhookDelivery]:
    """The subscription's deliveries, newest first, of the given statuses (all if none)."""
    clause = ""
    values: list[object] = [subscription_id]
    if statuses:
        clause = f" AND status IN ({', '.join('?' * len(statuses))})"
        values += [status.value for status in statuses]
    rows = db.execute(
        f"SELECT * FROM webhook_deliveries WHERE subscription_id = ?{clause} "
        "ORDER BY created_at_s DESC, delivery_key DESC LIMIT ?",
        [*values, limit],
    ).fetchall()
    return [WebhookDelivery.from_row(row) for row in rows]


def replay_skipped(db: sqlite3.Connection, subscription_id: str, *, now_s: float) -> int:
    """Make every skipped delivery of the subscription due now, with a fresh schedule; return
    how many. The retry pass sends them through the admission gate, a batch per tick."""
    return db.execute(
        "UPDATE webhook_deliveries SET status = 'retrying', attempts = 0, "
        "next_attempt_at_s = ?, updated_at_s = ? WHERE subscription_id = ? AND status = 'skipped'",
        (now_s, now_s, subscription_id),
    ).rowcount


def park_dead(db: sqlite3.Connection, delivery_key: str, *, now_s: float) -> None:
    """An operator dismissed the delivery's letter: a Retry it had made due is withdrawn, so
    nothing is sent and the letter stays closed."""
    db.execute(
        "UPDATE webhook_deliveries SET status = 'dead', next_attempt_at_s = NULL, "
        "updated_at_s = ? WHERE delivery_key = ? AND status = 'retrying'",
        (now_s, delivery_key),
    )


def rearm_for_retry(db: sqlite3.Connection, delivery_key: str, *, now_s: float) -> WebhookDelivery:
    """An operator's Retry of a dead delivery: one more attempt, due now (a failure makes it
    dead again at once, and reopens its letter)."""
    db.execute(
        "UPDATE webhook_deliveries SET status = 'retrying', next_attempt_at_s = ?, "
        "updated_at_s = ? WHERE delivery_key = ? AND status = 'dead'",
        (now_s, now_s, delivery_key),
    )
    return get_delivery(db, delivery_key)


def prune_deliveries(db: sqlite3.Connection, *, before_s: float, limit: int) -> int:
    """Delete at most ``limit`` deliveries last touched before ``before_s``: delivered,
    skipped (a replay window as long as the history: a subscription that stays disabled must
    not grow the file without bound), or dead with a closed letter. Retries due and open
    letters stay."""
    return db.execute(
        "DELETE FROM webhook_deliveries WHERE delivery_key IN ("
        "SELECT delivery_key FROM webhook_deliveries WHERE updated_at_s < ? AND ("
        "status IN ('delivered', 'skipped') OR (status = 'dead' AND NOT EXISTS ("
        "SELECT 1 FROM dead_letters "
        "WHERE consumer = 'reactions' AND event_id = delivery_key AND status = 'open'))) "
        "LIMIT ?)",
        (before_s, limit),
    ).rowcount
