"""The emitters of the six kinds that had none (the review rule's KNOWN_GAPS, issue #7):
``task.blocked``, ``change.settled``, ``promotion.requested``, ``agent.woke``,
``model.routed`` and ``challenge.created``.

Each is written by a real transition, through the path that decides it (a Task blocked, a
settle pass, an approval, the wake consumer, the causal router's Clef-flash question, an
agent's challenge), on real ResourceShard files in ``tmp_path``. Each test proves the fact
comes in the one transaction of its transition (one ``TransactResult`` carries the move and
the fact, or the fact lands with the state it narrates) and that a repeat writes it once.
Only the paths that send commands (a settle that wakes again, the router) use a real
nats-server, as their own tests do.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from rhumbatron.actors.actor import TransactResult
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import (
    AcquireClaim,
    AdmitAgent,
    BlockTaskForDeadLetter,
    CompleteTask,
    ComposeCandidate,
    CreateChallenge,
    CreateChange,
    DecideCandidate,
    DeclareIntent,
    FailTask,
    ProposeChangeset,
    RecordModelRouted,
    RecordPromotion,
    RecordPromotionRefused,
    RecordTaskStatus,
    SettleChange,
    StartTask,
)
from rhumbatron.causal.clef_flash import ClefFlash
from rhumbatron.causal.command_cap import CommandCap
from rhumbatron.causal.routing import RuleBasedRouting
from rhumbatron.causal.rules import StateEffect, plan_for
from rhumbatron.causal.store import CausalStore
from rhumbatron.causal.world import ShardWorld
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.agents import CLEF_FLASH_PURPOSE, Admission, woke_fact_key
from rhumbatron.domain.candidates import CandidateStatus
from rhumbatron.domain.changes import ChangeStatus, TaskPlan
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.tasks import TaskState, TaskStatus
from rhumbatron.errors import DomainError, PromotionConflictError
from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.messaging.queue_consumer import Delivery
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import stable_event_id
from rhumbatron.queues.wake_consumer import WakeConsumer, WakeOutcome
from rhumbatron.router.records import APPLIED
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

PROJECT = "acme-web"
TENANT = "acme"
CHANGE = "chg-1"
AGENT = "builder-1"
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
CALLER = Caller(TENANT, "system:test", correlation_id="corr-gaps")


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def app(offline_settings: Settings, clock: ManualClock) -> Iterator[Rhumbatron]:
    """The composition root on this test's actor files, with no NATS behind it."""
    clock.set(NOW)
    runtime = bootstrap(offline_settings, clock=clock, alarms=RecordingAlarmSink())
    runtime.project_root(PROJECT).create_project(CALLER, name="Storefront")
    yield runtime
    for ref in list(runtime.actor_refs()):
        runtime.actor(ref).close()


def change_shard(app: Rhumbatron, change_id: str = CHANGE) -> ResourceShard:
    return app.resource_shard(PROJECT, change_resource_key(change_id))


def create(app: Rhumbatron, tasks: Sequence[TaskPlan], *, change_id: str = CHANGE) -> ResourceShard:
    shard = change_shard(app, change_id)
    shard.apply(
        CALLER,
        CreateChange(
            change_id=change_id,
            title="Gift cards",
            client_request_id=f"req-{change_id}",
            requested_by="user:ann",
            tasks=tasks,
        ),
    )
    return shard


def outbox(shard: ResourceShard, event_type: str | None = None) -> list[Event]:
    rows: list[sqlite3.Row] = list(shard.connection.execute("SELECT * FROM outbox ORDER BY seq"))
    events = [Event.parse(bytes(row["envelope"])) for row in rows]
    return [e for e in events if event_type is None or e.event_type == event_type]


def kinds(result: TransactResult) -> list[str]:
    return [f.event_type for f in result.transition.facts]


def tables(result: TransactResult) -> list[str]:
    return [m.table for m in result.transition.patch]


def payload(event: Event) -> dict[str, Any]:
    return event.payload.model_dump(mode="json", by_alias=True)


def delivery(queue: str, delivered: int = 1) -> Delivery:
    return Delivery(queue, stream_seq=1, delivered=delivered, max_deliveries=4, headers={})


# ============================================================================ task.blocked


