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

**Disabling.** An endpoint that answers ``410 Gone`` is disabled at once; one that failed
every attempt for ``reaction_webhook_disable_after_s`` (5 days) is disabled at its next
failure. Disabling turns the subscription off (``subscription_disablements`` says why), moves
its pending retries to ``skipped``, and leaves a ``reaction.disabled`` fact to record
(:func:`unrecorded_disablements`; the fact is written through an actor's outbox, another
file, so the flag is set only once it is written).

Every function here runs inside the caller's product-database transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from rhumbatron.product.dead_letters import (
    Resolution,
    close_reaction_dead_letter,
    record_reaction_dead_letter,
)

__all__ = [
    "GONE",
    "WEBHOOK_LEDGER_SCHEMA",
    "Attempt",
    "DeliveryStatus",
    "Disablement",
    "RetryPolicy",
    "WebhookDelivery",
    "claim_due",
    "get_delivery",
    "list_deliveries",
    "mark_disablement_recorded",
    "park_dead",
    "prune_deliveries",
    "rearm_for_retry",
    "record_attempt",
    "record_retry",
    "record_skipped",
    "replay_skipped",
    "reschedule",
    "skip",
    "unrecorded_disablements",
]

#: The answer that disables an endpoint at once (Standard Webhooks: the receiver is gone).
GONE = 410

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


# -- the consumer's first attempt ------------------------------------------------------------


def record_attempt(
    db: sqlite3.Connection,
    *,
    delivery_key: str,
    tenant_id: str,
    project_id: str,
    event_id: str,
    event_type: str,
    subscription_id: str,
    body: bytes,
    attempt: Attempt,
    now_s: float,
    policy: RetryPolicy,
) -> Disablement | None:
    """Record the consumer's first attempt of a delivery and decide what follows it.

    A redelivered event that finds its delivery already recorded changes nothing (the
    consumer's claim and this key agree: one row per delivery).
    """
    inserted = _insert(
        db,
        (delivery_key, tenant_id, project_id, event_id, event_type, subscription_id),
        body=body,
        status=DeliveryStatus.RETRYING,
        last_error=None,
        now_s=now_s,
    )
    if not inserted:
        return None
    return _after_attempt(db, get_delivery(db, delivery_key), attempt, now_s=now_s, policy=policy)


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
    _insert(
        db,
        (delivery_key, tenant_id, project_id, event_id, event_type, subscription_id),
        body=body,
        status=DeliveryStatus.SKIPPED,
        last_error="not sent: the subscription's endpoint is disabled",
        now_s=now_s,
    )


