"""Rule-based causal routing end to end: real shards, the real router and COMMANDS stream,
Clef-flash through its store (no API key: it abstains, and an abstention wakes)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio

from project_roots import ensure_project_roots
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import DeclareIntent, RecordTaskStatus
from rhumbatron.causal.clef_flash import ClefFlash
from rhumbatron.causal.command_cap import CommandCap
from rhumbatron.causal.routing import RoutedEvent, RuleBasedRouting
from rhumbatron.causal.rules import StateEffect
from rhumbatron.causal.store import CausalStore
from rhumbatron.causal.world import ShardWorld
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.log_context import CorrelationIdFilter
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import ActorError
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import event_stream_subject, stream_index
from rhumbatron.router.records import RecordOutcome
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

pytestmark = pytest.mark.integration

PROJECT = "acme-web"
SYSTEM = Caller("acme", "system:test", correlation_id="corr-causal")
WRITER = Caller("acme", "agent:writer", correlation_id="corr-causal")
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


@dataclass
class RecordingLifecycle:
    """The lifecycle's effects, remembered (the Candidate aggregate arrives with #5)."""

    applied: list[tuple[str, StateEffect]] = field(default_factory=list)

    async def apply(self, event: Event, effect: StateEffect) -> None:
        self.applied.append((event.event_id, effect))


@dataclass
class Wiring:
    app: Rhumbatron
    routing: RuleBasedRouting
    lifecycle: RecordingLifecycle
    routed: list[RoutedEvent]


async def wire(settings: Settings, clock: ManualClock, **overrides: Any) -> Wiring:
    values = settings.model_dump() | overrides
    settings = load_settings(**values)
    store = CausalStore(settings)
    lifecycle = RecordingLifecycle()
    routed: list[RoutedEvent] = []
    holder: dict[str, Rhumbatron] = {}

    async def bus() -> Any:
        return await holder["app"].command_bus()

    routing = RuleBasedRouting(
        world=None,  # type: ignore[arg-type]  # set below, once the runtime exists
        bus=bus,
        clock=clock,
        clef_flash=ClefFlash(settings, store, clock),
        cap=CommandCap(settings, store),
        effects=lifecycle,
        routed=routed,
    )
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink(), causal_routing=routing)
    holder["app"] = app
    routing.world = ShardWorld(app.actors)
    await app.ensure_streams()
    return Wiring(app, routing, lifecycle, routed)


@pytest_asyncio.fixture
async def wiring(settings: Settings, clock: ManualClock) -> AsyncIterator[Wiring]:
    clock.set(NOW)
    w = await wire(settings, clock)
    yield w
    await w.app.close()


def given_an_agent_working_on_src_auth(app: Rhumbatron) -> None:
    shard = app.resource_shard(PROJECT, change_resource_key("c1"))
    for task_id, status in (("t0", "ready"), ("t1", "ready"), ("t2", "ready")):
        shard.apply(SYSTEM, RecordTaskStatus(change_id="c1", task_id=task_id, status=status))
    shard.apply(
        SYSTEM, RecordTaskStatus(change_id="c1", task_id="t1", status="assigned", agent_id="a1")
    )
    app.resource_shard(PROJECT, "src/auth/").apply(
        SYSTEM, DeclareIntent(intent_id="i1", agent_id="a1", paths=("src/auth/",))
    )


def events() -> list[Event]:
    system = FactContext(SYSTEM, PROJECT, NOW)
    writer = FactContext(WRITER, PROJECT, NOW)
    return [
        writer.fact(
            "intent.declared",
            {"intentId": "i9", "agentId": "writer", "paths": ["src/auth/login.py"]},
            resource="src/auth/login.py",
        ),
        system.fact("task.completed", {"agentId": "a0"}, change_id="c1", task_id="t0"),
        system.fact(
            "canonical.advanced",
            {"generation": 2, "previousGeneration": 1, "candidateId": "cand-1"},
        ),
    ]


async def subjects(app: Rhumbatron) -> dict[str, int]:
    js = (await app.nats()).jetstream()
    info = await js.stream_info(COMMAND_STREAM, subjects_filter="cmd.>")
    return dict(info.state.subjects or {})


