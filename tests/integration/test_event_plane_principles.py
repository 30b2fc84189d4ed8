"""Principles of the event plane (seed 002) against a real nats-server, real SQLite files, a real
loopback webhook receiver and moto's server: a new reaction needs no new plumbing; every
consumer, the reactions included, has the same delivery semantics; a reaction's run keeps its
provenance after the log forgets the event; nothing reacts unadmitted; a cancelled Change
stops the wakes its events caused; an agent's own writes carry its name and never wake it;
and a workflow engine outage stops only the workflow reactions, which resume from their own
cursor once it is back.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from rhumbatron import operator
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents, RecordTaskStatus, StartTask
from rhumbatron.agents.registry import AgentRegistry
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.tasks import TaskState
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.queue_consumer import Delivery
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import event_stream_name
from rhumbatron.queues.dead_letter import DeadLetterConsumer
from rhumbatron.queues.wake_consumer import WakeConsumer, WakeOutcome
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.deliveries import agent_wake_command, workflow_instance_id
from rhumbatron.reactions.guards import SuppressionReason
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import AgentReaction, Governance, WorkflowReaction
from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
from rhumbatron.runtime.reactions_assembly import LazyHttpClient, reactions_for
from rhumbatron.workflows.in_process import InProcessEngine, WorkflowDefinition
from rhumbatron.workflows.step_functions import StepFunctionsEngine
from rhumbatron_dev.local.s3_server import S3ServerProcess

# The reactions tests' world (runtime, registry, receiver) and the router tests' app factory
# and project history, registered here under the same names.
from . import test_reactions as reactions_tests
from . import test_router as router_tests
from .test_reactions import (
    PROJECT,
    START,
    STREAM,
    TENANT,
    Receiver,
    World,
    make_world,
    task_completed,
    webhook,
)
from .test_router import AppFactory, projects_on_stream, publish, publish_raw, sweep_minute

pytestmark = pytest.mark.integration

world = reactions_tests.world
receiver = reactions_tests.receiver
make_app = router_tests.make_app

SYSTEM = Caller(TENANT, "system:test", "corr-principles")
CHANGE = f"{PROJECT}-chg-1"  # the Change of task_completed's facts
PASS_DEFINITION = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
ROLE_ARN = "arn:aws:iam::123456789012:role/rhumbatron-workflows"


@dataclass
class RecordingAgents:
    """The agents' runtime as the wake consumer calls it: records who was woken for what."""

    woken: list[tuple[str, str | None]] = field(default_factory=list)

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None:
        self.woken.append((agent_id, command.task_id if task is None else task.task_id))


def task_started(clock: ManualClock, task: str, agent: str, *, key: str = "") -> Event:
    """A ``task.started`` of ``task``; Change facts have stable IDs, so a second one of the
    same Task needs its own ``key``."""
    ctx = FactContext(SYSTEM, PROJECT, clock.now())
    return ctx.fact("task.started", {"agentId": agent}, change_id=CHANGE, task_id=task, key=key)


def held_task(world: World, task: str, agent: str) -> ResourceShard:
    """A project whose Change has ``task`` assigned to ``agent``; returns the Change's shard."""
    world.app.project_root(PROJECT).create_project(SYSTEM, name="Principles")
    shard = world.app.resource_shard(PROJECT, change_resource_key(CHANGE))
    shard.apply(SYSTEM, RecordTaskStatus(change_id=CHANGE, task_id=task, status="ready"))
    shard.apply(
        SYSTEM, RecordTaskStatus(change_id=CHANGE, task_id=task, status="assigned", agent_id=agent)
    )
    AgentRegistry(world.app.product(), world.app.settings, world.clock).register_scripted(
        TENANT, agent
    )
    return shard


def wake_on(world: World, kind: str, agent: str) -> str:
    created = world.registry.create(
        TENANT,
        f"wake-{agent}",
        Selector.create([kind]),
        AgentReaction(agent_id=agent),
        Governance(cooldown_s=0),
    )
    return created.record.subscription_id


async def wakes_waiting(world: World) -> int:
    js = (await world.app.nats()).jetstream()
    return int((await js.stream_info(COMMAND_STREAM)).state.messages)


# -- one log, N cursors --------------------------------------------------------------------------