def test_blocking_a_task_records_task_blocked_with_the_move_once(app: Rhumbatron) -> None:
    # GIVEN a Change with a ready Task
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])

    # WHEN the Task is blocked by a limit, and the same step is retried
    def block() -> TransactResult:
        return shard.apply(
            CALLER,
            RecordTaskStatus(
                change_id=CHANGE,
                task_id="t1",
                status=TaskStatus.BLOCKED,
                blocked_limit="budget",
                reason="the tenant's budget ran out",
                key="budget:1",
            ),
        )

    first, again = block(), block()

    # THEN one transaction moved the row and recorded task.blocked (reason and limit)
    assert (tables(first), kinds(first)) == (["tasks"], ["task.blocked"])
    task = shard.task_state("t1")
    assert task is not None and (task.status, task.blocked_limit) == ("blocked", "budget")
    (fact,) = outbox(shard, "task.blocked")
    assert fact.event_id == stable_event_id(CHANGE, "task.blocked", "t1", "budget:1")
    assert payload(fact) == {"reason": "the tenant's budget ran out", "blockedLimit": "budget"}
    # AND the retry wrote nothing
    assert again.events_added == 0 and again.transition.facts == ()


def test_a_task_cannot_be_blocked_without_a_reason(app: Rhumbatron) -> None:
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    with pytest.raises(DomainError, match="cannot be blocked without a reason"):
        shard.apply(
            CALLER,
            RecordTaskStatus(
                change_id=CHANGE, task_id="t1", status="blocked", blocked_limit="budget"
            ),
        )
    assert outbox(shard, "task.blocked") == []


def test_a_dead_letter_blocks_its_task_with_task_failed_and_task_blocked_once(
    app: Rhumbatron,
) -> None:
    # GIVEN an assigned Task whose wake was dead-lettered
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id=AGENT))
    wake = lifecycle_command(
        "agent.wake",
        "cmd_t1_ready",
        project_id=PROJECT,
        change_id=CHANGE,
        task_id="t1",
        now=NOW,
        payload={"agentId": AGENT, "reason": "task_ready"},
    )

    # WHEN the dead letter is applied, and applied again (a redelivered letter)
    first = shard.apply(CALLER, BlockTaskForDeadLetter(command=wake, reason="boom"))
    again = shard.apply(CALLER, BlockTaskForDeadLetter(command=wake, reason="boom"))

    # THEN the block, task.failed and task.blocked are one transaction, written once
    assert (tables(first), kinds(first)) == (["tasks"], ["task.failed", "task.blocked"])
    assert again.events_added == 0
    (blocked,) = outbox(shard, "task.blocked")
    assert payload(blocked) == {"reason": "boom", "blockedLimit": "dead_letter"}
    assert len(outbox(shard, "task.failed")) == 1


# ============================================================================ change.settled


def failed_task_change(app: Rhumbatron) -> ResourceShard:
    """An open Change whose only Task its Agent failed."""
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    assert shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id=AGENT)) is (
        Admission.ADMITTED
    )
    shard.apply(CALLER, FailTask(task_id="t1", agent_id=AGENT, reason="tests red"))
    return shard


def settle_command(command_id: str = "cmd_settle_chg-1_202603021000") -> Command:
    return lifecycle_command(
        "change.settle",
        command_id,
        project_id=PROJECT,
        change_id=CHANGE,
        now=NOW,
        payload={"reason": "quiet change"},
    )


def test_a_settle_that_fails_the_change_records_change_settled_with_the_move(
    app: Rhumbatron,
) -> None:
    # GIVEN an open Change with a failed Task
    shard = failed_task_change(app)
    # WHEN the settle decision is recorded, and recorded again
    first = shard.apply(
        CALLER,
        SettleChange(
            change_id=CHANGE,
            from_status=ChangeStatus.OPEN,
            to=ChangeStatus.FAILED,
            reason="t1: tests red",
            key="cmd_settle_1",
        ),
    )
    again = shard.apply(
        CALLER,
        SettleChange(
            change_id=CHANGE,
            from_status=ChangeStatus.OPEN,
            to=ChangeStatus.FAILED,
            reason="t1: tests red",
            key="cmd_settle_1",
        ),
    )
    # THEN one transaction moved the Change with change.failed and recorded change.settled
    assert (tables(first), kinds(first)) == (["changes"], ["change.failed", "change.settled"])
    (settled,) = outbox(shard, "change.settled")
    assert settled.event_id == stable_event_id(CHANGE, "change.settled", None, "cmd_settle_1")
    assert payload(settled) == {
        "fromStatus": "open",
        "toStatus": "failed",
        "reason": "t1: tests red",
    }
    # AND the repeat, which finds the Change failed already, writes nothing
    assert again.transition.facts == () and again.events_added == 0


