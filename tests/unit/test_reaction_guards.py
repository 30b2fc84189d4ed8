"""The loop guards on their own (spec "Loop guards"): where an event's cause chain is found
(its ``causedBy``, its correlation, or the command of a ``<commandId>:<attempt>``
correlation), which of two chains counts, and the guards' answers word for word."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.guards import (
    CauseChain,
    Hop,
    SuppressionReason,
    cause_chain,
    check_guards,
    register_causes,
)
from rhumbatron.reactions.store import REACTIONS_SCHEMA

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
ONE = CauseChain((Hop("evt_a", "sub_1"),))
OTHER = CauseChain((Hop("evt_b", "sub_2"),))
NONE = CauseChain()


def database(**chains: CauseChain) -> sqlite3.Connection:
    """The reactions' tables, with ``chains`` registered under their cause keys."""
    db = sqlite3.connect(":memory:")
    db.executescript(REACTIONS_SCHEMA)
    for key, chain in chains.items():
        register_causes(db, tenant_id="acme", chain=chain, cause_keys=[key], now_s=1.0)
    return db


def event(
    *,
    correlation_id: str = "corr-1",
    caused_by: str | None = None,
    event_type: str = "task.completed",
    actor: str = "system:test",
) -> Event:
    ctx = FactContext(Caller("acme", actor, correlation_id, caused_by), "acme-web", NOW)
    if event_type == "reaction.disabled":
        payload = {
            "subscriptionId": "sub_9",
            "name": "hook",
            "reason": "gone",
            "deliveryKey": "evt_x:sub_9",
            "lastError": "410",
        }
        return ctx.fact(event_type, payload)
    return ctx.fact(event_type, {"agentId": "a1"}, change_id="c1", task_id="t1")


def guard(subject: Event, chain: CauseChain = NONE) -> tuple[SuppressionReason, str] | None:
    return check_guards(
        subject,
        chain,
        subscription_id="sub_3",
        agent_id=None,
        depth_cap=1,
        cooldown_s=0,
        last_fire=None,
        delivery_key="k",
        now_s=0,
    )


def test_a_wake_attempts_correlation_finds_the_chain_of_its_command() -> None:
    # GIVEN a chain registered under a command ID that itself holds a colon
    db = database(**{"cmd_x:wake": ONE})
    # WHEN an event correlates with an attempt of that command  THEN it inherits the chain
    assert cause_chain(db, event(correlation_id="cmd_x:wake:2")) == ONE
    # AND a correlation whose tail is no attempt number names no command
    assert cause_chain(db, event(correlation_id="cmd_x:wake:b")) == NONE
    assert cause_chain(database(corr=ONE), event(correlation_id="corr:x")) == NONE


def test_of_two_chains_as_deep_the_causing_events_counts() -> None:
    db = database(evt_cause=ONE, corr=OTHER)
    assert cause_chain(db, event(correlation_id="corr", caused_by="evt_cause")) == ONE
    # AND a deeper one counts wherever it is found
    deeper = CauseChain((*OTHER.hops, Hop("evt_c", "sub_4")))
    db = database(evt_cause=ONE, corr=deeper)
    assert cause_chain(db, event(correlation_id="corr", caused_by="evt_cause")) == deeper


def test_a_reactions_own_fact_never_fires_a_reaction() -> None:
    assert guard(event(event_type="reaction.disabled")) == (
        SuppressionReason.REACTION_FAMILY,
        "reaction.disabled is a reaction's own fact",
    )
    assert guard(event()) is None


def test_an_event_at_the_depth_cap_is_held_back_naming_the_cap_and_its_setting() -> None:
    assert guard(event(), ONE) == (
        SuppressionReason.DEPTH,
        "the event is 1 reaction(s) deep; the cap is 1 (RHUMBATRON_REACTION_DEPTH_CAP)",
    )
