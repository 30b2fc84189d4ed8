"""The wake consumer on the real agent-wakeups queue: relevance checked again, admitAgent
assigns once, a duplicate ready wake does nothing, a stale wake counts as a false wakeup."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents, RecordTaskStatus
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.tasks import TaskState
from rhumbatron.messaging.queue_consumer import Delivery
from rhumbatron.metrics import MetricBinding, metric_counts
from rhumbatron.metrics.platform_metrics import recent_points
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.queues.wake_consumer import FALSE_WAKEUP_METRIC, WakeConsumer, WakeOutcome
from rhumbatron.reactions.deliveries import REACTION_REASON_PREFIX
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

pytestmark = pytest.mark.integration

PROJECT = "acme-web"
SYSTEM = Caller("acme", "system:test", correlation_id="corr-wake")
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


@dataclass
class RecordingAgents:
    woken: list[tuple[str, str | None]] = field(default_factory=list)
    tasks: list[TaskState | None] = field(default_factory=list)

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None:
        self.woken.append((agent_id, task.task_id if task is not None else None))
        self.tasks.append(task)


class UnreachableAgents:
    """An agents' runtime that cannot be reached."""

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None:
        raise ConnectionError(f"agent {agent_id} unreachable")


@pytest_asyncio.fixture
async def app(settings: Settings, clock: ManualClock) -> AsyncIterator[Rhumbatron]:
    clock.set(NOW)
    values = settings.model_dump() | {"queue_retry_delay_s": {"agent-wakeups": 0.0}}
    runtime = bootstrap(load_settings(**values), clock=clock, alarms=RecordingAlarmSink())
    await runtime.ensure_streams()
    runtime.project_root(PROJECT).create_project(SYSTEM, name="Storefront")
    yield runtime
    await runtime.close()


def shard(app: Rhumbatron, change: str) -> ResourceShard:
    return app.resource_shard(PROJECT, change_resource_key(change))


def ready_task(app: Rhumbatron, change: str, task_id: str) -> None:
    shard(app, change).apply(
        SYSTEM, RecordTaskStatus(change_id=change, task_id=task_id, status="ready")
    )


def wake(command_id: str, change: str, task_id: str, agent: str) -> Command:
    return Command.create(
        command_id=command_id,
        command_type="agent.wake",
        project_id=PROJECT,
        change_id=change,
        task_id=task_id,
        created_at=NOW,
        payload={"agentId": agent, "reason": "test"},
    )


def first_delivery() -> Delivery:
    """A first delivery on agent-wakeups, for calling the consumer directly."""
    return Delivery("agent-wakeups", stream_seq=1, delivered=1, max_deliveries=4, headers={})


def outbox(app: Rhumbatron, change: str) -> list[Event]:
    rows = shard(app, change).connection.execute("SELECT envelope FROM outbox ORDER BY seq")
    return [Event.parse(bytes(row[0])) for row in rows]


async def run(app: Rhumbatron, agents: RecordingAgents, *commands: Command) -> WakeConsumer:
    """Send ``commands`` and poll the queue until the consumer has handled each one stored.

    A no-wait pull right after the PubAck can find the consumer not yet told of the message
    (seen under load), so an empty poll is repeated, for a bounded time."""
    bus = await app.command_bus()
    stored = 0
    for command in commands:
        stored += not (await bus.send("agent-wakeups", command)).duplicate
    consumer = WakeConsumer(app, agents)
    runtime = await app.queue_runtime()
    deadline = time.monotonic() + 10.0
    while True:
        report = await runtime.poll("agent-wakeups", consumer)
        if len(consumer.outcomes) >= stored:
            return consumer
        assert time.monotonic() < deadline, f"{len(consumer.outcomes)} of {stored} handled"
        if not report.fetched:
            await asyncio.sleep(0.01)  # a bounded poll of the server's delivery, not a wait