async def test_the_settle_handler_records_its_decision_once_per_settle_command(
    app: Rhumbatron,
) -> None:
    # GIVEN an open Change whose Task failed (the router's change.settle for it was lost)
    shard = failed_task_change(app)
    integration = app.lifecycle().integration
    command = settle_command()
    # WHEN the sweep's change.settle is handled, and redelivered
    await integration(command, delivery("integration"))
    await integration(command, delivery("integration", delivered=2))
    # THEN the Change failed, with change.failed and change.settled once each
    state = shard.change_state(CHANGE)
    assert state is not None and state.status == "failed"
    (settled,) = outbox(shard, "change.settled")
    assert settled.event_id == stable_event_id(CHANGE, "change.settled", None, command.command_id)
    assert payload(settled)["toStatus"] == "failed"
    assert len(outbox(shard, "change.failed")) == 1
    # AND change.settled follows the move it decided
    types = [e.event_type for e in outbox(shard)]
    assert types.index("change.failed") + 1 == types.index("change.settled")


async def test_a_settle_pass_with_nothing_to_decide_records_nothing(app: Rhumbatron) -> None:
    # GIVEN an open Change whose Agent is at work
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id=AGENT))
    before = len(outbox(shard))
    # WHEN a settle runs
    await app.lifecycle().integration(settle_command(), delivery("integration"))
    # THEN the Change stays open and no fact is written: a quiet pass is not a decision
    state = shard.change_state(CHANGE)
    assert state is not None and state.status == "open"
    assert len(outbox(shard)) == before


@pytest.mark.integration
async def test_a_settle_that_wakes_lost_tasks_again_records_that_the_change_stays_open(
    settings: Settings, clock: ManualClock
) -> None:
    # GIVEN an open Change whose ready Task's wake was lost (nobody was ever admitted)
    clock.set(NOW)
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    try:
        await app.ensure_streams()
        shard = create(app, [TaskPlan("t1", "schema", AGENT)])
        command = settle_command()
        # WHEN the settle is handled, and redelivered
        for n in (1, 2):
            await app.lifecycle().integration(command, delivery("integration", delivered=n))
        # THEN the lost wake went out again, and change.settled says the Change stays open
        (settled,) = outbox(shard, "change.settled")
        assert payload(settled) == {
            "fromStatus": "open",
            "toStatus": "open",
            "reason": "no agent at work; woke 1 ready task(s) again",
        }
        state = shard.change_state(CHANGE)
        assert state is not None and state.status == "open"
        assert outbox(shard, "change.status_changed") == []
        queued: list[str] = []

        async def note(command: Command, delivery: Delivery) -> None:
            queued.append(command.command_id)

        await (await app.queue_runtime()).poll("agent-wakeups", note)
        assert queued == ["cmd_t1_ready"]
    finally:
        await app.close()


@pytest.mark.integration
async def test_a_settle_that_composes_a_verifying_change_records_that_it_stays_verifying(
    settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a verifying Change with no Candidate (its candidate.create was lost)
    clock.set(NOW)
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    try:
        await app.ensure_streams()
        shard = create(app, [TaskPlan("t1", "schema", AGENT)])
        shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id=AGENT))
        shard.apply(
            CALLER, CompleteTask(change_id=CHANGE, task_id="t1", agent_id=AGENT, changeset_id=None)
        )
        # WHEN a settle is handled, and redelivered
        command = settle_command()
        for n in (1, 2):
            await app.lifecycle().integration(command, delivery("integration", delivered=n))
        # THEN change.settled says the Change stays verifying, once, naming the send
        (settled,) = outbox(shard, "change.settled")
        assert payload(settled) == {
            "fromStatus": "verifying",
            "toStatus": "verifying",
            "reason": "no open candidate; candidate.create to compose one: sent",
        }
    finally:
        await app.close()


# ============================================================================ promotion.requested


