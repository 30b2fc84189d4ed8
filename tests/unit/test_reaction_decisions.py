"""The reactions' decision of one event, in one transaction of the product database (spec
"Reactions": loop guards, then the gate): each matching subscription's fate, the metric
points it counts, what a suppression logs, and what a later decision of the same event finds.
The consumer around it (leases, effects, the stream) is in tests/integration/test_reactions.py.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest

from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.metrics import DataPoint
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.deliveries import webhook_id, workflow_instance_id
from rhumbatron.reactions.guards import Hop, SuppressionReason, cause_chain, suppressions
from rhumbatron.reactions.reaction_decisions import (
    REFUSED_METRIC,
    SUPPRESSED_METRIC,
    EventDecision,
    decide_event,
)
from rhumbatron.reactions.store import REACTIONS_SCHEMA
from rhumbatron.router.claims import CLAIMS_SCHEMA, claim_leases

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
TENANT, PROJECT = "acme", "acme-web"


@dataclass(frozen=True)
class Flow:
    workflow: str = "triage"
    kind: Literal["workflow"] = "workflow"


@dataclass(frozen=True)
class Rules:
    cooldown_s: float | None = 0
    enabled: bool = True


@dataclass(frozen=True)
class Sub:
    """A matching subscription as the registry answers it (a workflow reaction)."""

    subscription_id: str
    governance: Rules = field(default_factory=Rules)
    tenant_id: str = TENANT
    reaction: Flow = field(default_factory=Flow)
    endpoint_disabled: object | None = None


def database() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(REACTIONS_SCHEMA + CLAIMS_SCHEMA)
    return db


def completed(task: str, *, correlation_id: str = "corr-1") -> Event:
    ctx = FactContext(Caller(TENANT, "system:test", correlation_id), PROJECT, NOW)
    return ctx.fact("task.completed", {"agentId": "a1"}, change_id="c1", task_id=task)


def decide(
    db: sqlite3.Connection,
    event: Event,
    *subs: Sub,
    at: datetime = NOW,
    limits: ReactionSettings | None = None,
) -> EventDecision:
    return decide_event(
        db, event, list(subs), now=at, limits=limits or ReactionSettings(), lease_s=30
    )


def point(name: str, key: str, **dimensions: str) -> DataPoint:
    return DataPoint(
        name=name, dimensions={"tenant": TENANT, **dimensions}, event_id=key, project_id=PROJECT
    )


def test_a_disabled_subscription_is_decided_once_and_never_again() -> None:
    # GIVEN a matching subscription switched off
    db, event = database(), completed("t1")
    off = Sub("sub_off", Rules(enabled=False))
    # WHEN the event is decided, then decided again (a redelivery)
    first, again = decide(db, event, off), decide(db, event, off)
    # THEN the first plans nothing to run, and marks the delivery done: the second finds
    # nothing of its own to decide, and nothing held by another run
    assert [(p.key, p.run) for p in first.plans] == [(webhook_id(event.event_id, "sub_off"), False)]
    assert (again.plans, again.held) == ([], False)
    assert first.points == again.points == []


def test_a_delivery_held_by_another_run_is_said_so_whatever_follows_it() -> None:
    # GIVEN three matching subscriptions: the first's delivery held by another run's live
    #   lease, the second's done by an earlier decision, the third's new
    db, event = database(), completed("t1")
    held, done, new = Sub("sub_held"), Sub("sub_done", Rules(enabled=False)), Sub("sub_new")
    decide(db, event, done)
    claim_leases(
        db, "reactions", [webhook_id(event.event_id, "sub_held")], now_s=NOW.timestamp(), lease_s=30
    )
    # WHEN the event is decided
    decision = decide(db, event, held, done, new)
    # THEN the held one is said so, and the new one is still decided and runs
    assert decision.held is True
    assert [(p.subscription.subscription_id, p.run) for p in decision.plans] == [("sub_new", True)]


def test_a_suppression_is_logged_counted_and_recorded_under_its_delivery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a subscription with no cooldown of its own (the default, 60 s, applies) that fired
    db = database()
    sub = Sub("sub_1", Rules(cooldown_s=None))
    first = completed("t1")
    assert decide(db, first, sub).plans[0].run
    # WHEN a second matching event is decided 10 s later
    second = completed("t2")
    key = webhook_id(second.event_id, "sub_1")
    with caplog.at_level(logging.INFO, logger="rhumbatron.reactions.reaction_decisions"):
        decision = decide(db, second, sub, at=NOW + timedelta(seconds=10))
    # THEN it is suppressed by the cooldown: logged, counted and recorded under its delivery
    detail = (
        f"the subscription fired 10.0 s ago (on {webhook_id(first.event_id, 'sub_1')}); "
        "its cooldown is 60 s"
    )
    assert caplog.messages == [f"reaction {key} suppressed (cooldown): {detail}"]
    assert decision.points == [point(SUPPRESSED_METRIC, key, reason="cooldown")]
    (recorded,) = suppressions(db)
    assert (recorded.delivery_key, recorded.reason, recorded.detail) == (
        key,
        SuppressionReason.COOLDOWN,
        detail,
    )
    # AND decided again, it is done: nothing of its own is left to decide
    assert decide(db, second, sub, at=NOW + timedelta(seconds=11)).plans == []


def test_a_spent_budget_refuses_naming_the_budget_and_counts_the_refusal() -> None:
    db = database()
    limits = ReactionSettings(reaction_daily_budget=1)
    decide(db, completed("t1"), Sub("sub_1"), limits=limits)
    event = completed("t2")
    key = webhook_id(event.event_id, "sub_1")
    decision = decide(db, event, Sub("sub_1"), limits=limits)
    (recorded,) = suppressions(db)
    assert recorded.detail == (
        f"tenant {TENANT!r} used 1 of its 1 reactions of 2026-12-06 "
        "(RHUMBATRON_REACTION_DAILY_BUDGET)"
    )
    assert decision.points == [point(REFUSED_METRIC, key, gate="budget")]
    assert decision.plans[0].over_budget == (1, "2026-12-06")


def test_a_full_in_flight_cap_counts_each_refusal_apart() -> None:
    db = database()
    limits = ReactionSettings(reaction_in_flight_cap=1)
    decide(db, completed("t1"), Sub("sub_1"), limits=limits)
    event = completed("t2")
    key = webhook_id(event.event_id, "sub_1")
    decision = decide(db, event, Sub("sub_1"), limits=limits)
    assert decision.refused_in_flight is True
    assert decision.points == [point(REFUSED_METRIC, f"{key}:{NOW.timestamp()}", gate="in_flight")]


def test_a_reactions_workflow_instance_carries_its_chain_to_the_facts_it_causes() -> None:
    # GIVEN an event a subscription reacts to
    db, event = database(), completed("t1")
    assert decide(db, event, Sub("sub_1")).plans[0].run
    # WHEN a fact correlates with the workflow instance the reaction started
    caused = completed("t9", correlation_id=workflow_instance_id(event.event_id, "sub_1"))
    # THEN it inherits the reaction's hop
    assert cause_chain(db, caused).hops == (Hop(event.event_id, "sub_1"),)
