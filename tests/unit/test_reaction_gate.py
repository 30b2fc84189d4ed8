"""The admission gate on its own tables (spec "The gate": a daily budget per tenant, an
in-flight cap per tenant): each answer carries the numbers it compared, a delivery is charged
once however often it is admitted, and ``budget.exceeded`` is claimed once per tenant and day."""

from __future__ import annotations

import sqlite3

from rhumbatron.reactions.gate import Admission, GateDecision, admit, claim_budget_fact, release
from rhumbatron.reactions.store import REACTIONS_SCHEMA

DAY = "2026-12-06"


def database() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.executescript(REACTIONS_SCHEMA)
    return db


def ask(db: sqlite3.Connection, key: str, *, now_s: float = 100.0, budget: int = 3) -> GateDecision:
    return admit(
        db,
        tenant_id="acme",
        delivery_key=key,
        day=DAY,
        now_s=now_s,
        daily_budget=budget,
        in_flight_cap=2,
        lease_s=30,
    )


def test_each_admission_says_how_much_of_the_budget_is_used_and_a_retry_is_charged_once() -> None:
    db = database()
    # WHEN two deliveries are admitted, and the first is admitted again (its retry)
    first, second = ask(db, "k1"), ask(db, "k2")
    retry = ask(db, "k1")
    # THEN each admission names the budget used with it and the budget; the retry used none
    assert first == GateDecision(Admission.ADMITTED, 1, 3)
    assert second == GateDecision(Admission.ADMITTED, 2, 3)
    assert retry == GateDecision(Admission.ADMITTED, 2, 3)


def test_a_full_in_flight_cap_says_how_many_run_and_the_cap_until_a_slot_is_freed() -> None:
    db = database()
    ask(db, "k1")
    ask(db, "k2")
    # WHEN a third delivery asks while two hold their slots, then after one is released
    refused = ask(db, "k3")
    release(db, ["k1"])
    admitted = ask(db, "k3")
    # THEN it was refused with the two running and the cap of 2, then admitted
    assert refused == GateDecision(Admission.IN_FLIGHT_FULL, 2, 2)
    assert admitted == GateDecision(Admission.ADMITTED, 3, 3)
    # AND a slot whose lease ran out is free without a release
    assert ask(db, "k4", now_s=131.0, budget=5) == GateDecision(Admission.ADMITTED, 4, 5)


def test_a_spent_budget_refuses_with_its_numbers_and_its_fact_is_claimed_once_a_day() -> None:
    # GIVEN the day's three reactions admitted and done
    db = database()
    for key in ("k1", "k2", "k3"):
        assert ask(db, key).admitted
        release(db, [key])
    # WHEN a fourth asks  THEN it is over the budget, with its numbers
    assert ask(db, "k4") == GateDecision(Admission.OVER_BUDGET, 3, 3)
    # AND the refusal's fact is claimed once per tenant and UTC day
    claims = [
        claim_budget_fact(db, tenant_id="acme", day=DAY),
        claim_budget_fact(db, tenant_id="acme", day=DAY),
        claim_budget_fact(db, tenant_id="acme", day="2026-12-07"),
    ]
    assert claims == [True, False, True]