def awaiting_approval(app: Rhumbatron) -> str:
    """A Change awaiting approval with its verified Candidate on generation 0; its ID."""
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id=AGENT))
    shard.apply(CALLER, StartTask(task_id="t1", agent_id=AGENT))
    shard.apply(
        CALLER,
        ProposeChangeset(
            changeset_id="cs-1",
            task_id="t1",
            agent_id=AGENT,
            files={"src/app.py": "print('gift cards')"},
            base_generation=0,
        ),
    )
    shard.apply(
        CALLER, CompleteTask(change_id=CHANGE, task_id="t1", agent_id=AGENT, changeset_id="cs-1")
    )
    candidate = shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=0))
    shard.apply(
        CALLER,
        DecideCandidate(
            candidate_id=candidate.candidate_id,
            to=CandidateStatus.VERIFIED,
            change_to=ChangeStatus.AWAITING_APPROVAL,
        ),
    )
    return candidate.candidate_id


def test_an_approval_records_promotion_requested_with_its_decision_once(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change awaiting approval
    candidate_id = awaiting_approval(app)
    shard = change_shard(app)
    requests = app.lifecycle().requests
    # WHEN it is approved twice (a double click)
    requests.approve(CALLER, project_id=PROJECT, change_id=CHANGE)
    requests.approve(CALLER, project_id=PROJECT, change_id=CHANGE)
    # THEN promotion.requested was recorded once, just before the move and the decision
    (requested,) = outbox(shard, "promotion.requested")
    assert payload(requested) == {"candidateId": candidate_id, "expectedGeneration": 0}
    assert requested.event_id == stable_event_id(
        CHANGE, "promotion.requested", None, f"{candidate_id}:0"
    )
    types = [e.event_type for e in outbox(shard)]
    start = types.index("promotion.requested")
    assert types[start : start + 3] == [
        "promotion.requested",
        "change.status_changed",
        "promotion.completed",
    ]
    state = shard.change_state(CHANGE)
    assert state is not None and state.status == "releasing"


def test_the_promotion_transaction_carries_the_request_and_the_decision(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change awaiting approval
    candidate_id = awaiting_approval(app)
    shard = change_shard(app)
    # WHEN its promotion is recorded, then refused for another expected generation, twice
    promoted = shard.apply(
        CALLER, RecordPromotion(change_id=CHANGE, candidate_id=candidate_id, expected_generation=0)
    )
    refused = [
        shard.apply(
            CALLER,
            RecordPromotionRefused(
                change_id=CHANGE,
                candidate_id=candidate_id,
                expected_generation=3,
                reason="canonical is at 4",
            ),
        )
        for _ in range(2)
    ]
    # THEN each decision's one transaction holds its request
    assert kinds(promoted) == [
        "promotion.requested",
        "change.status_changed",
        "promotion.completed",
    ]
    assert tables(promoted) == ["changes"]
    assert kinds(refused[0]) == ["promotion.requested", "promotion.rejected"]
    assert (refused[0].events_added, refused[1].events_added) == (2, 0)
    # AND one request per (Candidate, expected generation)
    requested = outbox(shard, "promotion.requested")
    assert sorted(payload(e)["expectedGeneration"] for e in requested) == [0, 3]


def test_a_refused_approval_records_promotion_requested_with_the_rejection(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change awaiting approval on generation 0, and canonical moved to 1 meanwhile
    candidate_id = awaiting_approval(app)
    app.project_root(PROJECT).promote(
        CALLER, candidate_id="cand_other", artifact_id="art_other", expected_generation=0
    )
    # WHEN it is approved
    with pytest.raises(PromotionConflictError):
        app.lifecycle().requests.approve(CALLER, project_id=PROJECT, change_id=CHANGE)
    # THEN the request and its rejection are recorded, and the Change waits
    shard = change_shard(app)
    (requested,) = outbox(shard, "promotion.requested")
    (rejected,) = outbox(shard, "promotion.rejected")
    assert payload(requested) == {"candidateId": candidate_id, "expectedGeneration": 0}
    assert payload(rejected)["candidateId"] == candidate_id
    state = shard.change_state(CHANGE)
    assert state is not None and state.status == "awaiting_approval"


# ============================================================================ agent.woke


@dataclass
class RecordingAgents:
    """The agents' runtime: remembers each wake and the facts of its Change at that time."""

    app: Rhumbatron
    woken: list[tuple[str, str | None, list[str]]] = field(default_factory=list)
    #: How many wakes fail (the runtime raises) before one goes through.
    failures: int = 0

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("runtime down")
        seen = [e.event_type for e in outbox(change_shard(self.app, command.change_id or ""))]
        self.woken.append((agent_id, task.task_id if task else None, seen))


def wake(command_id: str, agent: str, *, task_id: str = "t1", **payload: Any) -> Command:
    return lifecycle_command(
        "agent.wake",
        command_id,
        project_id=PROJECT,
        change_id=CHANGE,
        task_id=task_id,
        now=NOW,
        payload={"agentId": agent, "reason": "test", **payload},
    )


async def test_a_delivered_wake_records_agent_woke_before_the_agent_runs_once(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change with a ready Task and its dispatcher's wake
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    agents = RecordingAgents(app, failures=1)
    consumer = WakeConsumer(app, agents)
    command = wake("cmd_t1_ready", AGENT)
    # WHEN the wake is handled but the agents' runtime fails, and the message is redelivered
    with pytest.raises(RuntimeError, match="runtime down"):
        await consumer(command, delivery("agent-wakeups"))
    await consumer(command, delivery("agent-wakeups", delivered=2))
    # THEN the Agent was admitted, and the redelivery gave it the wake it missed
    assert [o for _, o in consumer.outcomes] == [WakeOutcome.DELIVERED] * 2
    assert len(agents.woken) == 1
    # AND agent.woke was recorded once, for the Agent and its Task, under the wake's key
    (woke,) = outbox(shard, "agent.woke")
    assert payload(woke) == {"agentId": AGENT, "falseWakeup": False}
    assert (woke.task_id, woke.actor) == ("t1", f"agent:{AGENT}")
    assert woke.event_id == stable_event_id(
        CHANGE, "agent.woke", "t1", woke_fact_key(command, AGENT)
    )
    # AND it was in the Change's outbox, after the admission, before the Agent ran
    _, task_id, seen = agents.woken[0]
    assert task_id == "t1"
    assert seen[-2:] == ["task.assigned", "agent.woke"]


async def test_a_router_wake_names_the_event_that_caused_it(app: Rhumbatron) -> None:
    # GIVEN an Agent holding t1, and a router wake about an Event
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id=AGENT))
    consumer = WakeConsumer(app, RecordingAgents(app))
    event_id = "evt_" + "a" * 32
    # WHEN it is delivered
    await consumer(wake(f"cmd_{event_id}_t1", AGENT, eventId=event_id), delivery("agent-wakeups"))
    # THEN agent.woke is caused by that Event
    (woke,) = outbox(shard, "agent.woke")
    assert woke.caused_by == event_id


async def test_a_stale_wake_records_a_false_wakeup_once(app: Rhumbatron) -> None:
    # GIVEN t1 held by another Agent, and a router wake for an Agent that does not hold it
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id="someone-else"))
    agents = RecordingAgents(app)
    consumer = WakeConsumer(app, agents)
    command = wake("cmd_evt_x_t1", AGENT)
    # WHEN it is handled twice
    for n in (1, 2):
        await consumer(command, delivery("agent-wakeups", delivered=n))
    # THEN nobody ran, and one agent.woke says it was a false wakeup
    assert agents.woken == []
    assert [o for _, o in consumer.outcomes] == [WakeOutcome.STALE] * 2
    (woke,) = outbox(shard, "agent.woke")
    assert payload(woke) == {"agentId": AGENT, "falseWakeup": True}