async def test_the_router_sends_what_the_rules_decide_and_a_prefix_overlap_wakes_on_abstain(
    wiring: Wiring,
) -> None:
    # GIVEN agent a1 holding t1 with an intent on src/auth/, and ready Tasks in c1
    app = wiring.app
    given_an_agent_working_on_src_auth(app)
    batch = events()
    ensure_project_roots(app, batch)  # the router refuses an event of a project with no root
    js = (await app.nats()).jetstream()
    subject = event_stream_subject(stream_index(PROJECT))
    for event in batch:
        await js.publish(subject, event.to_json(), headers={"Nats-Msg-Id": event.event_id})

    # WHEN the stream is nudged
    report = await app.router().nudge(stream_index(PROJECT))

    # THEN every event was routed
    assert report.subscriptions["causal-router"].applied == 3
    intent, completed, advanced = batch
    by_event = {r.event_id: r for r in wiring.routed}
    # the prefix overlap asked Clef-flash, which abstained (no key) — and an abstention wakes
    assert by_event[intent.event_id].clef_flash == (("a1", "abstain"),)
    assert by_event[intent.event_id].sent == (f"cmd_{intent.event_id}_t1",)
    assert by_event[completed.event_id].sent == (f"cmd_{completed.event_id}_dispatch",)
    assert by_event[advanced.event_id].sent == (
        f"cmd_{advanced.event_id}_t1",
        f"cmd_{advanced.event_id}_recompose",
        f"cmd_index_{PROJECT}_2",
    )
    assert [e.kind for _, e in wiring.lifecycle.applied] == ["candidates_after_advance"]
    assert await subjects(app) == {
        "cmd.agent-wakeups": 2,
        "cmd.integration": 2,
        "cmd.indexing": 1,
    }
    # AND the wake Clef-flash caused says so, for the agent's own Change and Task
    stored = [Command.parse((await js.get_msg(COMMAND_STREAM, seq)).data) for seq in range(1, 6)]
    (wake,) = [c for c in stored if c.command_id == f"cmd_{intent.event_id}_t1"]
    assert (wake.change_id, wake.task_id) == ("c1", "t1")
    assert wake.payload.model_dump(by_alias=True)["reason"] == "clef_flash"


async def test_routing_the_same_events_again_sends_nothing_twice(wiring: Wiring) -> None:
    # GIVEN the events routed once
    given_an_agent_working_on_src_auth(wiring.app)
    batch = events()
    await wiring.routing.route(batch)
    before = await subjects(wiring.app)

    # WHEN they are routed again (a redelivery whose claims were lost, a replay)
    outcomes = await wiring.routing.route(batch)

    # THEN every command was a duplicate JetStream dropped, and Clef-flash reused its decision
    assert {o.outcome.value for o in outcomes.values()} == {"applied"}
    again = wiring.routed[len(batch) :]
    assert all(r.sent == () for r in again)
    assert sum(len(r.duplicates) for r in again) == 5  # 2 wakes, dispatch, recompose, index
    assert await subjects(wiring.app) == before