async def test_a_ready_wake_admits_the_agent_once_and_a_repeat_is_a_duplicate(
    app: Rhumbatron,
) -> None:
    # GIVEN a ready Task and its dispatcher wake
    ready_task(app, "c1", "t1")
    agents = RecordingAgents()
    first = wake("cmd_t1_ready", "c1", "t1", "a1")

    # WHEN the wake arrives, and the same wake again after the duplicate window
    consumer = await run(app, agents, first)
    again = await run(app, agents, first.model_copy(update={"attempt": 2}))

    # THEN the Task was assigned to a1 once (one task.assigned) and the agent woke once
    task = shard(app, "c1").task_state("t1")
    assert task is not None and (task.status, task.agent_id) == ("assigned", "a1")
    assert agents.woken == [("a1", "t1")]
    assert consumer.outcomes == [("cmd_t1_ready", WakeOutcome.DELIVERED)]
    assert again.outcomes == [("cmd_t1_ready", WakeOutcome.DUPLICATE)]
    assigned = (
        shard(app, "c1")
        .connection.execute("SELECT COUNT(*) FROM outbox WHERE event_type = 'task.assigned'")
        .fetchone()[0]
    )
    assert assigned == 1


async def test_a_ready_wake_redelivered_after_its_ack_was_lost_wakes_nobody_again(
    app: Rhumbatron,
) -> None:
    # GIVEN a ready wake the agent got, whose ack was then lost
    ready_task(app, "c1", "t1")
    agents = RecordingAgents()
    consumer = WakeConsumer(app, agents)
    command = wake("cmd_t1_ready", "c1", "t1", "a1")
    await consumer(command, first_delivery())
    # WHEN JetStream delivers it again
    again = Delivery("agent-wakeups", stream_seq=1, delivered=2, max_deliveries=4, headers={})
    await consumer(command, again)
    # THEN it is a duplicate: the agent was woken once (S0-220)
    assert [o for _, o in consumer.outcomes] == [WakeOutcome.DELIVERED, WakeOutcome.DUPLICATE]
    assert agents.woken == [("a1", "t1")]


async def test_an_operator_retry_of_a_ready_wake_the_agent_never_got_wakes_it(
    app: Rhumbatron,
) -> None:
    # GIVEN a ready wake that admitted its agent, but whose runtime failed on every delivery
    ready_task(app, "c1", "t1")
    command = wake("cmd_t1_ready", "c1", "t1", "a1")
    down = WakeConsumer(app, UnreachableAgents())
    for delivered in range(1, 5):
        with pytest.raises(ConnectionError):
            await down(
                command,
                Delivery("agent-wakeups", 1, delivered=delivered, max_deliveries=4, headers={}),
            )
    task = shard(app, "c1").task_state("t1")
    assert task is not None and (task.status, task.agent_id) == ("assigned", "a1")
    # WHEN an operator retries its dead letter (attempt 2, a first delivery)
    agents = RecordingAgents()
    consumer = WakeConsumer(app, agents)
    await consumer(command.model_copy(update={"attempt": 2}), first_delivery())
    # THEN the agent gets the wake it never had, once
    assert consumer.outcomes == [("cmd_t1_ready", WakeOutcome.DELIVERED)]
    assert agents.woken == [("a1", "t1")]


async def test_a_wake_for_a_task_another_agent_holds_is_stale_and_counted(
    app: Rhumbatron,
) -> None:
    ready_task(app, "c1", "t1")
    agents = RecordingAgents()
    await run(app, agents, wake("cmd_t1_ready", "c1", "t1", "a1"))
    # a second agent's ready wake for the same Task, and a router wake for an agent that
    # does not hold it
    consumer = await run(
        app,
        agents,
        wake("cmd_t1_ready", "c1", "t1", "a2").model_copy(update={"attempt": 3}),
        wake("cmd_evt_x_t1", "c1", "t1", "a3"),
    )
    assert [o for _, o in consumer.outcomes] == [WakeOutcome.STALE, WakeOutcome.STALE]
    assert agents.woken == [("a1", "t1")]
    counts = metric_counts(app.product().connection, MetricBinding.METRICS)
    assert counts[FALSE_WAKEUP_METRIC] == 2
    # … each a count of one
    points = recent_points(app.product().connection, FALSE_WAKEUP_METRIC)
    assert [point.value for point in points] == [1.0, 1.0]