async def test_a_new_subscription_reacts_to_an_unchanged_producer_with_no_new_consumer_or_stream(
    world: World, receiver: Receiver
) -> None:
    # GIVEN a fact no subscription wants, consumed, and the stream and consumers as they stand
    js = (await world.app.nats()).jetstream()
    stream = event_stream_name(STREAM)
    await world.publish(task_completed(world.clock, "t1"))
    before = await world.react()
    config_before = (await js.stream_info(stream)).config
    consumers_before = sorted(c.name for c in await js.consumers_info(stream))

    # WHEN a tenant registers a webhook subscription (data in the registry, nothing else) and
    # the same producer writes the same kind again
    world.subscribe("late", webhook(receiver.url))
    await world.publish(task_completed(world.clock, "t2"))
    after = await world.react()

    # THEN the first fact reacted with nothing, the second reaches the new subscription, and
    # neither the stream nor its set of consumers changed
    assert (before.applied, after.applied) == (1, 1)
    assert [body["subject"]["id"] for _, body in receiver.received] == ["t2"]
    assert (await js.stream_info(stream)).config == config_before
    assert sorted(c.name for c in await js.consumers_info(stream)) == consumers_before


async def test_every_subscription_takes_a_resent_event_as_a_duplicate_of_its_own_claim(
    make_app: AppFactory, clock: ManualClock, receiver: Receiver
) -> None:
    # GIVEN all five subscriptions on a stream, the reactions one with a webhook subscription
    app = await make_app(webhook_allowed_hosts=("127.0.0.1",))
    registry = SubscriptionRegistry(app.product(), app.settings, clock)
    app.bind_reactions(reactions_for(app, registry, http=LazyHttpClient()))
    registry.create(
        TENANT,
        "done",
        Selector.create(["task.completed"]),
        webhook(receiver.url),
        Governance(cooldown_s=0),
    )
    (project,) = projects_on_stream(0, 1)
    events = router_tests.lifecycle(project, clock.now())
    await publish(app, events)
    first = await app.router().sweep(now=sweep_minute(0))

    # WHEN every event is sent again under new message IDs (past the duplicate window) and the
    # stream's next ordinary sweep reads them
    for event in events:
        await publish_raw(app, 0, event.to_json(), msg_id=f"{event.event_id}-again")
    second = await app.router().sweep(now=sweep_minute(0, day_offset=1))

    # THEN each subscription applied each event once and took the copy as a duplicate of its
    # own (consumer, eventId) claim; the webhook went out once. The causal router claims only
    # the events a rule acts on (change.planned, task.completed): the other four it applies
    # again, with no claim and no effect
    names = sorted(s.value for s in Subscription)
    assert sorted(first.run.subscriptions) == sorted(second.run.subscriptions) == names
    routed = router_tests.ROUTED_IN_LIFECYCLE
    for name in names:
        assert first.run.subscriptions[name].applied == len(events), name
        again = second.run.subscriptions[name]
        expected = (
            (len(events) - routed, routed, 0)
            if name == Subscription.CAUSAL_ROUTER.value
            else (0, len(events), 0)
        )
        assert (again.applied, again.duplicates, again.failed) == expected, name
    assert len(receiver.received) == 1


# -- provenance ----------------------------------------------------------------------------------