async def test_a_wake_about_a_change_the_shard_does_not_know_records_nothing(
    app: Rhumbatron,
) -> None:
    # GIVEN a ready Task recorded without its Change (no changes row)
    shard = change_shard(app)
    shard.apply(CALLER, RecordTaskStatus(change_id=CHANGE, task_id="t1", status="ready"))
    agents = RecordingAgents(app)
    # WHEN its wake is delivered
    await WakeConsumer(app, agents)(wake("cmd_t1_ready", AGENT), delivery("agent-wakeups"))
    # THEN the Agent runs, but there is no Change to narrate it in
    assert len(agents.woken) == 1
    assert outbox(shard, "agent.woke") == []


# ============================================================================ model.routed


def test_model_routed_is_recorded_once_per_key_for_a_known_change(app: Rhumbatron) -> None:
    # GIVEN a Change, and a Change the shard does not know
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])

    def routed(change_id: str) -> TransactResult:
        return shard.apply(
            CALLER,
            RecordModelRouted(
                change_id=change_id,
                task_id="t1",
                model="claude-haiku",
                purpose=CLEF_FLASH_PURPOSE,
                key="evt_1",
            ),
        )

    # WHEN model.routed is recorded twice, and once for the unknown Change
    first, again, unknown = routed(CHANGE), routed(CHANGE), routed("chg-unknown")
    # THEN it is written once, with the model and the purpose
    assert (first.events_added, again.events_added, unknown.events_added) == (1, 0, 0)
    (fact,) = outbox(shard, "model.routed")
    assert payload(fact) == {"model": "claude-haiku", "purpose": "clef_flash"}
    assert fact.event_id == stable_event_id(CHANGE, "model.routed", "t1", "evt_1")