async def test_a_router_wake_reaches_the_agent_that_holds_the_task(app: Rhumbatron) -> None:
    ready_task(app, "c1", "t1")
    agents = RecordingAgents()
    await run(app, agents, wake("cmd_t1_ready", "c1", "t1", "a1"))
    consumer = await run(app, agents, wake("cmd_evt_y_t1", "c1", "t1", "a1"))
    assert consumer.outcomes == [("cmd_evt_y_t1", WakeOutcome.DELIVERED)]
    assert agents.woken == [("a1", "t1"), ("a1", "t1")]


async def test_a_wake_of_an_ended_change_or_a_finished_task_is_stale(app: Rhumbatron) -> None:
    ready_task(app, "c1", "t1")
    shard(app, "c1").apply(
        SYSTEM, RecordTaskStatus(change_id="c1", task_id="t1", status="assigned", agent_id="a1")
    )
    shard(app, "c1").apply(
        SYSTEM, RecordTaskStatus(change_id="c1", task_id="t1", status="completed")
    )
    shard(app, "c2").apply(SYSTEM, AppendChangeEvents(change_id="c2", status="cancelled", facts=()))
    ready_task(app, "c2", "t5")
    agents = RecordingAgents()
    consumer = await run(
        app, agents, wake("cmd_evt_z_t1", "c1", "t1", "a1"), wake("cmd_t5_ready", "c2", "t5", "a2")
    )
    assert [o for _, o in consumer.outcomes] == [WakeOutcome.STALE, WakeOutcome.STALE]
    assert agents.woken == []


async def test_at_the_8_agent_limit_a_ready_task_stays_ready(app: Rhumbatron) -> None:
    for n in range(8):
        ready_task(app, "c1", f"busy-{n}")
        shard(app, "c1").apply(
            SYSTEM,
            RecordTaskStatus(
                change_id="c1", task_id=f"busy-{n}", status="running", agent_id=f"a{n}"
            ),
        )
    ready_task(app, "c1", "t9")
    agents = RecordingAgents()
    consumer = await run(app, agents, wake("cmd_t9_ready", "c1", "t9", "a9"))
    assert consumer.outcomes == [("cmd_t9_ready", WakeOutcome.AT_LIMIT)]
    task = shard(app, "c1").task_state("t9")
    assert task is not None and task.status == "ready"
    assert agents.woken == []


async def test_the_limit_of_active_agents_per_change_is_the_consumers_setting(
    app: Rhumbatron,
) -> None:
    # GIVEN a consumer that admits one agent per Change, and one agent running on c1
    ready_task(app, "c1", "busy")
    shard(app, "c1").apply(
        SYSTEM, RecordTaskStatus(change_id="c1", task_id="busy", status="running", agent_id="a0")
    )
    ready_task(app, "c1", "t2")
    agents = RecordingAgents()
    consumer = WakeConsumer(app, agents, max_active_agents_per_change=1)
    # WHEN another Task's ready wake arrives
    await consumer(wake("cmd_t2_ready", "c1", "t2", "a2"), first_delivery())
    # THEN it waits at the limit, its Task still ready
    assert consumer.outcomes == [("cmd_t2_ready", WakeOutcome.AT_LIMIT)]
    task = shard(app, "c1").task_state("t2")
    assert task is not None and task.status == "ready"