async def test_a_workflow_reaction_keeps_its_events_kind_and_subject_after_the_log_lost_it(
    tmp_path: Path, settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a workflow reaction whose one step keeps what the run was started with
    clock.set(START)

    async def remember(input: Any, state: dict[str, Any]) -> dict[str, Any]:
        return {"origin": dict(input)}

    engine = InProcessEngine(
        tmp_path / "wf.sqlite",
        load_settings(state_dir=tmp_path / "wf", nats_url=settings.nats_url),
        clock,
        {"triage": WorkflowDefinition("triage", (("remember", remember),))},
    )
    world = make_world(tmp_path, settings, clock, engine=engine)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("triage", WorkflowReaction(workflow="triage"))
        event = task_completed(clock, "t1")
        await world.publish(event)
        await world.react()

        # WHEN the event leaves the log (its retention passed; here the stream is purged)
        js = (await world.app.nats()).jetstream()
        await js.purge_stream(event_stream_name(STREAM))
        assert (await js.stream_info(event_stream_name(STREAM))).state.messages == 0

        # THEN the run still names the event, its kind and what it was about
        instance = await engine.describe("triage", workflow_instance_id(event.event_id, sub))
        assert instance is not None and instance.output is not None
        origin = instance.output["origin"]
        assert (origin["eventId"], origin["kind"], origin["subscriptionId"]) == (
            event.event_id,
            "task.completed",
            sub,
        )
        assert (origin["projectId"], origin["changeId"], origin["taskId"]) == (
            PROJECT,
            CHANGE,
            "t1",
        )
    finally:
        engine.close()
        await world.app.close()


# -- the gate ------------------------------------------------------------------------------------


async def test_a_spent_budget_runs_no_reaction_of_any_kind(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: Receiver
) -> None:
    # GIVEN a tenant with no reactions left today, and a webhook, a workflow and an agent
    # subscription on the same kind
    clock.set(START)
    runs: list[str] = []

    async def step(input: Any, state: dict[str, Any]) -> None:
        runs.append(str(input["eventId"]))

    engine = InProcessEngine(
        tmp_path / "wf.sqlite",
        load_settings(state_dir=tmp_path / "wf", nats_url=settings.nats_url),
        clock,
        {"triage": WorkflowDefinition("triage", (("note", step),))},
    )
    limits = ReactionSettings(reaction_daily_budget=0)
    world = make_world(tmp_path, settings, clock, limits=limits, engine=engine)
    await world.app.ensure_streams()
    try:
        AgentRegistry(world.app.product(), world.app.settings, clock).register_scripted(
            TENANT, "agent-9"
        )
        subs = {
            world.subscribe("hook", webhook(receiver.url)),
            world.subscribe("flow", WorkflowReaction(workflow="triage")),
            world.subscribe("wake", AgentReaction(agent_id="agent-9")),
        }

        # WHEN a matching event is consumed
        await world.publish(task_completed(clock, "t1"))
        report = await world.react()

        # THEN it is applied, and no kind of reaction ran: no POST, no workflow, no wake —
        # each refusal is recorded
        assert report.applied == 1
        assert receiver.received == []
        assert runs == []
        assert await wakes_waiting(world) == 0
        refused = world.suppressed()
        assert {s.subscription_id for s in refused} == subs
        assert {s.reason for s in refused} == {SuppressionReason.BUDGET}
    finally:
        engine.close()
        await world.app.close()


# -- agents --------------------------------------------------------------------------------------


async def test_a_reaction_wake_for_a_change_cancelled_since_never_reaches_the_agent(
    world: World,
) -> None:
    # GIVEN agent-9 holding t1, and a subscription waking agent-9 on task.started
    shard = held_task(world, "t1", "agent-9")
    wake_on(world, "task.started", "agent-9")
    agents = RecordingAgents()
    queues = await world.app.queue_runtime()
    await world.publish(task_started(world.clock, "t1", "agent-9"))
    await world.react()
    live = WakeConsumer(world.app, agents)
    await queues.poll("agent-wakeups", live)

    # WHEN the Change is cancelled and another matching event of it is consumed
    shard.apply(SYSTEM, AppendChangeEvents(change_id=CHANGE, status="cancelled", facts=()))
    await world.publish(task_started(world.clock, "t1", "agent-9", key="again"))
    await world.react()
    cancelled = WakeConsumer(world.app, agents)
    await queues.poll("agent-wakeups", cancelled)

    # THEN the first wake reached the agent; the one caused after the cancel is stale
    assert [outcome for _, outcome in live.outcomes] == [WakeOutcome.DELIVERED]
    assert [outcome for _, outcome in cancelled.outcomes] == [WakeOutcome.STALE]
    assert agents.woken == [("agent-9", "t1")]


async def test_an_agents_own_write_carries_its_name_and_never_wakes_it(world: World) -> None:
    # GIVEN agent-7 holding t1, and a subscription waking agent-7 on task.started
    shard = held_task(world, "t1", "agent-7")
    wake_on(world, "task.started", "agent-7")

    # WHEN agent-7 reports it started through the agent callbacks (the API's path), and the
    # outbox publishes
    world.app.lifecycle().callbacks.report(
        TENANT,
        project_id=PROJECT,
        change_id=CHANGE,
        command=StartTask(task_id="t1", agent_id="agent-7"),
    )
    await world.app.drain_alarms()
    await world.react()

    # THEN the fact says agent-7 wrote it, and agent-7 was not woken by its own write
    (envelope,) = shard.connection.execute(
        "SELECT envelope FROM outbox WHERE event_type = 'task.started'"
    ).fetchone()
    started = json.loads(envelope)
    assert started["actor"] == "agent:agent-7"
    (suppression,) = world.suppressed()
    assert (suppression.event_id, suppression.reason) == (
        started["eventId"],
        SuppressionReason.SELF_CAUSE,
    )
    assert await wakes_waiting(world) == 0


# -- failure domains -----------------------------------------------------------------------------


async def test_a_workflow_engine_outage_holds_only_the_workflow_reaction_which_resumes_after(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: Receiver
) -> None:
    # GIVEN Step Functions (moto's server) with a state machine, a workflow and a webhook
    # subscription on the same kind, and a matching event on the log
    server = S3ServerProcess()
    server.start()
    try:
        client = boto3.client(
            "stepfunctions",
            endpoint_url=server.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
            config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1),
        )
        arn = str(
            client.create_state_machine(
                name=f"triage-{uuid.uuid4().hex[:12]}", definition=PASS_DEFINITION, roleArn=ROLE_ARN
            )["stateMachineArn"]
        )
        clock.set(START)
        world = make_world(
            tmp_path, settings, clock, engine=StepFunctionsEngine(client, {"triage": arn})
        )
        await world.app.ensure_streams()
        try:
            world.subscribe("hook", webhook(receiver.url))
            flow = world.subscribe("flow", WorkflowReaction(workflow="triage"))
            event = task_completed(clock, "t1")
            await world.publish(event)

            # WHEN the engine goes down and the stream's consumers run
            server.stop()
            nudged = await world.app.router().nudge(STREAM)
            down = await world.react()

            # THEN the log's other consumers and the webhook went on; the event waits for
            # the workflow start alone
            projector = nudged.subscriptions[Subscription.PROJECT_VIEW_PROJECTOR.value]
            assert projector.applied == 1
            assert down.failed == 1
            assert len(receiver.received) == 1

            # WHEN the engine is back and the reactions read on from their own cursor
            server.start()
            up = await world.react()

            # THEN the workflow started once, and the webhook was not sent again
            assert up.applied == 1
            executions = client.list_executions(stateMachineArn=arn)["executions"]
            assert [e["name"] for e in executions] == [workflow_instance_id(event.event_id, flow)]
            assert len(receiver.received) == 1
        finally:
            await world.app.close()
    finally:
        server.stop()


