"""The admission gate (seed 002 §5, S2-129): every reaction asks its tenant's daily budget and
in-flight cap before it runs.

* **Budget**: at most ``reaction_daily_budget`` admissions per tenant and UTC day. A refusal
  skips the reaction (it is recorded as a suppression, counted in a metric, and the day's
  first refusal records ``budget.exceeded``); it is never run late.
* **In flight**: at most ``reaction_in_flight_cap`` reactions of a tenant running at once. A
  refusal is not a skip: the event goes back to its stream and the cursor lags, so a storm
  queues instead of stampeding. A slot whose holder died frees after
  ``reaction_in_flight_lease_s``.

A delivery is charged once: a retry of the same ``(event, subscription)`` is not counted
against the budget again. The functions run inside the caller's product transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Admission", "GateDecision", "admit", "claim_budget_fact", "release"]


class Admission(StrEnum):
    ADMITTED = "admitted"
    OVER_BUDGET = "over_budget"
    IN_FLIGHT_FULL = "in_flight_full"


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What the gate answered, with the numbers it compared."""

    admission: Admission
    used: int
    limit: int

    @property
    def admitted(self) -> bool:
        return self.admission is Admission.ADMITTED


def admit(
    db: sqlite3.Connection,
    *,
    tenant_id: str,
    delivery_key: str,
    day: str,
    now_s: float,
    daily_budget: int,
    in_flight_cap: int,
    lease_s: float,
) -> GateDecision:
    """Ask the budget, then the in-flight cap; on admission charge the budget (once per
    delivery) and take an in-flight slot until :func:`release`."""
    charged = (
        db.execute(
            "SELECT 1 FROM reaction_admissions WHERE delivery_key = ?", (delivery_key,)
        ).fetchone()
        is not None
    )
    used = int(
        db.execute(
            "SELECT COUNT(*) FROM reaction_admissions WHERE tenant_id = ? AND day = ?",
            (tenant_id, day),
        ).fetchone()[0]
    )
    if not charged and used >= daily_budget:
        return GateDecision(Admission.OVER_BUDGET, used, daily_budget)
    db.execute(
        "DELETE FROM reaction_in_flight WHERE tenant_id = ? AND until_s <= ?", (tenant_id, now_s)
    )
    running = int(
        db.execute(
            "SELECT COUNT(*) FROM reaction_in_flight WHERE tenant_id = ? AND delivery_key != ?",
            (tenant_id, delivery_key),
        ).fetchone()[0]
    )
    if running >= in_flight_cap:
        return GateDecision(Admission.IN_FLIGHT_FULL, running, in_flight_cap)
    if not charged:
        db.execute(
            "INSERT INTO reaction_admissions (delivery_key, tenant_id, day, admitted_at_s) "
            "VALUES (?, ?, ?, ?)",
            (delivery_key, tenant_id, day, now_s),
        )
        used += 1
    db.execute(
        "INSERT INTO reaction_in_flight (delivery_key, tenant_id, until_s) VALUES (?, ?, ?) "
        "ON CONFLICT (delivery_key) DO UPDATE SET until_s = excluded.until_s",
        (delivery_key, tenant_id, now_s + lease_s),
    )
    return GateDecision(Admission.ADMITTED, used, daily_budget)


def release(db: sqlite3.Connection, delivery_keys: list[str]) -> None:
    """Free the in-flight slots of finished deliveries (done or failed)."""
    db.executemany(
        "DELETE FROM reaction_in_flight WHERE delivery_key = ?", [(k,) for k in delivery_keys]
    )


def claim_budget_fact(db: sqlite3.Connection, *, tenant_id: str, day: str) -> bool:
    """True once per tenant and day: whether this refusal records ``budget.exceeded``."""
    return (
        db.execute(
            "INSERT OR IGNORE INTO reaction_budget_facts (tenant_id, day) VALUES (?, ?)",
            (tenant_id, day),
        ).rowcount
        == 1
    )