@pytest.mark.parametrize("ended", ["completed", "failed"])
async def test_a_task_that_completes_or_fails_frees_its_agents_slot(
    app: Rhumbatron, ended: str
) -> None:
    # GIVEN a consumer that admits one agent per Change, and c1's one agent whose Task then
    #   completed (task.completed) or failed (task.failed)
    ready_task(app, "c1", "busy")
    shard(app, "c1").apply(
        SYSTEM, RecordTaskStatus(change_id="c1", task_id="busy", status="running", agent_id="a0")
    )
    shard(app, "c1").apply(SYSTEM, RecordTaskStatus(change_id="c1", task_id="busy", status=ended))
    ready_task(app, "c1", "t2")
    agents = RecordingAgents()
    consumer = WakeConsumer(app, agents, max_active_agents_per_change=1)
    # WHEN another Task's ready wake arrives
    await consumer(wake("cmd_t2_ready", "c1", "t2", "a2"), first_delivery())
    # THEN the ended Task's slot is free: the agent is admitted and woken
    assert consumer.outcomes == [("cmd_t2_ready", WakeOutcome.DELIVERED)]
    task = shard(app, "c1").task_state("t2")
    assert task is not None and (task.status, task.agent_id) == ("assigned", "a2")
    assert agents.woken == [("a2", "t2")]


async def test_an_admission_is_recorded_under_the_projects_tenant(app: Rhumbatron) -> None:
    shard(app, "c1").apply(SYSTEM, AppendChangeEvents(change_id="c1", status="running", facts=()))
    ready_task(app, "c1", "t1")
    await WakeConsumer(app, RecordingAgents())(
        wake("cmd_t1_ready", "c1", "t1", "a1"), first_delivery()
    )
    facts = outbox(app, "c1")
    assert {(e.event_type, e.tenant_id) for e in facts if e.actor == "agent:a1"} == {
        ("task.assigned", "acme"),
        ("agent.woke", "acme"),
    }


async def test_a_wake_in_a_project_whose_root_is_gone_records_its_facts_as_tenant_unknown(
    app: Rhumbatron,
) -> None:
    # GIVEN a ready Task in a project that has shards but no root actor
    orphan = app.resource_shard("orphan-web", change_resource_key("c1"))
    orphan.apply(SYSTEM, RecordTaskStatus(change_id="c1", task_id="t1", status="ready"))
    orphan.apply(SYSTEM, AppendChangeEvents(change_id="c1", status="running", facts=()))
    command = wake("cmd_t1_ready", "c1", "t1", "a1").model_copy(update={"project_id": "orphan-web"})
    agents = RecordingAgents()
    # WHEN its wake arrives
    await WakeConsumer(app, agents)(command, first_delivery())
    # THEN the agent runs, and its facts say no tenant could be read (the router will refuse
    # them: a project without a root is refused on every subscription)
    assert agents.woken == [("a1", "t1")]
    rows = orphan.connection.execute("SELECT envelope FROM outbox ORDER BY seq").fetchall()
    facts = [Event.parse(bytes(row[0])) for row in rows]
    assert {(e.event_type, e.tenant_id) for e in facts if e.actor == "agent:a1"} == {
        ("task.assigned", "unknown"),
        ("agent.woke", "unknown"),
    }


@pytest.mark.parametrize(
    ("change_id", "task_id"), [("c1", None), (None, None)], ids=["no task", "nothing"]
)
async def test_a_router_wake_that_names_no_task_is_stale_and_logged(
    app: Rhumbatron,
    caplog: pytest.LogCaptureFixture,
    change_id: str | None,
    task_id: str | None,
) -> None:
    ready_task(app, "c1", "t1")
    command = Command.create(
        command_id="cmd_evt_q",
        command_type="agent.wake",
        project_id=PROJECT,
        change_id=change_id,
        task_id=task_id,
        created_at=NOW,
        payload={"agentId": "a1", "reason": "test"},
    )
    caplog.set_level(logging.INFO, logger="rhumbatron.queues.wake_consumer")
    agents = RecordingAgents()
    consumer = WakeConsumer(app, agents)
    await consumer(command, first_delivery())
    assert consumer.outcomes == [("cmd_evt_q", WakeOutcome.STALE)]
    assert agents.woken == []
    assert [r.getMessage() for r in caplog.records if r.name.endswith("wake_consumer")] == [
        "wake cmd_evt_q names no Task; nothing to wake for",
        "stale wake cmd_evt_q: counted as a false wakeup",
    ]