def causal_wake(world: World, event: Event, task: str, agent: str) -> Command:
    """The causal router's own wake of ``agent`` about ``event`` on ``task`` (an overlap)."""
    return Command.create(
        command_id=f"cmd_{event.event_id}_{task}",
        command_type="agent.wake",
        project_id=PROJECT,
        change_id=CHANGE,
        task_id=task,
        created_at=world.clock.now(),
        payload={"agentId": agent, "reason": "changeset_overlap", "eventId": event.event_id},
    )


async def test_an_agent_is_woken_once_per_event_however_many_wakes_name_it(world: World) -> None:
    # GIVEN agent-9 holding t1, the causal router's own wake about a fact of t1, and two
    # subscriptions that also wake agent-9 on that fact
    shard = held_task(world, "t1", "agent-9")
    shard.apply(SYSTEM, AppendChangeEvents(change_id=CHANGE, status="open", facts=()))
    wake_on(world, "task.started", "agent-9")
    world.registry.create(
        TENANT,
        "wake-again",
        Selector.create(["task.*"]),
        AgentReaction(agent_id="agent-9"),
        Governance(cooldown_s=0),
    )
    event = task_started(world.clock, "t1", "agent-9")
    router_wake = causal_wake(world, event, "t1", "agent-9")
    await world.app.lifecycle().sender.send(router_wake)
    await world.publish(event)
    await world.react()
    assert await wakes_waiting(world) == 3

    # WHEN the wake consumer takes the three wakes
    agents = RecordingAgents()
    consumer = WakeConsumer(world.app, agents)
    queues = await world.app.queue_runtime()
    await queues.poll("agent-wakeups", consumer, max_fetches=3)

    # THEN the agent was activated once: the router's wake went, both reactions' collapsed
    assert [outcome for _, outcome in consumer.outcomes] == [
        WakeOutcome.DELIVERED,
        WakeOutcome.DUPLICATE,
        WakeOutcome.DUPLICATE,
    ]
    assert agents.woken == [("agent-9", "t1")]
    # … and the router's wake is narrated as agent.woke, once
    outbox = shard.connection.execute("SELECT event_type FROM outbox").fetchall()
    assert [row[0] for row in outbox].count("agent.woke") == 1


