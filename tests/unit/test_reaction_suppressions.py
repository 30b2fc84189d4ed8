"""A suppression — a matching subscription that did not fire — is recorded once, with the
event's identity and its cause chain, and read back newest first, of one tenant or of all, up
to a limit of 100 by default."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.guards import (
    CauseChain,
    Hop,
    Suppression,
    SuppressionReason,
    record_suppression,
    suppressions,
)
from rhumbatron.reactions.store import REACTIONS_SCHEMA

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
CHAIN = CauseChain((Hop("evt_a", "sub_1"), Hop("evt_b", "sub_2")))


def database() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.executescript(REACTIONS_SCHEMA)
    return db


def completed(tenant: str, task: str) -> Event:
    ctx = FactContext(Caller(tenant, "system:test", "corr-1"), f"{tenant}-web", NOW)
    return ctx.fact("task.completed", {"agentId": "a1"}, change_id="c1", task_id=task)


def suppress(db: sqlite3.Connection, event: Event, key: str, at_s: float) -> bool:
    return record_suppression(
        db,
        event,
        subscription_id="sub_3",
        delivery_key=key,
        reason=SuppressionReason.DEPTH,
        detail="depth 2 reached",
        chain=CHAIN,
        now_s=at_s,
    )


def test_a_suppression_is_recorded_once_and_read_back_whole() -> None:
    # GIVEN a fact suppressed for a subscription
    db = database()
    event = completed("acme", "t1")
    # WHEN it is recorded, then again (a redelivery)
    first, again = suppress(db, event, "k1", 5.0), suppress(db, event, "k1", 6.0)
    # THEN only the first wrote a row, and it reads back with every field
    assert (first, again) == (True, False)
    assert suppressions(db) == [
        Suppression(
            delivery_key="k1",
            tenant_id="acme",
            project_id="acme-web",
            event_id=event.event_id,
            event_type="task.completed",
            subscription_id="sub_3",
            reason=SuppressionReason.DEPTH,
            detail="depth 2 reached",
            depth=2,
            cause_chain=CHAIN,
            recorded_at_s=5.0,
        )
    ]


def test_suppressions_are_listed_newest_first_by_tenant_and_at_most_100_unless_told() -> None:
    # GIVEN 101 suppressions of one tenant and one of another, a second apart
    db = database()
    for n in range(101):
        suppress(db, completed("acme", f"t{n}"), f"k{n:03d}", float(n))
    suppress(db, completed("globex", "t0"), "g0", 200.0)

    # WHEN they are listed
    every = suppressions(db)
    acme = suppressions(db, tenant_id="acme", limit=3)

    # THEN 100 by default, the newest first; a tenant's are its own
    assert len(every) == 100
    assert [s.delivery_key for s in every[:3]] == ["g0", "k100", "k099"]
    assert [(s.tenant_id, s.delivery_key) for s in acme] == [
        ("acme", "k100"),
        ("acme", "k099"),
        ("acme", "k098"),
    ]