@dataclass
class MessagesApi:
    """An httpx2 handler answering POST /v1/messages like the Messages API."""

    status: int = 200
    requests: int = 0

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests += 1
        if self.status != 200:
            error = {"type": "error", "error": {"type": "api_error", "message": "Overloaded"}}
            return httpx2.Response(self.status, json=error)
        body = {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": json.loads(request.content)["model"],
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "decide_wake",
                    "input": {"decision": "skip", "probability": 0.95, "reason": "unrelated"},
                }
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
        return httpx2.Response(200, json=body)


class NoEffects:
    async def apply(self, event: Event, effect: StateEffect) -> None:
        raise AssertionError(f"no state effect expected, got {effect}")


@dataclass
class Router:
    app: Rhumbatron
    routing: RuleBasedRouting
    api: MessagesApi
    store: CausalStore


@pytest_asyncio.fixture
async def make_router(tmp_path: Path, settings: Settings, clock: ManualClock) -> AsyncIterator[Any]:
    """Builds the router (rules, Clef-flash on the real SDK, the cap) over a runtime on a
    real nats-server; ``api_key=None`` builds one without an Anthropic key."""
    built: list[tuple[Router, httpx2.AsyncClient, ClefFlash]] = []
    clock.set(NOW)

    async def build(*, api_key: str | None = "sk-ant-test", status: int = 200) -> Router:
        values = settings.model_dump() | {
            "clef_flash_api_key": api_key,
            "anthropic_base_url": "https://anthropic.test",
        }
        configured = load_settings(**values)
        app = bootstrap(configured, clock=clock, alarms=RecordingAlarmSink())
        await app.ensure_streams()
        api = MessagesApi(status)
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(api))
        store = CausalStore(configured)
        clef = ClefFlash(configured, store, clock, http_client=http)
        routing = RuleBasedRouting(
            world=ShardWorld(app.actors),
            bus=app.command_bus,
            clock=clock,
            clef_flash=clef,
            cap=CommandCap(configured, store),
            effects=NoEffects(),
        )
        router = Router(app, routing, api, store)
        built.append((router, http, clef))
        return router

    yield build
    for router, _, clef in built:
        await clef.close()
        router.store.close()
        await router.app.close()


def given_an_agent_on_src_auth(app: Rhumbatron) -> None:
    """builder-1 holds t1 of the Change and means to change src/auth/."""
    shard = create(app, [TaskPlan("t1", "schema", AGENT)])
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id=AGENT))
    app.resource_shard(PROJECT, "src/auth/").apply(
        CALLER,
        DeclareIntent(intent_id="i1", agent_id=AGENT, paths=("src/auth/",), change_id=CHANGE),
    )


def login_intent() -> Event:
    """Another agent's intent on src/auth/login.py: a prefix-only overlap with src/auth/."""
    writer = Caller(TENANT, "agent:writer", correlation_id="corr-writer")
    return FactContext(writer, PROJECT, NOW).fact(
        "intent.declared",
        {"intentId": "i9", "agentId": "writer", "paths": ["src/auth/login.py"]},
        resource="src/auth/login.py",
    )


@pytest.mark.integration
@pytest.mark.parametrize("status", [200, 500], ids=["answered", "api-error"])
async def test_a_clef_flash_question_asked_of_the_model_records_model_routed_once(
    make_router: Any, status: int
) -> None:
    # GIVEN an Agent on src/auth/ and a router whose Clef-flash has a key
    router: Router = await make_router(status=status)
    given_an_agent_on_src_auth(router.app)
    event = login_intent()
    # WHEN another agent's intent on src/auth/login.py is routed, and redelivered
    first = await router.routing.route([event])
    again = await router.routing.route([event])
    # THEN the model was asked once (the redelivery reuses the decision)
    assert first[event.event_id] == again[event.event_id] == APPLIED
    assert router.api.requests == 1
    # AND model.routed is in the Agent's Change once, for its Task, keyed by the Event
    (routed,) = outbox(change_shard(router.app), "model.routed")
    assert payload(routed) == {
        "model": router.app.settings.clef_flash_model,
        "purpose": "clef_flash",
    }
    assert routed.event_id == stable_event_id(CHANGE, "model.routed", "t1", event.event_id)
    assert (routed.caused_by, routed.actor) == (event.event_id, "system:causal-router")


