"""The facts the reactions write themselves, in the project's admin shard (its outbox
publishes them): ``budget.exceeded`` caused by the refused event, one ``reaction.disabled``
per disablement however often it is written, and what recording a disablement logs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import project_admin_key
from rhumbatron.errors import RhumbatronError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import stable_event_id
from rhumbatron.reactions.reaction_facts import ShardFacts, record_disablement
from rhumbatron.reactions.webhook_ledger import Disablement
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
PROJECT = "acme-web"
DISABLED = Disablement(
    subscription_id="sub_1",
    tenant_id="acme",
    project_id=PROJECT,
    name="hook",
    reason="failing",
    detail="answered 500 for 3 days",
    delivery_key="evt_1:sub_1",
    status_code=500,
    failing_since_s=1_764_720_000.0,
    disabled_at_s=1_765_015_200.5,
)


@pytest.fixture
def app(tmp_path: Path) -> Rhumbatron:
    settings = load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")
    return bootstrap(settings, clock=ManualClock(NOW), alarms=RecordingAlarmSink())


def written(app: Rhumbatron) -> list[dict[str, Any]]:
    """The envelopes in the project's admin shard's outbox, in order."""
    shard = app.resource_shard(PROJECT, project_admin_key(PROJECT))
    rows = shard.connection.execute("SELECT envelope FROM outbox ORDER BY seq")
    return [json.loads(bytes(row[0])) for row in rows]


def facts_of(app: Rhumbatron) -> ShardFacts:
    return ShardFacts(app.resource_shard, app.clock)


def test_budget_exceeded_is_caused_and_correlated_by_the_refused_event(app: Rhumbatron) -> None:
    ctx = FactContext(Caller("acme", "system:test", "corr-1"), PROJECT, NOW)
    refused = ctx.fact("task.completed", {"agentId": "a1"}, change_id="c1", task_id="t1")
    facts_of(app).budget_exceeded(refused, subscription_id="sub_1", limit=3, day="2026-12-06")
    (fact,) = written(app)
    assert fact["eventType"] == "budget.exceeded"
    assert (fact["causedBy"], fact["correlationId"]) == (refused.event_id, refused.event_id)
    assert fact["actor"] == "system:reactions"
    assert fact["payload"] == {
        "budget": "reactions_per_day",
        "limit": 3,
        "day": "2026-12-06",
        "subscriptionId": "sub_1",
        "eventId": refused.event_id,
    }


@pytest.mark.usefixtures("local_time_far_from_utc")
def test_one_reaction_disabled_per_disablement_however_often_it_is_written(
    app: Rhumbatron,
) -> None:
    # WHEN a disablement's fact is written twice (a crash before its flag was set)
    facts_of(app).reaction_disabled(DISABLED)
    facts_of(app).reaction_disabled(DISABLED)
    # THEN one fact, under the ID of the subscription and the moment it was disabled, saying
    #   since when its endpoint failed, in UTC
    (fact,) = written(app)
    assert fact["eventId"] == stable_event_id("sub_1", "reaction.disabled", None, "1765015200.5")
    assert fact["eventType"] == "reaction.disabled"
    assert fact["payload"]["failingSince"] == "2025-12-03T00:00:00Z"
    assert fact["payload"]["deliveryKey"] == "evt_1:sub_1"
    # AND one that was gone at once says no time
    gone = dataclasses.replace(DISABLED, failing_since_s=None, disabled_at_s=2.0)
    facts_of(app).reaction_disabled(gone)
    assert written(app)[1]["payload"]["failingSince"] is None


class RefusingFacts:
    def reaction_disabled(self, disablement: Disablement) -> None:
        raise RhumbatronError("the shard is busy")

    def budget_exceeded(self, event: Event, **fields: Any) -> None:
        raise AssertionError("not asked here")


def test_recording_a_disablement_says_so_or_says_it_will_be_written_later(
    app: Rhumbatron, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rhumbatron.reactions.reaction_facts"):
        asyncio.run(record_disablement(RefusingFacts(), app.product(), DISABLED))
        asyncio.run(record_disablement(facts_of(app), app.product(), DISABLED))
    assert caplog.messages == [
        "cannot record reaction.disabled for sub_1 yet (the shard is busy); the next retry "
        "pass will",
        "webhook subscription sub_1 (hook) disabled: answered 500 for 3 days",
    ]