def reaction_wake(change_id: str | None, event_kind: str, task_id: str | None = None) -> Command:
    """A subscription's wake of agent a1 about an event of ``change_id``."""
    return Command.create(
        command_id=f"cmd_reaction_{event_kind.replace('.', '_')}",
        command_type="agent.wake",
        project_id=PROJECT,
        change_id=change_id,
        task_id=task_id,
        created_at=NOW,
        payload={
            "agentId": "a1",
            "reason": f"{REACTION_REASON_PREFIX}sub_{'a' * 32}",
            "eventId": "evt_" + "c" * 32,
            "eventKind": event_kind,
        },
    )


@pytest.mark.parametrize("task_id", [None, "t1"], ids=["no task", "a task but no change"])
async def test_a_reaction_wake_about_no_change_reaches_the_agent_without_a_task(
    app: Rhumbatron, task_id: str | None
) -> None:
    # A Task is found in its Change's shard: without a Change there is none to hand over
    agents = RecordingAgents()
    consumer = WakeConsumer(app, agents)
    await consumer(reaction_wake(None, "project.created", task_id), first_delivery())
    assert [o for _, o in consumer.outcomes] == [WakeOutcome.DELIVERED]
    assert agents.woken == [("a1", None)]
    assert agents.tasks == [None]


async def test_after_a_cancel_only_a_reaction_to_the_cancellation_itself_still_goes(
    app: Rhumbatron,
) -> None:
    # GIVEN a cancelled Change
    shard(app, "c1").apply(SYSTEM, AppendChangeEvents(change_id="c1", status="cancelled", facts=()))
    agents = RecordingAgents()
    consumer = WakeConsumer(app, agents)
    # WHEN a reaction's wake about change.cancelled, and one about an earlier fact, arrive
    await consumer(reaction_wake("c1", "change.cancelled"), first_delivery())
    await consumer(reaction_wake("c1", "task.completed"), first_delivery())
    # THEN the first goes; the second is dropped with the work the Change caused
    assert [o for _, o in consumer.outcomes] == [WakeOutcome.DELIVERED, WakeOutcome.STALE]
    assert agents.woken == [("a1", None)]


async def test_a_command_that_is_no_wake_fails_and_names_itself(app: Rhumbatron) -> None:
    # GIVEN a change.settle sent to agent-wakeups by mistake
    ready_task(app, "c1", "t1")
    command = Command.create(
        command_id="cmd_settle_c1",
        command_type="change.settle",
        project_id=PROJECT,
        change_id="c1",
        task_id="t1",
        created_at=NOW,
        payload={"reason": "quiet"},
    )
    # THEN handling it fails (a retry, then a dead letter) with a reason that names it
    message = "cmd_settle_c1 is a change.settle, not an agent.wake: only wakes belong on "
    with pytest.raises(TypeError, match=f"^{re.escape(message)}agent-wakeups$"):
        await WakeConsumer(app, RecordingAgents())(command, first_delivery())


async def test_only_the_dispatchers_ready_wake_admits_a_router_wake_for_a_ready_task_is_stale(
    app: Rhumbatron,
) -> None:
    # GIVEN a ready Task nobody holds
    ready_task(app, "c1", "t1")
    agents = RecordingAgents()
    consumer = WakeConsumer(app, agents)
    # WHEN a router wake (not cmd_<task>_ready) names it for a1
    await consumer(wake("cmd_evt_r_t1", "c1", "t1", "a1"), first_delivery())
    # THEN it is stale: a router wake wakes the holder, it never admits one
    assert consumer.outcomes == [("cmd_evt_r_t1", WakeOutcome.STALE)]
    task = shard(app, "c1").task_state("t1")
    assert task is not None and (task.status, task.agent_id) == ("ready", None)
    assert agents.woken == []