async def test_a_router_wake_after_a_reaction_wake_for_the_same_event_wakes_the_agent_once(
    world: World,
) -> None:
    # GIVEN agent-9 holding t1, and a subscription that wakes agent-9 on t1's fact; the
    # reaction's wake is queued first, the causal router's own wake about the same fact after
    shard = held_task(world, "t1", "agent-9")
    shard.apply(SYSTEM, AppendChangeEvents(change_id=CHANGE, status="open", facts=()))
    wake_on(world, "task.started", "agent-9")
    event = task_started(world.clock, "t1", "agent-9")
    await world.publish(event)
    await world.react()
    router_wake = causal_wake(world, event, "t1", "agent-9")
    await world.app.lifecycle().sender.send(router_wake)
    assert await wakes_waiting(world) == 2

    # WHEN the wake consumer takes both, in that order
    agents = RecordingAgents()
    consumer = WakeConsumer(world.app, agents)
    queues = await world.app.queue_runtime()
    await queues.poll("agent-wakeups", consumer, max_fetches=2)

    # THEN the agent was activated once (S2-010 in both orders): the reaction's wake went,
    # the router's joined it
    assert [outcome for _, outcome in consumer.outcomes] == [
        WakeOutcome.DELIVERED,
        WakeOutcome.JOINED,
    ]
    assert len(agents.woken) == 1
    # … and the router's wake still brought its Task's lifecycle: agent.woke, once, a real
    # wakeup (not a false one)
    outbox = shard.connection.execute(
        "SELECT envelope FROM outbox WHERE event_type = 'agent.woke'"
    ).fetchall()
    (woke,) = [Event.parse(bytes(row[0])) for row in outbox]
    assert woke.payload.model_dump(by_alias=True)["falseWakeup"] is False
    assert woke.caused_by == event.event_id


@dataclass
class AgentsDownOnce(RecordingAgents):
    """The agents' runtime, unreachable for the first wake it is given."""

    failures_left: int = 1

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise ConnectionError(f"{agent_id} is unreachable")
        await super().wake(agent_id, task, command)


async def test_a_reaction_wake_redelivered_after_its_agent_failed_is_not_a_second_wake(
    world: World,
) -> None:
    # GIVEN agent-9 holding t1, and a subscription's wake of agent-9 about t1's fact
    held_task(world, "t1", "agent-9")
    subscription = wake_on(world, "task.started", "agent-9")
    event = task_started(world.clock, "t1", "agent-9")
    wake = agent_wake_command(event, subscription, "agent-9", world.clock.now())
    agents = AgentsDownOnce()
    consumer = WakeConsumer(world.app, agents)
    # AND its first delivery recorded the (agent, event) pair, then the agent was unreachable
    with pytest.raises(ConnectionError):
        await consumer(wake, Delivery("agent-wakeups", 1, 1, 4, {}))

    # WHEN the same wake is delivered again
    await consumer(wake, Delivery("agent-wakeups", 1, 2, 4, {}))

    # THEN it is the same activation, not a second one: delivered to the agent this time
    assert [outcome for _, outcome in consumer.outcomes] == [
        WakeOutcome.DELIVERED,
        WakeOutcome.DELIVERED,
    ]
    assert agents.woken == [("agent-9", "t1")]