def _insert(
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


def record_retry(
    db: sqlite3.Connection,
    delivery: WebhookDelivery,
    attempt: Attempt,
    *,
    now_s: float,
    policy: RetryPolicy,
) -> Disablement | None:
    """Record a retry's outcome (see the module docstring for what follows it)."""
    return _after_attempt(db, delivery, attempt, now_s=now_s, policy=policy)


def skip(db: sqlite3.Connection, delivery_key: str, why: str, *, now_s: float) -> None:
    """Set a claimed delivery aside as skipped, saying why (its subscription is off or gone,
    or the tenant's budget is spent); a replay can send it later."""
    db.execute(
        "UPDATE webhook_deliveries SET status = 'skipped', next_attempt_at_s = NULL, "
        "last_error = ?, updated_at_s = ? WHERE delivery_key = ?",
        (why, now_s, delivery_key),
    )


def _after_attempt(
    db: sqlite3.Connection,
    delivery: WebhookDelivery,
    attempt: Attempt,
    *,
    now_s: float,
    policy: RetryPolicy,
) -> Disablement | None:
    attempts = delivery.attempts + 1
    key, subscription_id = delivery.delivery_key, delivery.subscription_id
    if attempt.ok:
        db.execute(
            "UPDATE webhook_deliveries SET status = 'delivered', attempts = ?, "
            "next_attempt_at_s = NULL, last_status_code = ?, updated_at_s = ? "
            "WHERE delivery_key = ?",
            (attempts, attempt.status_code, now_s, key),
        )
        db.execute(
            "DELETE FROM subscription_endpoint_health WHERE subscription_id = ?",
            (subscription_id,),
        )
        close_reaction_dead_letter(db, key, Resolution.SUCCEEDED, now_s=now_s)
        return None
    error = attempt.error or "the receiver did not answer 2xx"
    db.execute(
        "INSERT INTO subscription_endpoint_health (subscription_id, failing_since_s, failures) "
        "VALUES (?, ?, 1) ON CONFLICT (subscription_id) DO UPDATE SET failures = failures + 1",
        (subscription_id, now_s),
    )
    failing_since_s = float(
        db.execute(
            "SELECT failing_since_s FROM subscription_endpoint_health WHERE subscription_id = ?",
            (subscription_id,),
        ).fetchone()[0]
    )
    if attempt.status_code == GONE:
        # The receiver says it is gone: no retry, no letter; kept for a replay once the
        # endpoint is back and its subscription enabled again.
        status, next_at = DeliveryStatus.SKIPPED, None
    elif attempts >= policy.max_attempts:
        status, next_at = DeliveryStatus.DEAD, None
    else:
        status, next_at = DeliveryStatus.RETRYING, now_s + policy.schedule_s[attempts - 1]
    moved = db.execute(
        "UPDATE webhook_deliveries SET status = ?, attempts = ?, next_attempt_at_s = ?, "
        "last_error = ?, last_status_code = ?, updated_at_s = ? "
        "WHERE delivery_key = ? AND status = 'retrying'",
        (status.value, attempts, next_at, error, attempt.status_code, now_s, key),
    ).rowcount
    if not moved:
        # Set aside while the attempt was out (its endpoint disabled, or an operator's
        # Dismiss): the failure changes nothing more.
        return None
    if status is DeliveryStatus.DEAD:
        record_reaction_dead_letter(
            db,
            delivery_key=key,
            tenant_id=delivery.tenant_id,
            project_id=delivery.project_id,
            attempts=attempts,
            reason=f"webhook delivery {key} failed {attempts} times; the last: {error}",
            body=_letter_body(delivery),
            now_s=now_s,
        )
    if attempt.status_code == GONE:
        reason = "gone"
        detail = f"the endpoint answered {GONE} Gone to delivery {key}: {error}"
    elif now_s - failing_since_s >= policy.disable_after_s:
        reason = "failing"
        detail = (
            f"every attempt failed for {now_s - failing_since_s:.0f} s (the disable window is "
            f"{policy.disable_after_s:.0f} s, RHUMBATRON_REACTION_WEBHOOK_DISABLE_AFTER_S); "
            f"the last: {error}"
        )
    else:
        return None
    return _disable(
        db,
        delivery,
        reason=reason,
        detail=detail,
        status_code=attempt.status_code,
        failing_since_s=failing_since_s,
        now_s=now_s,
    )


def _disable(
    db: sqlite3.Connection,
    delivery: WebhookDelivery,
    *,
    reason: str,
    detail: str,
    status_code: int | None,
    failing_since_s: float,
    now_s: float,
) -> Disablement | None:
    subscription = db.execute(
        "SELECT name, enabled FROM subscriptions WHERE subscription_id = ?",
        (delivery.subscription_id,),
    ).fetchone()
    if subscription is None or not subscription["enabled"]:
        return None  # deleted or switched off meanwhile: nothing left to disable
    db.execute(
        "UPDATE subscriptions SET enabled = 0 WHERE subscription_id = ?",
        (delivery.subscription_id,),
    )
    db.execute(
        "INSERT OR REPLACE INTO subscription_disablements (subscription_id, reason, detail, "
        "delivery_key, status_code, failing_since_s, disabled_at_s, fact_recorded) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
        (
            delivery.subscription_id,
            reason,
            detail,
            delivery.delivery_key,
            status_code,
            failing_since_s,
            now_s,
        ),
    )
    # Nothing of a disabled endpoint is sent; what was waiting is kept for a replay.
    db.execute(
        "UPDATE webhook_deliveries SET status = 'skipped', next_attempt_at_s = NULL, "
        "updated_at_s = ? WHERE subscription_id = ? AND status = 'retrying'",
        (now_s, delivery.subscription_id),
    )
    return Disablement(
        subscription_id=delivery.subscription_id,
        tenant_id=delivery.tenant_id,
        project_id=delivery.project_id,
        name=subscription["name"],
        reason=reason,
        detail=detail,
        delivery_key=delivery.delivery_key,
        status_code=status_code,
        failing_since_s=failing_since_s,
        disabled_at_s=now_s,
    )


def unrecorded_disablements(db: sqlite3.Connection) -> list[Disablement]:
    """Disablements whose ``reaction.disabled`` fact is not written yet (a crash, or the
    actor was busy): the retry pass writes them first."""
    rows = db.execute(
        "SELECT d.*, s.name, s.tenant_id, w.project_id FROM subscription_disablements d "
        "JOIN subscriptions s USING (subscription_id) "
        "JOIN webhook_deliveries w ON w.delivery_key = d.delivery_key "
        "WHERE d.fact_recorded = 0 ORDER BY d.disabled_at_s"
    ).fetchall()
    return [
        Disablement(
            subscription_id=row["subscription_id"],
            tenant_id=row["tenant_id"],
            project_id=row["project_id"],
            name=row["name"],
            reason=row["reason"],
            detail=row["detail"],
            delivery_key=row["delivery_key"],
            status_code=row["status_code"],
            failing_since_s=row["failing_since_s"],
            disabled_at_s=row["disabled_at_s"],
        )
        for row in rows
    ]


def mark_disablement_recorded(db: sqlite3.Connection, disablement: Disablement) -> None:
    db.execute(
        "UPDATE subscription_disablements SET fact_recorded = 1 "
        "WHERE subscription_id = ? AND disabled_at_s = ?",
        (disablement.subscription_id, disablement.disabled_at_s),
    )


# -- operators -------------------------------------------------------------------------------


def get_delivery(db: sqlite3.Connection, delivery_key: str) -> WebhookDelivery:
    row = db.execute(
        "SELECT * FROM webhook_deliveries WHERE delivery_key = ?", (delivery_key,)
    ).fetchone()
    if row is None:
        raise LookupError(f"no webhook delivery {delivery_key!r}")
    return WebhookDelivery.from_row(row)


def list_deliveries(
    db: sqlite3.Connection,
    subscription_id: str,
    *,
    statuses: Sequence[DeliveryStatus] = (),
    limit: int = 100,
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


def _letter_body(delivery: WebhookDelivery) -> str:
    """What the letter shows: the pointer body sent, and where it came from."""
    return json.dumps(
        {
            "deliveryKey": delivery.delivery_key,
            "subscriptionId": delivery.subscription_id,
            "eventId": delivery.event_id,
            "kind": delivery.event_type,
            "body": json.loads(delivery.body),
        },
        sort_keys=True,
    )