@pytest.mark.integration
async def test_a_clef_flash_question_without_a_key_records_no_model_routed(
    make_router: Any,
) -> None:
    # GIVEN a router whose Clef-flash has no key (it abstains, which wakes)
    router: Router = await make_router(api_key=None)
    given_an_agent_on_src_auth(router.app)
    # WHEN a prefix-overlap Event is routed
    await router.routing.route([login_intent()])
    # THEN no model was asked, and nothing says one was
    assert router.api.requests == 0
    assert outbox(change_shard(router.app), "model.routed") == []


# ============================================================================ challenge.created


def challenge(app: Rhumbatron, challenge_id: str = "chl-1", **changes: Any) -> TransactResult:
    values: dict[str, Any] = {
        "agent_id": "critic",
        "resource": "src/app.py",
        "target_agent_id": AGENT,
        "reason": "it breaks the checkout",
        "challenge_id": challenge_id,
        "change_id": CHANGE,
    }
    values.update(changes)
    caller = Caller(TENANT, f"agent:{values['agent_id']}", correlation_id=challenge_id)
    return app.resource_shard(PROJECT, values["resource"]).apply(caller, CreateChallenge(**values))


def test_a_challenge_is_created_once_per_challenge_id(app: Rhumbatron) -> None:
    # WHEN an agent challenges another's claim on src/app.py, twice with the same ID
    first, again = challenge(app), challenge(app)
    # THEN one transaction kept the challenge and recorded challenge.created, once
    assert (tables(first), kinds(first)) == (["challenges"], ["challenge.created"])
    assert again.events_added == 0
    shard = app.resource_shard(PROJECT, "src/app.py")
    (fact,) = outbox(shard, "challenge.created")
    assert payload(fact) == {
        "challengeId": "chl-1",
        "agentId": "critic",
        "targetAgentId": AGENT,
        "reason": "it breaks the checkout",
    }
    assert (fact.resource, fact.actor, fact.change_id) == ("src/app.py", "agent:critic", CHANGE)
    stored = shard.challenge("chl-1")
    assert stored is not None and stored.target_agent_id == AGENT


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"reason": "another reason"}, "already exists"),
        ({"target_agent_id": "critic", "challenge_id": "chl-2"}, "cannot challenge itself"),
        ({"reason": "  ", "challenge_id": "chl-3"}, "needs a reason"),
    ],
    ids=["id-reused", "itself", "no-reason"],
)
def test_a_challenge_the_state_or_its_values_refuse_writes_nothing(
    app: Rhumbatron, changes: dict[str, Any], message: str
) -> None:
    challenge(app)
    with pytest.raises(DomainError, match=message):
        challenge(app, **changes)
    assert len(outbox(app.resource_shard(PROJECT, "src/app.py"), "challenge.created")) == 1


def test_the_causal_router_wakes_the_challenged_agent_but_not_the_challenger(
    app: Rhumbatron,
) -> None:
    # GIVEN builder-1 holding t1 with a claim on src/app.py, and the critic holding t2 with
    # an intent on src/
    shard = create(app, [TaskPlan("t1", "schema", AGENT), TaskPlan("t2", "review", "critic")])
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t1", agent_id=AGENT))
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="t2", agent_id="critic"))
    app.resource_shard(PROJECT, "src/app.py").apply(
        CALLER, AcquireClaim(resource="src/app.py", agent_id=AGENT, ttl=timedelta(minutes=15))
    )
    app.resource_shard(PROJECT, "src/").apply(
        CALLER, DeclareIntent(intent_id="i-critic", agent_id="critic", paths=("src/",))
    )
    # WHEN the critic challenges builder-1's claim, and the rules plan the fact
    (fact,) = challenge(app).transition.facts
    plan = plan_for(fact, ShardWorld(app.actors), now=NOW)
    # THEN builder-1 is woken for its exact overlap; the critic, its author, is not asked
    assert [(p.command.command_type, p.command.task_id) for p in plan.commands] == [
        ("agent.wake", "t1")
    ]
    assert plan.questions == []