async def test_a_dead_lettered_reaction_wake_never_blocks_the_task_it_names(
    world: World,
) -> None:
    # GIVEN agent-9 holding t1, and a reaction's wake of another agent about t1's fact that
    # ran out of deliveries (its agent's webhook kept failing)
    shard = held_task(world, "t1", "agent-9")
    event = task_started(world.clock, "t1", "agent-9")
    wake = agent_wake_command(event, "sub_" + "e" * 32, "reviewer-bot", world.clock.now())
    delivery = Delivery("agent-wakeups", 7, 4, 4, {"Rhumbatron-Origin-Queue": "agent-wakeups"})

    # WHEN the dead-letter consumer records it
    await DeadLetterConsumer(world.app)(wake, delivery)

    # THEN the letter is there, and t1 is still agent-9's, assigned: nothing blocked or failed
    page = operator.list_dead_letters(world.app, tenant_id=TENANT)
    assert [letter.command_id for letter in page.letters] == [wake.command_id]
    task = shard.task_state("t1")
    assert task is not None and (task.status.value, task.agent_id) == ("assigned", "agent-9")


async def test_a_redelivered_reaction_wake_still_collapses_into_the_wake_that_went_first(
    world: World,
) -> None:
    # GIVEN agent-9 holding t1, woken by the router about a fact of t1
    held_task(world, "t1", "agent-9")
    event = task_started(world.clock, "t1", "agent-9")
    router_wake = causal_wake(world, event, "t1", "agent-9")
    agents = RecordingAgents()
    consumer = WakeConsumer(world.app, agents)
    await consumer(router_wake, Delivery("agent-wakeups", 1, 1, 4, {}))

    # WHEN a reaction's wake about the same fact arrives on its second delivery (its first
    # failed before it was recorded)
    reaction_wake = agent_wake_command(event, "sub_" + "f" * 32, "agent-9", world.clock.now())
    await consumer(reaction_wake, Delivery("agent-wakeups", 2, 2, 4, {}))

    # THEN it is still a duplicate: a redelivery is no reason to wake the agent twice
    assert [outcome for _, outcome in consumer.outcomes] == [
        WakeOutcome.DELIVERED,
        WakeOutcome.DUPLICATE,
    ]
    assert agents.woken == [("agent-9", "t1")]


async def test_wakes_collapse_per_agent_and_event_so_another_agent_is_still_woken(
    world: World,
) -> None:
    # GIVEN agent-9 holding t1, woken by the router about a fact of t1
    held_task(world, "t1", "agent-9")
    event = task_started(world.clock, "t1", "agent-9")
    agents = RecordingAgents()
    consumer = WakeConsumer(world.app, agents)
    router_wake = causal_wake(world, event, "t1", "agent-9")
    await consumer(router_wake, Delivery("agent-wakeups", 1, 1, 4, {}))

    # WHEN two subscriptions wake reviewer-bot about the same fact
    for seq, sub in ((2, "sub_" + "b" * 32), (3, "sub_" + "c" * 32)):
        wake = agent_wake_command(event, sub, "reviewer-bot", world.clock.now())
        await consumer(wake, Delivery("agent-wakeups", seq, 1, 4, {}))

    # THEN the pair is (agent, event): reviewer-bot is another agent, woken once; only its
    # second wake about the same fact collapses
    assert [outcome for _, outcome in consumer.outcomes] == [
        WakeOutcome.DELIVERED,
        WakeOutcome.DELIVERED,
        WakeOutcome.DUPLICATE,
    ]
    assert agents.woken == [("agent-9", "t1"), ("reviewer-bot", "t1")]


async def test_a_reaction_wake_shows_no_agent_active_on_the_task_it_names(world: World) -> None:
    # GIVEN an open Change whose t1 agent-9 holds, and a reaction's wake of reviewer-bot
    # about t1's fact
    shard = held_task(world, "t1", "agent-9")
    shard.apply(SYSTEM, AppendChangeEvents(change_id=CHANGE, status="open", facts=()))
    event = task_started(world.clock, "t1", "agent-9")
    wake = agent_wake_command(event, "sub_" + "a" * 32, "reviewer-bot", world.clock.now())
    agents = RecordingAgents()
    consumer = WakeConsumer(world.app, agents)

    # WHEN the wake consumer delivers it
    await consumer(wake, Delivery("agent-wakeups", 1, 1, 4, {}))

    # THEN reviewer-bot got it, and no agent.woke says it works on t1 (the project view
    # would show it active there, and nothing would ever clear that)
    assert agents.woken == [("reviewer-bot", "t1")]
    outbox = shard.connection.execute("SELECT event_type FROM outbox").fetchall()
    assert "agent.woke" not in [row[0] for row in outbox]