async def test_the_change_cap_drops_commands_past_it_and_counts_them(
    settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a cap of one counted command per Change per day
    clock.set(NOW)
    w = await wire(settings, clock, change_command_cap_per_day=1)
    try:
        given_an_agent_working_on_src_auth(w.app)
        system = FactContext(SYSTEM, PROJECT, NOW)
        first = system.fact("task.completed", {"agentId": "a0"}, change_id="c1", task_id="t0")
        second = system.fact("task.failed", {"reason": "red"}, change_id="c1", task_id="t2")

        # WHEN two events of c1 each cause a counted command
        await w.routing.route([first, second])

        # THEN the first was sent, the second's change.settle dropped by the cap
        assert w.routed[0].sent == (f"cmd_{first.event_id}_dispatch",)
        assert w.routed[1].dropped_by_cap == (f"cmd_{second.event_id}_settle",)
    finally:
        await w.app.close()


@dataclass
class QueueWatchingLifecycle:
    """A lifecycle that notes, as each effect is applied, the commands already queued."""

    app: Rhumbatron
    queued_at_apply: list[dict[str, int]] = field(default_factory=list)

    async def apply(self, event: Event, effect: StateEffect) -> None:
        self.queued_at_apply.append(await subjects(self.app))


async def test_candidates_recompose_is_sent_only_after_the_stale_marking(
    wiring: Wiring,
) -> None:
    # GIVEN a lifecycle that looks at the COMMANDS stream when the stale marking is applied
    sink = QueueWatchingLifecycle(wiring.app)
    wiring.routing.effects = sink
    (advanced,) = events()[2:]

    # WHEN canonical.advanced is routed
    await wiring.routing.route([advanced])

    # THEN candidates.recompose (the integration queue's only command here) was not yet queued
    #   when the Candidates were marked stale, and it was queued afterwards
    assert [r.event_id for r in wiring.routed] == [advanced.event_id]
    assert f"cmd_{advanced.event_id}_recompose" in wiring.routed[0].sent
    (queued,) = sink.queued_at_apply
    assert "cmd.integration" not in queued


@dataclass
class BrokenLifecycle:
    """A lifecycle whose every effect raises ``error``."""

    error: Exception

    async def apply(self, event: Event, effect: StateEffect) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (ActorError("the change shard is busy"), RecordOutcome.retry),
        (ValueError("no candidate cand-1"), RecordOutcome.failed),
    ],
    ids=["an actor that is busy: retried", "anything else: failed, and logged"],
)
async def test_an_effect_that_raises_retries_or_fails_the_event_saying_why(
    wiring: Wiring,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
    outcome: Any,
) -> None:
    # GIVEN a promotion whose effect the lifecycle cannot apply
    wiring.routing.effects = BrokenLifecycle(error)
    (advanced,) = events()[2:]
    # WHEN it is routed (the log handler stamps the bound correlation ID, as in Lambda)
    caplog.handler.addFilter(CorrelationIdFilter())
    with caplog.at_level(logging.ERROR, logger="rhumbatron.causal.routing"):
        outcomes = await wiring.routing.route([advanced])
    # THEN its outcome names the error; only a failure is logged as one, with the event's
    #   correlationId (to follow it across functions)
    assert outcomes == {advanced.event_id: outcome(f"{type(error).__name__}: {error}")}
    logged = [
        (r.getMessage(), getattr(r, "correlation_id", None))
        for r in caplog.records
        if r.levelno == logging.ERROR
    ]
    failed = outcome == RecordOutcome.failed
    expected = [(f"routing {advanced.event_id} failed", advanced.correlation_id)]
    assert logged == (expected if failed else [])


async def test_a_wake_dropped_by_one_changes_cap_does_not_stop_the_next_changes(
    settings: Settings, clock: ManualClock
) -> None:
    # GIVEN agents of two Changes, and Change c1 already at a cap of one command a day
    clock.set(NOW)
    w = await wire(settings, clock, change_command_cap_per_day=1)
    try:
        for change, task_id, agent in (("c1", "t1", "a1"), ("c2", "t5", "a2")):
            shard = w.app.resource_shard(PROJECT, change_resource_key(change))
            shard.apply(SYSTEM, RecordTaskStatus(change_id=change, task_id=task_id, status="ready"))
            shard.apply(
                SYSTEM,
                RecordTaskStatus(
                    change_id=change, task_id=task_id, status="assigned", agent_id=agent
                ),
            )
        assert w.routing.cap.admit("c1", "agent.wake", NOW)
        (advanced,) = events()[2:]
        # WHEN the promotion wakes both agents
        await w.routing.route([advanced])
        # THEN c1's wake is dropped and c2's still goes out, under the rule that sent it
        (routed,) = w.routed
        assert routed.rule == "canonical.advanced"
        assert routed.dropped_by_cap == (f"cmd_{advanced.event_id}_t1",)
        assert set(routed.sent) == {
            f"cmd_{advanced.event_id}_t5",
            f"cmd_{advanced.event_id}_recompose",
            "cmd_index_acme-web_2",
        }
    finally:
        await w.app.close()
