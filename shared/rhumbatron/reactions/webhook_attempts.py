"""What follows one attempt of a webhook delivery: the ledger's attempt bookkeeping, the
health of the endpoint, and disabling it (the table and its records are
:mod:`~rhumbatron.reactions.webhook_ledger`'s).

An attempt is the consumer's first POST (:func:`record_attempt`) or a retry of the sweep's
retry pass (:func:`record_retry`). A 2xx makes the delivery ``delivered`` and closes its
``reaction`` dead letter, if one was open; a failure makes it ``retrying`` with the next wait
of ``reaction_webhook_retry_schedule_s``, or ``dead`` once the last retry failed (its letter
opens), and counts against its endpoint's health.

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

from rhumbatron.product.dead_letters import (
    Resolution,
    close_reaction_dead_letter,
    record_reaction_dead_letter,
)
from rhumbatron.reactions.webhook_ledger import (
    Attempt,
    DeliveryStatus,
    Disablement,
    RetryPolicy,
    WebhookDelivery,
    get_delivery,
    insert_delivery,
)

__all__ = [
    "GONE",
    "mark_disablement_recorded",
    "record_attempt",
    "record_retry",
    "unrecorded_disablements",
]

#: The answer that disables an endpoint at once (Standard Webhooks: the receiver is gone).
GONE = 410


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
    inserted = insert_delivery(
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


# -- the retry pass ----------------------------------------------------------------------------


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


# -- after an attempt ------------------------------------------------------------------------


def _after_attempt(
    db: sqlite3.Connection,
    delivery: WebhookDelivery,
    attempt: Attempt,
    *,
    now_s: float,
    policy: RetryPolicy,
) -> Disablement | None:
    """Move the delivery on from ``attempt``; the disablement, when it disabled the endpoint."""
    attempts = delivery.attempts + 1
    if attempt.ok:
        _delivered(db, delivery, attempt, attempts=attempts, now_s=now_s)
        return None
    error = attempt.error or "the receiver did not answer 2xx"
    failing_since_s = _count_failure(db, delivery.subscription_id, now_s=now_s)
    status, next_at = _after_failure(attempt, attempts, now_s=now_s, policy=policy)
    moved = _move(
        db,
        delivery.delivery_key,
        status,
        next_at,
        attempts=attempts,
        error=error,
        status_code=attempt.status_code,
        now_s=now_s,
    )
    if not moved:
        # Set aside while the attempt was out (its endpoint disabled, or an operator's
        # Dismiss): the failure changes nothing more.
        return None
    if status is DeliveryStatus.DEAD:
        _open_letter(db, delivery, attempts=attempts, error=error, now_s=now_s)
    why = _why_disable(
        delivery.delivery_key,
        attempt,
        error,
        failing_since_s=failing_since_s,
        now_s=now_s,
        policy=policy,
    )
    if why is None:
        return None
    reason, detail = why
    return _disable(
        db,
        delivery,
        reason=reason,
        detail=detail,
        status_code=attempt.status_code,
        failing_since_s=failing_since_s,
        now_s=now_s,
    )


def _delivered(
    db: sqlite3.Connection,
    delivery: WebhookDelivery,
    attempt: Attempt,
    *,
    attempts: int,
    now_s: float,
) -> None:
    """A 2xx: the delivery is done, its endpoint healthy, its letter (if any) closed."""
    key, subscription_id = delivery.delivery_key, delivery.subscription_id
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


def _count_failure(db: sqlite3.Connection, subscription_id: str, *, now_s: float) -> float:
    """Count the failure against the endpoint's health; since when it has been failing."""
    db.execute(
        "INSERT INTO subscription_endpoint_health (subscription_id, failing_since_s, failures) "
        "VALUES (?, ?, 1) ON CONFLICT (subscription_id) DO UPDATE SET failures = failures + 1",
        (subscription_id, now_s),
    )
    return float(
        db.execute(
            "SELECT failing_since_s FROM subscription_endpoint_health WHERE subscription_id = ?",
            (subscription_id,),
        ).fetchone()[0]
    )


def _after_failure(
    attempt: Attempt, attempts: int, *, now_s: float, policy: RetryPolicy
) -> tuple[DeliveryStatus, float | None]:
    """The failed delivery's next status, and when its next retry is due (None: none)."""
    if attempt.status_code == GONE:
        # The receiver says it is gone: no retry, no letter; kept for a replay once the
        # endpoint is back and its subscription enabled again.
        return DeliveryStatus.SKIPPED, None
    if attempts >= policy.max_attempts:
        return DeliveryStatus.DEAD, None
    return DeliveryStatus.RETRYING, now_s + policy.schedule_s[attempts - 1]


def _move(
    db: sqlite3.Connection,
    key: str,
    status: DeliveryStatus,
    next_at: float | None,
    *,
    attempts: int,
    error: str,
    status_code: int | None,
    now_s: float,
) -> bool:
    """Record the failed attempt, if the delivery is still retrying; whether it was."""
    moved: int = db.execute(
        "UPDATE webhook_deliveries SET status = ?, attempts = ?, next_attempt_at_s = ?, "
        "last_error = ?, last_status_code = ?, updated_at_s = ? "
        "WHERE delivery_key = ? AND status = 'retrying'",
        (status.value, attempts, next_at, error, status_code, now_s, key),
    ).rowcount
    return bool(moved)


def _open_letter(
    db: sqlite3.Connection, delivery: WebhookDelivery, *, attempts: int, error: str, now_s: float
) -> None:
    """The last retry failed: the delivery's ``reaction`` dead letter opens."""
    key = delivery.delivery_key
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


def _why_disable(
    key: str,
    attempt: Attempt,
    error: str,
    *,
    failing_since_s: float,
    now_s: float,
    policy: RetryPolicy,
) -> tuple[str, str] | None:
    """Why the failure disables the endpoint (the reason and its detail), or None."""
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
    return reason, detail


# -- disabling -------------------------------------------------------------------------------


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
    """Flag ``disablement``'s ``reaction.disabled`` fact as written."""
    db.execute(
        "UPDATE subscription_disablements SET fact_recorded = 1 "
        "WHERE subscription_id = ? AND disabled_at_s = ?",
        (disablement.subscription_id, disablement.disabled_at_s),
    )


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
