"""The wake consumer on the real agent-wakeups queue: relevance checked again, admitAgent
assigns once, a duplicate ready wake does nothing, a stale wake counts as a false wakeup."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.tasks import TaskState
from rhumbatron.metrics import MetricBinding, metric_counts
from rhumbatron.protocol.envelopes import Command
from rhumbatron.queues.wake_consumer import FALSE_WAKEUP_METRIC, WakeConsumer, WakeOutcome
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron.runtime.clock import ManualClock
from rhumbatron.runtime.settings import Settings, load_settings

pytestmark = pytest.mark.integration

PROJECT = "acme-web"
SYSTEM = Caller("acme", "system:test", correlation_id="corr-wake")
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


@dataclass
class RecordingAgents:
    woken: list[tuple[str, str]] = field(default_factory=list)

    async def wake(self, agent_id: str, task: TaskState, command: Command) -> None:
        self.woken.append((agent_id, task.task_id))


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
    shard(app, change).record_task_status(SYSTEM, change_id=change, task_id=task_id, status="ready")


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


async def run(app: Rhumbatron, agents: RecordingAgents, *commands: Command) -> WakeConsumer:
    bus = await app.command_bus()
    for command in commands:
        await bus.send("agent-wakeups", command)
    consumer = WakeConsumer(app, agents)
    await (await app.queue_runtime()).poll("agent-wakeups", consumer)
    return consumer


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


async def test_a_router_wake_reaches_the_agent_that_holds_the_task(app: Rhumbatron) -> None:
    ready_task(app, "c1", "t1")
    agents = RecordingAgents()
    await run(app, agents, wake("cmd_t1_ready", "c1", "t1", "a1"))
    consumer = await run(app, agents, wake("cmd_evt_y_t1", "c1", "t1", "a1"))
    assert consumer.outcomes == [("cmd_evt_y_t1", WakeOutcome.DELIVERED)]
    assert agents.woken == [("a1", "t1"), ("a1", "t1")]


async def test_a_wake_of_an_ended_change_or_a_finished_task_is_stale(app: Rhumbatron) -> None:
    ready_task(app, "c1", "t1")
    shard(app, "c1").record_task_status(
        SYSTEM, change_id="c1", task_id="t1", status="assigned", agent_id="a1"
    )
    shard(app, "c1").record_task_status(SYSTEM, change_id="c1", task_id="t1", status="completed")
    shard(app, "c2").append_change_events(SYSTEM, change_id="c2", status="cancelled", facts=())
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
        shard(app, "c1").record_task_status(
            SYSTEM, change_id="c1", task_id=f"busy-{n}", status="running", agent_id=f"a{n}"
        )
    ready_task(app, "c1", "t9")
    agents = RecordingAgents()
    consumer = await run(app, agents, wake("cmd_t9_ready", "c1", "t9", "a9"))
    assert consumer.outcomes == [("cmd_t9_ready", WakeOutcome.AT_LIMIT)]
    task = shard(app, "c1").task_state("t9")
    assert task is not None and task.status == "ready"
    assert agents.woken == []
