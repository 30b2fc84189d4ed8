"""The reactions consumer against a real nats-server, real SQLite files and a real loopback
webhook receiver (seed 002 "Reactions", issue #7 items 3-5): one signed pointer-only delivery
per (event, subscription), the loop guards with their recorded cause chains, the admission
gate's budget and in-flight cap, and workflow and agent reactions (the failing receivers are
tests/integration/test_webhook_retries.py).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio

from project_roots import ensure_project_roots
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.agents.registry import AgentRegistry
from rhumbatron.agents.signing import verify
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.core.tracing import Span, install_span_sink
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import project_admin_key
from rhumbatron.errors import RhumbatronError, WorkflowEngineError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.metrics import MetricBinding, RecordingSink, metric_counts
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_subject, stream_index
from rhumbatron.queues.wake_consumer import WakeConsumer, WakeOutcome
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.consumer import ReactionsConsumer
from rhumbatron.reactions.deliveries import (
    ReactionEffects,
    agent_command_id,
    webhook_id,
    workflow_instance_id,
)
from rhumbatron.reactions.gate import admit
from rhumbatron.reactions.guards import Hop, SuppressionReason, suppressions
from rhumbatron.reactions.ports import FactSink
from rhumbatron.reactions.reaction_decisions import REFUSED_METRIC
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import (
    AgentReaction,
    Governance,
    WebhookReaction,
    WorkflowReaction,
)
from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
from rhumbatron.router.claims import claim_leases
from rhumbatron.router.handlers import RunContext
from rhumbatron.router.reports import SubscriptionReport
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron.runtime.reactions_assembly import LazyHttpClient, reactions_for
from rhumbatron.workflows.engine import WorkflowEngine, WorkflowStart, check_instance_id
from rhumbatron.workflows.in_process import InProcessEngine, WorkflowDefinition

pytestmark = pytest.mark.integration

TENANT = "acme"
PROJECT = "proj-react"
STREAM = stream_index(PROJECT)
#: Another tenant's project on the same stream (a project has one tenant).
OTHER_PROJECT = next(
    p for p in (f"proj-globex-{n}" for n in range(100)) if stream_index(p) == STREAM
)
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
START = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


# -- a real webhook receiver ---------------------------------------------------------------------


@dataclass
class Receiver:
    """A loopback HTTP server that verifies every request's signature and records it."""

    clock: ManualClock
    fail_next: int = 0
    received: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def receiver(clock: ManualClock) -> Iterator[Receiver]:
    state = Receiver(clock)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            verify([SECRET], headers, body, now=state.clock.now(), tolerance_s=300)
            with lock:
                failing = state.fail_next > 0
                if failing:
                    state.fail_next -= 1
                    state.refused.append(headers["webhook-id"])
                else:
                    state.received.append((headers, json.loads(body)))
            self.send_response(500 if failing else 204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


# -- the runtime -----------------------------------------------------------------------------


@dataclass
class World:
    app: Rhumbatron
    registry: SubscriptionRegistry
    clock: ManualClock
    wakes: list[str] = field(default_factory=list)
    #: The metric points emitted after their rows were committed (what EMF would send).
    metrics: RecordingSink = field(default_factory=RecordingSink)

    def emitted(self) -> list[str]:
        return [point.name for point in self.metrics.points(MetricBinding.METRICS)]

    def points(self, *names: str) -> list[tuple[str, dict[str, str], str, str]]:
        """The stored metric points of ``names``, oldest first: name, dimensions, event ID
        (the delivery's key) and project."""
        rows = self.app.product().connection.execute(
            "SELECT name, dimensions, event_id, project_id FROM platform_metrics "
            f"WHERE name IN ({', '.join('?' * len(names))}) ORDER BY id",
            names,
        )
        return [(row[0], json.loads(row[1]), row[2], row[3]) for row in rows]

    async def publish(
        self, *events: Event, msg_id_suffix: str = "", traceparent: str | None = None
    ) -> None:
        ensure_project_roots(self.app, events)
        js = (await self.app.nats()).jetstream()
        for event in events:
            headers = {"Nats-Msg-Id": event.event_id + msg_id_suffix}
            if traceparent is not None:
                headers["traceparent"] = traceparent
            await js.publish(event_stream_subject(STREAM), event.to_json(), headers=headers)

    async def react(self, attempts: int = 200) -> SubscriptionReport:
        """One reactions consume on the project's stream (what a sweep tick runs) that
        fetched something. A message published (or nacked) a moment ago can trail the
        consumer by a moment: this bounds that wait instead of sleeping a guessed time."""
        router = self.app.router()
        report = SubscriptionReport()
        for _ in range(attempts):
            run = RunContext(STREAM, self.clock.now().timestamp(), apply_calls_left=15)
            report = await router.consume(run, Subscription.REACTIONS, consumes=1, batch=100)
            if report.fetched:
                break
        return report

    def subscribe(self, name: str, reaction: Any, cooldown_s: int = 0) -> str:
        created = self.registry.create(
            TENANT,
            name,
            Selector.create(["task.completed"]),
            reaction,
            Governance(cooldown_s=cooldown_s),
        )
        return created.record.subscription_id

    def suppressed(self) -> list[Any]:
        return list(suppressions(self.app.product().connection, tenant_id=TENANT))


def make_world(
    tmp_path: Path,
    settings: Settings,
    clock: ManualClock,
    *,
    limits: ReactionSettings | None = None,
    engine: WorkflowEngine | None = None,
    no_engine: bool = False,
    wrap_facts: Callable[[FactSink], FactSink] | None = None,
    **overrides: Any,
) -> World:
    """A runtime with reactions bound: the process's workflow engine, or ``engine``, or
    none at all (``no_engine``)."""
    values = settings.model_dump() | {
        "webhook_allowed_hosts": ("127.0.0.1",),
        "router_nak_delay_s": 0,
        **overrides,
    }
    metrics = RecordingSink()
    app = bootstrap(
        load_settings(**values), clock=clock, alarms=RecordingAlarmSink(), metrics_sink=metrics
    )
    registry = SubscriptionRegistry(app.product(), app.settings, clock)
    reactions = reactions_for(app, registry, http=LazyHttpClient(), limits=limits)
    if wrap_facts is not None:
        reactions.facts = wrap_facts(reactions.facts)
    if engine is not None or no_engine:
        reactions.effects = ReactionEffects(
            http=reactions.effects.http, engine=engine, send_command=reactions.effects.send_command
        )
    app.bind_reactions(reactions)
    return World(app, registry, clock, metrics=metrics)


@pytest_asyncio.fixture
async def world(tmp_path: Path, settings: Settings, clock: ManualClock) -> AsyncIterator[World]:
    clock.set(START)
    built = make_world(tmp_path, settings, clock)
    await built.app.ensure_streams()
    yield built
    await built.app.close()


def task_completed(
    clock: ManualClock,
    task: str,
    *,
    caller: Caller | None = None,
    change: str = "chg-1",
    project: str = PROJECT,
) -> Event:
    ctx = FactContext(caller or Caller(TENANT, "system:test", "corr-1"), project, clock.now())
    return ctx.fact(
        "task.completed", {"agentId": "agent-7"}, change_id=f"{project}-{change}", task_id=task
    )


def webhook(url: str) -> WebhookReaction:
    return WebhookReaction(url=url, secrets=(SECRET,))


# -- webhook delivery ----------------------------------------------------------------------------


async def test_a_matching_webhook_subscription_delivers_one_signed_pointer_only_body_per_event(
    world: World, receiver: Receiver
) -> None:
    # GIVEN a webhook subscription on task.completed and one such event on the log
    sub = world.subscribe("hook", webhook(receiver.url))
    event = task_completed(world.clock, "t1")
    await world.publish(event)

    # WHEN the reactions consume it, and the same event arrives again (a redelivery)
    first = await world.react()
    await world.publish(event, msg_id_suffix=":again")
    second = await world.react()

    # THEN the receiver verified one signed body: a pointer to the event, never its payload
    assert (first.applied, second.duplicates) == (1, 1)
    assert len(receiver.received) == 1
    headers, body = receiver.received[0]
    assert headers["webhook-id"] == f"{event.event_id}:{sub}"
    assert body == {
        "eventId": event.event_id,
        "kind": "task.completed",
        "subject": {"type": "task", "id": "t1"},
        "projectId": PROJECT,
        "link": f"/projects/{PROJECT}/events/{event.event_id}",
    }
    counts = metric_counts(world.app.product().connection, MetricBinding.METRICS)
    assert counts["reaction_fired"] == 1
    assert world.points("reaction_fired") == [
        (
            "reaction_fired",
            {"reaction": "webhook", "tenant": TENANT},
            f"{event.event_id}:{sub}",
            PROJECT,
        )
    ]
    assert world.emitted() == ["reaction_fired"]  # and emitted once written


async def test_an_event_no_subscription_matches_delivers_nothing(
    world: World, receiver: Receiver
) -> None:
    # GIVEN a subscription on task.completed, and a task.failed event
    world.subscribe("hook", webhook(receiver.url))
    ctx = FactContext(Caller(TENANT, "system:test", "corr-1"), PROJECT, world.clock.now())
    failed = ctx.fact("task.failed", {"reason": "boom"}, change_id=f"{PROJECT}-c", task_id="t1")
    await world.publish(failed)

    # WHEN the reactions consume it
    report = await world.react()

    # THEN it is applied with no delivery and no suppression
    assert report.applied == 1
    assert receiver.received == []
    assert world.suppressed() == []


async def test_the_sweep_runs_the_reactions_subscription(world: World, receiver: Receiver) -> None:
    # GIVEN a webhook subscription and a matching event
    world.subscribe("hook", webhook(receiver.url))
    await world.publish(task_completed(world.clock, "t1"))
    minute = next(
        START.replace(hour=m // 60, minute=m % 60) for m in range(600, 700) if m % 8 == STREAM
    )

    # WHEN the sweep tick of the project's stream runs
    sweep = await world.app.router().sweep(now=minute)

    # THEN its reactions batch delivered the event
    assert sweep.run.subscriptions[Subscription.REACTIONS.value].applied == 1
    assert len(receiver.received) == 1


# -- loop guards ---------------------------------------------------------------------------------


async def test_a_self_caused_event_is_suppressed_and_recorded_with_its_cause_chain(
    world: World, receiver: Receiver
) -> None:
    # GIVEN a webhook subscription that fired on an event
    sub = world.subscribe("hook", webhook(receiver.url))
    cause = task_completed(world.clock, "t1")
    await world.publish(cause)
    await world.react()

    # WHEN its receiver writes a fact back in the delivery's correlation (webhook-id)
    echo_caller = Caller(TENANT, "user:hook", correlation_id=f"{cause.event_id}:{sub}")
    echo = task_completed(world.clock, "t2", caller=echo_caller)
    await world.publish(echo)
    report = await world.react()

    # THEN that fact does not fire the subscription again; the suppression names the chain
    assert report.applied == 1
    assert len(receiver.received) == 1
    (suppression,) = world.suppressed()
    assert suppression.reason is SuppressionReason.SELF_CAUSE
    assert suppression.event_id == echo.event_id
    assert suppression.cause_chain.hops == (Hop(cause.event_id, sub),)
    counts = metric_counts(world.app.product().connection, MetricBinding.METRICS)
    assert counts["reaction_suppressed"] == 1
    key = f"{echo.event_id}:{sub}"
    assert world.points("reaction_suppressed") == [
        ("reaction_suppressed", {"reason": "self_cause", "tenant": TENANT}, key, PROJECT)
    ]
    assert suppression.delivery_key == key


async def test_a_chain_runs_on_through_events_no_subscription_matches(
    world: World, receiver: Receiver
) -> None:
    # GIVEN a subscription that fired, a fact its receiver wrote that matches nothing, and
    # a fact caused by that one (as the causal router writes causedBy = eventId)
    sub = world.subscribe("hook", webhook(receiver.url))
    cause = task_completed(world.clock, "t1")
    await world.publish(cause)
    await world.react()
    ctx = FactContext(
        Caller(TENANT, "user:hook", correlation_id=f"{cause.event_id}:{sub}"),
        PROJECT,
        world.clock.now(),
    )
    middle = ctx.fact("task.failed", {"reason": "echo"}, change_id=f"{PROJECT}-c", task_id="t9")
    caller = Caller(TENANT, "system:causal-router", middle.event_id, caused_by=middle.event_id)
    last = task_completed(world.clock, "t2", caller=caller)

    # WHEN both are consumed
    await world.publish(middle, last)
    await world.react()

    # THEN the last is recognised as caused by the subscription, two events later
    (suppression,) = world.suppressed()
    assert (suppression.event_id, suppression.reason) == (
        last.event_id,
        SuppressionReason.SELF_CAUSE,
    )
    assert suppression.cause_chain.hops == (Hop(cause.event_id, sub),)
    assert len(receiver.received) == 1


async def test_an_agent_never_wakes_on_its_own_writes(world: World) -> None:
    # GIVEN an agent reaction for agent-7, and a fact agent-7 wrote itself
    AgentRegistry(world.app.product(), world.app.settings, world.clock).register_scripted(
        TENANT, "agent-7"
    )
    world.subscribe("wake", AgentReaction(agent_id="agent-7"))
    own = task_completed(world.clock, "t1", caller=Caller(TENANT, "agent:agent-7", "corr-a"))
    await world.publish(own)

    # WHEN the reactions consume it
    await world.react()

    # THEN no wake is sent; the suppression is recorded
    (suppression,) = world.suppressed()
    assert suppression.reason is SuppressionReason.SELF_CAUSE
    js = (await world.app.nats()).jetstream()
    assert (await js.stream_info(COMMAND_STREAM)).state.messages == 0


async def test_a_fact_a_reaction_wrote_itself_never_fires_that_reaction(
    world: World, receiver: Receiver
) -> None:
    # GIVEN two webhook subscriptions, and a fact whose actor is the first reaction itself
    own_sub = world.subscribe("own", webhook(receiver.url))
    world.subscribe("other", webhook(receiver.url))
    writer = Caller(TENANT, f"system:reaction:{own_sub}", "corr-own")
    own = task_completed(world.clock, "t1", caller=writer)
    await world.publish(own)

    # WHEN the reactions consume it
    await world.react()

    # THEN only the other subscription fired; the first's suppression names itself
    assert len(receiver.received) == 1
    (suppression,) = world.suppressed()
    assert (suppression.subscription_id, suppression.reason) == (
        own_sub,
        SuppressionReason.SELF_CAUSE,
    )


async def test_the_depth_cap_stops_a_chain_of_reactions(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: Receiver
) -> None:
    # GIVEN a depth cap of 1 and two subscriptions, the first of which fired on an event
    clock.set(START)
    world = make_world(tmp_path, settings, clock, limits=ReactionSettings(reaction_depth_cap=1))
    await world.app.ensure_streams()
    try:
        first = world.subscribe("first", webhook(receiver.url))
        cause = task_completed(clock, "t1")
        await world.publish(cause)
        await world.react()
        world.subscribe("second", webhook(receiver.url))

        # WHEN a fact caused by that reaction arrives (one hop deep)
        caller = Caller(TENANT, "user:hook", correlation_id=f"{cause.event_id}:{first}")
        await world.publish(task_completed(clock, "t2", caller=caller))
        await world.react()

        # THEN the first is held back as self-caused, the second by the depth cap
        reasons = {s.subscription_id: s.reason for s in world.suppressed()}
        assert reasons[first] is SuppressionReason.SELF_CAUSE
        assert SuppressionReason.DEPTH in reasons.values()
        assert len(receiver.received) == 1
    finally:
        await world.app.close()


async def test_an_agent_reaction_gets_the_depth_cap_and_the_cooldown_too(
    tmp_path: Path, settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a depth cap of 1, and an agent reaction with a 60 s cooldown
    clock.set(START)
    world = make_world(tmp_path, settings, clock, limits=ReactionSettings(reaction_depth_cap=1))
    await world.app.ensure_streams()
    try:
        AgentRegistry(world.app.product(), world.app.settings, world.clock).register_scripted(
            TENANT, "agent-9"
        )
        agent = world.subscribe("wake", AgentReaction(agent_id="agent-9"), cooldown_s=60)
        hook = world.subscribe("hook", webhook("http://127.0.0.1:9/unused"))
        first = task_completed(clock, "t1")
        await world.publish(first)
        await world.react()

        # WHEN a second match comes 10 s later, and then one that the webhook's reaction
        # caused (one hop deep), after the cooldown
        clock.advance(10)
        second = task_completed(clock, "t2")
        await world.publish(second)
        await world.react()
        clock.advance(60)
        caller = Caller(TENANT, "user:hook", correlation_id=f"{first.event_id}:{hook}")
        deep = task_completed(clock, "t3", caller=caller)
        await world.publish(deep)
        await world.react()

        # THEN the agent was woken once: the second by its cooldown, the third by the depth
        # cap, as a webhook reaction would be
        agent_reasons = {
            s.event_id: s.reason for s in world.suppressed() if s.subscription_id == agent
        }
        assert agent_reasons == {
            second.event_id: SuppressionReason.COOLDOWN,
            deep.event_id: SuppressionReason.DEPTH,
        }
        js = (await world.app.nats()).jetstream()
        info = await js.stream_info(COMMAND_STREAM, subjects_filter="cmd.agent-wakeups")
        assert (info.state.subjects or {}).get("cmd.agent-wakeups") == 1
    finally:
        await world.app.close()


async def test_an_agents_fact_on_a_reactions_wake_counts_the_wakes_hop_toward_the_depth_cap(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: Receiver
) -> None:
    # GIVEN a depth cap of 2; webhook "first" fired on e0, and e1 (its receiver's write) woke
    #   agent-7 through agent reaction "wake": e1 is one hop deep, the wake two
    clock.set(START)
    world = make_world(tmp_path, settings, clock, limits=ReactionSettings(reaction_depth_cap=2))
    await world.app.ensure_streams()
    try:
        AgentRegistry(world.app.product(), world.app.settings, clock).register_scripted(
            TENANT, "agent-7"
        )
        first = world.subscribe("first", webhook(receiver.url))
        e0 = task_completed(clock, "t0")
        await world.publish(e0)
        await world.react()
        wake = world.subscribe("wake", AgentReaction(agent_id="agent-7"))
        echo = Caller(TENANT, "user:hook", correlation_id=f"{e0.event_id}:{first}")
        e1 = task_completed(clock, "t1", caller=echo)
        await world.publish(e1)
        await world.react()
        third = world.subscribe("third", webhook(receiver.url))

        # WHEN agent-7 writes e2 as the wake consumer has it write: caused by e1, in the
        #   wake's correlation <commandId>:<attempt>
        wake_id = agent_command_id(e1.event_id, wake)
        agent = Caller(TENANT, "agent:agent-7", f"{wake_id}:1", caused_by=e1.event_id)
        e2 = task_completed(clock, "t2", caller=agent)
        await world.publish(e2)
        await world.react()

        # THEN e2 is two hops deep (the wake's chain, not e1's shorter one): "third" is held
        #   back by the depth cap, with the whole chain
        held = [s for s in world.suppressed() if s.subscription_id == third]
        assert [(s.event_id, s.reason) for s in held] == [(e2.event_id, SuppressionReason.DEPTH)]
        assert held[0].cause_chain.hops == (Hop(e0.event_id, first), Hop(e1.event_id, wake))
        assert [body["subject"]["id"] for _, body in receiver.received] == ["t0"]
    finally:
        await world.app.close()


async def test_a_cooldown_suppresses_a_second_fire_inside_the_window(
    world: World, receiver: Receiver
) -> None:
    # GIVEN a subscription with a 60 s cooldown that just fired
    world.subscribe("hook", webhook(receiver.url), cooldown_s=60)
    await world.publish(task_completed(world.clock, "t1"))
    await world.react()

    # WHEN a second match comes 59 s later, and a third 60 s after the first (the window
    #   is measured from the fire, not moved by a suppression)
    world.clock.advance(59)
    second = task_completed(world.clock, "t2")
    await world.publish(second)
    await world.react()
    world.clock.advance(1)
    await world.publish(task_completed(world.clock, "t3"))
    await world.react()

    # THEN the second is suppressed by the cooldown (it lasts the whole 60 s), the third,
    # at its end, delivered
    assert [body["subject"]["id"] for _, body in receiver.received] == ["t1", "t3"]
    (suppression,) = world.suppressed()
    assert (suppression.reason, suppression.event_id) == (
        SuppressionReason.COOLDOWN,
        second.event_id,
    )


async def test_each_subscription_keeps_its_own_cooldown_in_seconds(
    world: World, receiver: Receiver
) -> None:
    # GIVEN two subscriptions on the same events: one with a 120 s cooldown, one with none
    #   (neither is the 60 s default), and both fired on a first match
    slow = world.subscribe("slow", webhook(receiver.url), cooldown_s=120)
    every = world.subscribe("every", webhook(receiver.url), cooldown_s=0)
    await world.publish(task_completed(world.clock, "t1"))
    await world.react()

    # WHEN a second match comes 30 s later, and a third 130 s after the first
    world.clock.advance(30)
    second = task_completed(world.clock, "t2")
    await world.publish(second)
    await world.react()
    world.clock.advance(100)
    await world.publish(task_completed(world.clock, "t3"))
    await world.react()

    # THEN each subscription kept its own window: the one without a cooldown fired on every
    # match; the 120 s one skipped the second only, its window measured from its own fire
    # (not from the other's fire at 30 s)
    fired = [
        (headers["webhook-id"].rsplit(":", 1)[1], body["subject"]["id"])
        for headers, body in receiver.received
    ]
    assert sorted(fired) == sorted(
        [(slow, "t1"), (every, "t1"), (every, "t2"), (slow, "t3"), (every, "t3")]
    )
    assert [(s.subscription_id, s.reason, s.event_id) for s in world.suppressed()] == [
        (slow, SuppressionReason.COOLDOWN, second.event_id)
    ]


# -- the admission gate --------------------------------------------------------------------------


class BusyOnce:
    """A fact sink whose first ``budget.exceeded`` finds the shard busy."""

    def __init__(self, inner: FactSink) -> None:
        self.inner, self.busy = inner, True

    def budget_exceeded(self, event: Event, **fields: Any) -> None:
        if self.busy:
            self.busy = False
            raise RhumbatronError("the shard is busy")
        self.inner.budget_exceeded(event, **fields)

    def reaction_disabled(self, disablement: Any) -> None:
        self.inner.reaction_disabled(disablement)


async def test_a_budget_fact_that_cannot_be_written_is_decided_again_and_written_once(
    tmp_path: Path,
    settings: Settings,
    clock: ManualClock,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a daily budget of one reaction, and a shard busy for the first budget.exceeded
    clock.set(START)
    limits = ReactionSettings(reaction_daily_budget=1)
    world = make_world(tmp_path, settings, clock, limits=limits, wrap_facts=BusyOnce)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        # WHEN two matching events arrive, and the refused one is delivered again (no later
        #   refusal of the day could record the fact in its place)
        events = [task_completed(clock, f"t{i}") for i in range(2)]
        await world.publish(*events)
        with caplog.at_level("ERROR", logger="rhumbatron.reactions.consumer"):
            first = await world.react()
        again = await world.react()

        # THEN the refusal that could not record its fact was undone and failed (to be
        # decided again); the next refusal recorded it, once, and the redelivery is refused
        assert (first.applied, first.failed, again.applied) == (1, 1, 1)
        assert caplog.messages == [
            f"cannot record budget.exceeded for {events[1].event_id}:{sub}: the shard is busy"
        ]
        shard = world.app.resource_shard(PROJECT, project_admin_key(PROJECT))
        facts = shard.connection.execute(
            "SELECT COUNT(*) FROM outbox WHERE event_type = 'budget.exceeded'"
        ).fetchone()
        assert facts[0] == 1
        assert sorted(s.event_id for s in world.suppressed()) == sorted(
            e.event_id for e in events[1:]
        )
        assert [body["subject"]["id"] for _, body in receiver.received] == ["t0"]
    finally:
        await world.app.close()


async def test_a_spent_budget_records_budget_exceeded_once_and_skips_the_reactions(
    tmp_path: Path,
    settings: Settings,
    clock: ManualClock,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a daily budget of one reaction per tenant
    clock.set(START)
    limits = ReactionSettings(reaction_daily_budget=1)
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))

        # WHEN three matching events arrive the same day
        events = [task_completed(clock, f"t{i}") for i in range(3)]
        await world.publish(*events)
        with caplog.at_level("INFO", logger="rhumbatron.reactions.reaction_decisions"):
            report = await world.react()

        # THEN one is delivered, two skipped (not retried), and budget.exceeded recorded once
        assert report.applied == 3
        assert [body["subject"]["id"] for _, body in receiver.received] == ["t0"]
        assert [s.reason for s in world.suppressed()] == [SuppressionReason.BUDGET] * 2
        refused = [f"{e.event_id}:{sub}" for e in events[1:]]
        why = "tenant 'acme' used 1 of its 1 reactions of 2026-03-02 "
        why += "(RHUMBATRON_REACTION_DAILY_BUDGET)"
        assert sorted((s.delivery_key, s.detail) for s in world.suppressed()) == sorted(
            (key, why) for key in refused
        )
        assert [m for m in caplog.messages if "suppressed" in m] == [
            f"reaction {key} suppressed (budget): {why}" for key in refused
        ]
        assert world.points("reaction_refused") == [
            ("reaction_refused", {"gate": "budget", "tenant": TENANT}, key, PROJECT)
            for key in refused
        ]
        shard = world.app.resource_shard(PROJECT, project_admin_key(PROJECT))
        facts = shard.connection.execute(
            "SELECT envelope FROM outbox WHERE event_type = 'budget.exceeded'"
        ).fetchall()
        assert len(facts) == 1
        fact = json.loads(facts[0][0])
        assert fact["payload"]["limit"] == 1
        assert fact["payload"]["day"] == "2026-03-02"
        assert fact["actor"] == "system:reactions"
        assert fact["causedBy"] == events[1].event_id  # the first event the budget refused
        counts = metric_counts(world.app.product().connection, MetricBinding.METRICS)
        assert counts["reaction_refused"] == 2

        # WHEN another tenant's event arrives the same day, then acme's the next UTC day
        world.registry.create(
            "globex",
            "hook",
            Selector.create(["task.completed"]),
            webhook(receiver.url),
            Governance(cooldown_s=0),
        )
        globex = Caller("globex", "system:test", "corr-g")
        await world.publish(task_completed(clock, "g1", caller=globex, project=OTHER_PROJECT))
        await world.react()
        clock.set(datetime(2026, 3, 3, 0, 0, tzinfo=UTC))
        await world.publish(task_completed(clock, "t9"))
        await world.react()

        # THEN both are delivered: the budget is per tenant and per UTC day
        assert [body["subject"]["id"] for _, body in receiver.received] == ["t0", "g1", "t9"]
        assert len(world.suppressed()) == 2
    finally:
        await world.app.close()


async def test_a_full_in_flight_cap_leaves_the_event_on_the_stream(
    tmp_path: Path,
    settings: Settings,
    clock: ManualClock,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN an in-flight cap of 1, taken by another delivery of the tenant
    clock.set(START)
    limits = ReactionSettings(reaction_in_flight_cap=1, reaction_in_flight_lease_s=30)
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        world.subscribe("hook", webhook(receiver.url))
        await world.publish(task_completed(clock, "t1"))
        await world.react()  # creates the reactions' tables
        with world.app.product().transaction() as db:
            taken = admit(
                db,
                tenant_id=TENANT,
                delivery_key="evt_other:sub_other",
                day="2026-03-02",
                now_s=clock.now().timestamp(),
                daily_budget=100,
                in_flight_cap=1,
                lease_s=30,
            )
        assert taken.admitted
        await world.publish(*[task_completed(clock, t) for t in ("t2", "t3", "t4")])

        # WHEN the reactions consume the next events, and again once the slot has expired
        with caplog.at_level("WARNING", logger="rhumbatron.router.settling"):
            queued = await world.react()
        refusals = metric_counts(world.app.product().connection, MetricBinding.METRICS)
        clock.advance(31)
        later = await world.react()

        # THEN they waited on the stream (retried, not failed, not skipped): the first met the
        # full cap and the rest of the batch was left untouched behind it; then all were
        # delivered, in stream order
        assert (queued.retried, queued.failed) == (3, 0)
        assert refusals.get(REFUSED_METRIC) == 1
        full = (
            f"the in-flight cap of tenant {TENANT!r} is full (1, "
            "RHUMBATRON_REACTION_IN_FLIGHT_CAP); the event waits on the stream"
        )
        assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [full] * 3
        assert later.applied == 3
        assert [body["subject"]["id"] for _, body in receiver.received] == ["t1", "t2", "t3", "t4"]
        assert world.suppressed() == []
    finally:
        await world.app.close()


async def test_a_delivery_another_run_holds_waits_on_the_stream_until_its_lease_expires(
    tmp_path: Path,
    settings: Settings,
    clock: ManualClock,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a webhook subscription, and a matching event whose delivery another run holds
    #   under a live lease (its event, not yet claimed, is this run's to decide), then
    #   another event of the tenant
    clock.set(START)
    world = make_world(tmp_path, settings, clock)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        event = task_completed(clock, "t1")
        await world.publish(event, task_completed(clock, "t2"))
        with world.app.product().transaction() as db:
            claim_leases(
                db,
                Subscription.REACTIONS.value,
                [webhook_id(event.event_id, sub)],
                now_s=clock.now().timestamp(),
                lease_s=30,
            )

        # WHEN the reactions consume it, and again once that lease has expired
        with caplog.at_level("WARNING", logger="rhumbatron.router.settling"):
            first = await world.react()
        clock.advance(31)
        later = await world.react()

        # THEN it waited on the stream with the reason, then was delivered, once; the next
        #   event did not wait behind it (a held delivery is not a full in-flight cap)
        assert (first.retried, first.applied, first.failed) == (1, 1, 0)
        assert [r.getMessage() for r in caplog.records] == [
            f"reactions retries {event.event_id}: a delivery of {event.event_id} is held by "
            "another run whose lease has not expired; the event waits on the stream"
        ]
        assert later.applied == 1
        assert [body["subject"]["id"] for _, body in receiver.received] == ["t2", "t1"]
    finally:
        await world.app.close()


async def test_an_event_another_run_holds_waits_on_the_stream_untouched(
    world: World, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a matching event that another run has claimed under a live lease
    world.subscribe("hook", webhook(receiver.url))
    event = task_completed(world.clock, "t1")
    await world.publish(event)
    with world.app.product().transaction() as db:
        claim_leases(
            db,
            Subscription.REACTIONS.value,
            [event.event_id],
            now_s=world.clock.now().timestamp(),
            lease_s=30,
        )
    # WHEN the reactions consume it
    with caplog.at_level("WARNING", logger="rhumbatron.router.settling"):
        report = await world.react()
    # THEN it waits on the stream, with the reason, and nothing was delivered
    assert (report.retried, report.applied, report.duplicates) == (1, 0, 0)
    assert caplog.messages == [
        f"reactions retries {event.event_id}: claimed by another run whose lease has not expired"
    ]
    assert receiver.received == []


async def test_the_reactions_work_an_event_in_its_span_under_its_header(
    world: World, receiver: Receiver
) -> None:
    # GIVEN a matching event whose message names the position that wrote it
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    world.subscribe("hook", webhook(receiver.url))
    event = task_completed(world.clock, "t1")
    finished: list[Span] = []
    uninstall = install_span_sink(SimpleNamespace(record=finished.append))
    try:
        # WHEN the reactions consume it
        await world.publish(event, traceparent=parent)
        await world.react()
    finally:
        uninstall()
    # THEN they worked it in one span named for the work and the event's type, child of
    # the position in its header
    (react,) = [s for s in finished if s.name.startswith("react")]
    assert (react.name, react.parent_id) == ("react task.completed", "b7ad6b7169203331")


# -- workflow and agent reactions ----------------------------------------------------------------


def note_run(runs: list[str]) -> Callable[[Any, dict[str, Any]], Awaitable[None]]:
    """A workflow step noting the event ID of its input."""

    async def step(input: Any, state: dict[str, Any]) -> None:
        runs.append(str(input["eventId"]))

    return step


def triage_engine(
    tmp_path: Path,
    settings: Settings,
    clock: ManualClock,
    runs: list[str],
    engine: type[InProcessEngine] = InProcessEngine,
) -> InProcessEngine:
    """An in-process engine that knows workflow "triage": one step noting its event ID."""
    return engine(
        tmp_path / "wf.sqlite",
        load_settings(state_dir=tmp_path / "wf", nats_url=settings.nats_url),
        clock,
        {"triage": WorkflowDefinition("triage", (("note", note_run(runs)),))},
    )


async def test_a_workflow_reaction_starts_once_per_event_and_subscription(
    tmp_path: Path, settings: Settings, clock: ManualClock
) -> None:
    # GIVEN an engine that knows workflow "triage" and a subscription that starts it
    clock.set(START)
    runs: list[str] = []
    engine = triage_engine(tmp_path, settings, clock, runs)
    world = make_world(tmp_path, settings, clock, engine=engine)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("triage", WorkflowReaction(workflow="triage"))
        world.subscribe("unknown", WorkflowReaction(workflow="nowhere"))
        event = task_completed(clock, "t1")
        await world.publish(event)

        # WHEN the event is consumed, then delivered again
        await world.react()
        await world.publish(event, msg_id_suffix=":again")
        await world.react()

        # THEN the instance reaction-<eventId>-<subscriptionId> (without the evt_/sub_
        # prefixes: the full form is 82 characters, an execution name at most 80) ran once;
        # the workflow the engine does not know was skipped visibly, never imitated
        assert runs == [event.event_id]
        instance_id = workflow_instance_id(event.event_id, sub)
        assert instance_id == f"reaction-{event.event_id[4:]}-{sub[4:]}"
        assert await engine.describe("triage", instance_id) is not None
        (skipped,) = world.suppressed()
        assert skipped.reason is SuppressionReason.NO_WORKFLOW
        assert "nowhere" in skipped.detail
        assert sorted(world.emitted()) == ["reaction_fired", "reaction_suppressed"]
    finally:
        engine.close()


async def test_a_workflow_reaction_with_no_engine_is_skipped_saying_so(
    tmp_path: Path, settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a workflow reaction in a process that has no workflow engine
    clock.set(START)
    world = make_world(tmp_path, settings, clock, no_engine=True)
    await world.app.ensure_streams()
    try:
        world.subscribe("triage", WorkflowReaction(workflow="triage"))
        await world.publish(task_completed(clock, "t1"))
        # WHEN the event is consumed
        report = await world.react()
        # THEN the reaction is skipped visibly, with the reason, and the event is done
        (skipped,) = world.suppressed()
        assert (skipped.reason, skipped.detail) == (
            SuppressionReason.NO_WORKFLOW,
            "this process has no workflow engine",
        )
        assert (report.applied, report.failed) == (1, 0)
        assert world.emitted() == ["reaction_suppressed"]
    finally:
        await world.app.close()


async def test_a_redelivery_that_finds_its_workflow_already_started_is_a_success(
    tmp_path: Path, settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a workflow reaction whose instance a previous delivery already started: that
    # process died after the start and before its claim was done, so the claim does not
    # dedupe the redelivery, and only the engine's AlreadyStarted can (S2-121)
    clock.set(START)
    runs: list[str] = []
    engine = triage_engine(tmp_path, settings, clock, runs)
    world = make_world(tmp_path, settings, clock, engine=engine)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("triage", WorkflowReaction(workflow="triage"))
        event = task_completed(clock, "t1")
        first = await engine.start(
            "triage", workflow_instance_id(event.event_id, sub), {"eventId": event.event_id}
        )
        assert first.started
        await world.publish(event)

        # WHEN the event is delivered to the reactions
        report = await world.react()

        # THEN the start finds the instance and is taken as done: applied, not failed or
        # retried, and the workflow ran once, not twice
        assert (report.applied, report.failed, report.retried) == (1, 0, 0)
        assert runs == [event.event_id]
        assert world.suppressed() == []
    finally:
        engine.close()
        await world.app.close()


class EngineDownOnce(InProcessEngine):
    """The in-process engine, unreachable for the first ``failures_left`` starts it is asked
    for (one unless told)."""

    failures_left = 1

    async def start(
        self, workflow: str, instance_id: str, input: Mapping[str, Any]
    ) -> WorkflowStart:
        if self.failures_left:
            self.failures_left -= 1
            raise WorkflowEngineError("the engine is unreachable")
        return await super().start(workflow, instance_id, input)


@contextlib.asynccontextmanager
async def engine_down_world(
    tmp_path: Path,
    settings: Settings,
    clock: ManualClock,
    *,
    failures: int = 1,
    limits: ReactionSettings | None = None,
) -> AsyncIterator[tuple[World, list[str]]]:
    """A runtime whose workflow engine (it knows ``triage``) is unreachable for its first
    ``failures`` starts; yields it with the list of the event IDs the workflow ran for."""
    clock.set(START)
    runs: list[str] = []
    engine = triage_engine(tmp_path, settings, clock, runs, engine=EngineDownOnce)
    assert isinstance(engine, EngineDownOnce)
    engine.failures_left = failures
    world = make_world(tmp_path, settings, clock, limits=limits, engine=engine)
    await world.app.ensure_streams()
    try:
        yield world, runs
    finally:
        engine.close()
        await world.app.close()


async def test_a_retried_delivery_is_charged_once_and_not_held_by_its_own_cooldown(
    tmp_path: Path, settings: Settings, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a daily budget of one reaction, and a workflow reaction with a 60 s cooldown
    #   whose first start fails (the engine is down), so its event comes back at once
    limits = ReactionSettings(reaction_daily_budget=1)
    async with engine_down_world(tmp_path, settings, clock, limits=limits) as (world, runs):
        sub = world.subscribe("triage", WorkflowReaction(workflow="triage"), cooldown_s=60)
        event = task_completed(clock, "t1")
        await world.publish(event)

        # WHEN the reactions consume it, and its redelivery 10 s later
        with caplog.at_level("WARNING", logger="rhumbatron.reactions.consumer"):
            failed = await world.react()
        clock.advance(10)
        retried = await world.react()

        # THEN the retry of the same delivery was admitted: neither over the budget it was
        # already charged for nor inside the cooldown its own first attempt started
        assert (failed.failed, retried.applied) == (1, 1)
        key = webhook_id(event.event_id, sub)
        assert caplog.messages == [
            f"reaction {key} failed: the engine is unreachable",
            f"reactions failed {event.event_id} (1/5): {key}: WorkflowEngineError: the engine "
            "is unreachable",
        ]
        assert runs == [event.event_id]
        assert world.suppressed() == []


async def test_a_charged_retry_still_runs_behind_a_subscription_refused_for_the_budget(
    tmp_path: Path, settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a daily budget of one reaction, spent by a workflow reaction whose first start
    #   failed (the engine was down), so its event comes back
    limits = ReactionSettings(reaction_daily_budget=1)
    async with engine_down_world(tmp_path, settings, clock, limits=limits) as (world, runs):
        world.subscribe("b-flow", WorkflowReaction(workflow="triage"))
        event = task_completed(clock, "t1")
        await world.publish(event)
        failed = await world.react()
        # WHEN a subscription named before it is created, and the event comes back
        world.subscribe("a-flow", WorkflowReaction(workflow="triage"))
        retried = await world.react()
        # THEN the new one is refused for the spent budget, and the retry it charged already
        #   still runs behind it
        assert (failed.failed, retried.applied) == (1, 1)
        assert [s.reason for s in world.suppressed()] == [SuppressionReason.BUDGET]
        assert runs == [event.event_id]


async def test_a_held_back_subscription_does_not_stop_the_next_from_reacting(
    world: World, receiver: Receiver
) -> None:
    # GIVEN two webhook subscriptions, the first (by name) with a 60 s cooldown
    world.subscribe("a-hook", webhook(receiver.url), cooldown_s=60)
    world.subscribe("b-hook", webhook(receiver.url))
    # WHEN two matching events arrive a moment apart
    await world.publish(task_completed(world.clock, "t1"), task_completed(world.clock, "t2"))
    await world.react()
    # THEN the first reacts once (its cooldown holds the second event back), the other twice
    assert [body["subject"]["id"] for _, body in receiver.received] == ["t1", "t1", "t2"]
    assert [s.reason for s in world.suppressed()] == [SuppressionReason.COOLDOWN]


async def test_every_failed_reaction_of_an_event_is_named_in_its_failure(
    tmp_path: Path, settings: Settings, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN two workflow reactions on one event, and an engine down for both starts
    async with engine_down_world(tmp_path, settings, clock, failures=2) as (world, _):
        subs = [world.subscribe(name, WorkflowReaction(workflow="triage")) for name in "ab"]
        event = task_completed(clock, "t1")
        await world.publish(event)
        # WHEN the event is consumed
        with caplog.at_level("WARNING", logger="rhumbatron.router.settling"):
            report = await world.react()
        # THEN it fails once, naming each reaction that failed and why
        keys = [webhook_id(event.event_id, sub) for sub in subs]
        why = "WorkflowEngineError: the engine is unreachable"
        assert report.failed == 1
        assert [r.getMessage() for r in caplog.records if r.name.endswith("settling")] == [
            f"reactions failed {event.event_id} (1/5): {keys[0]}: {why}; {keys[1]}: {why}"
        ]


async def test_a_reactions_event_dead_lettered_is_skipped_when_it_comes_again(
    tmp_path: Path, settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a workflow reaction whose engine is down for its event's five deliveries
    async with engine_down_world(tmp_path, settings, clock, failures=5) as (world, runs):
        world.subscribe("triage", WorkflowReaction(workflow="triage"))
        event = task_completed(clock, "t1")
        await world.publish(event)
        attempts = [await world.react() for _ in range(5)]
        # WHEN the same event comes again (published again under another message ID), with
        #   the engine back
        await world.publish(event, msg_id_suffix=":again")
        again = await world.react()
        # THEN the fifth failure dead-lettered it and marked it processed: the copy is a
        #   duplicate, and the workflow never ran
        assert [(a.failed, a.dead_lettered) for a in attempts] == [(1, 0)] * 4 + [(1, 1)]
        assert (again.duplicates, again.applied) == (1, 0)
        assert runs == []


async def test_an_agent_reaction_sends_one_agent_wake_through_the_command_path(
    world: World,
) -> None:
    # GIVEN an agent reaction for an agent of the tenant
    AgentRegistry(world.app.product(), world.app.settings, world.clock).register_scripted(
        TENANT, "agent-9"
    )
    sub = world.subscribe("wake", AgentReaction(agent_id="agent-9"))
    event = task_completed(world.clock, "t1")
    await world.publish(event)

    # WHEN it is consumed, and delivered again
    await world.react()
    await world.publish(event, msg_id_suffix=":again")
    await world.react()

    # THEN one agent.wake is on the agent-wakeups queue, with the stable command ID
    js = (await world.app.nats()).jetstream()
    assert (await js.stream_info(COMMAND_STREAM)).state.messages == 1
    message = await js.get_last_msg(COMMAND_STREAM, "cmd.agent-wakeups")
    command = json.loads(message.data or b"{}")
    assert command["commandId"] == f"cmd_{event.event_id}_{sub}"
    assert command["payload"] == {
        "agentId": "agent-9",
        "reason": f"reaction:{sub}",
        "eventId": event.event_id,
        "eventKind": "task.completed",
    }


async def test_an_agent_reaction_about_no_task_it_holds_reaches_the_agent(world: World) -> None:
    # GIVEN a scripted agent woken by a subscription on task.completed (a Task it never held)
    AgentRegistry(world.app.product(), world.app.settings, world.clock).register_scripted(
        TENANT, "agent-9"
    )
    world.subscribe("wake", AgentReaction(agent_id="agent-9"))
    await world.publish(task_completed(world.clock, "t1"))
    await world.react()

    # WHEN the agent-wakeups queue is polled by the wake consumer
    lifecycle = world.app.lifecycle()
    consumer = lifecycle.handler("agent-wakeups")
    queues = await world.app.queue_runtime()
    await queues.poll("agent-wakeups", consumer, max_fetches=2)

    # THEN the wake reached the agent's runtime (not a false wakeup): the scripted agent
    # notes it, and plays nothing
    assert isinstance(consumer, WakeConsumer)
    assert [outcome for _, outcome in consumer.outcomes] == [WakeOutcome.DELIVERED]
    noted = lifecycle.scripted.wakes
    assert [(w.agent_id, w.task_id, w.played) for w in noted] == [("agent-9", "t1", False)]


def test_the_consumer_is_the_reactions_subscription_handler(world: World) -> None:
    # GIVEN the router of a runtime
    # WHEN its reactions handler is built
    handler = world.app.router().handler(STREAM, Subscription.REACTIONS)
    # THEN it is the reactions consumer
    assert isinstance(handler, ReactionsConsumer)


# -- the IDs an effect carries -------------------------------------------------------------------


def test_the_reaction_ids_are_stable_and_fit_their_targets() -> None:
    # GIVEN an event ID and registry-shaped, short and odd subscription IDs
    event_id = "evt_" + "a" * 32
    registry_sub, short_sub, odd_sub = "sub_" + "b" * 32, "s1", "x" * 90

    # WHEN the workflow instance IDs and wake command IDs are derived
    instances = [workflow_instance_id(event_id, s) for s in (registry_sub, short_sub, odd_sub)]
    commands = [agent_command_id(event_id, s) for s in (short_sub, "has space")]

    # THEN the short form is kept, the registry form drops its prefixes, the rest is digested;
    # each is a valid execution name / command ID, and the same pair gives the same ID
    assert instances[0] == f"reaction-{'a' * 32}-{'b' * 32}"
    assert instances[1] == f"reaction-{event_id}-s1"
    assert instances[2].startswith(f"reaction-{'a' * 32}-h")
    assert all(check_instance_id(i) == i for i in instances)
    assert commands[0] == f"cmd_{event_id}_s1"
    assert commands[1].startswith(f"cmd_{event_id}_h")
    assert workflow_instance_id(event_id, odd_sub) == instances[2]


async def test_one_tenants_full_in_flight_cap_does_not_hold_another_tenants_events(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: Receiver
) -> None:
    # GIVEN two tenants' webhook subscriptions, and tenant acme's cap of 1 taken elsewhere
    clock.set(START)
    limits = ReactionSettings(reaction_in_flight_cap=1, reaction_in_flight_lease_s=30)
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        world.subscribe("hook", webhook(receiver.url))
        world.registry.create(
            "globex",
            "hook",
            Selector.create(["task.completed"]),
            webhook(receiver.url),
            Governance(cooldown_s=0),
        )
        with world.app.product().transaction() as db:
            admit(
                db,
                tenant_id=TENANT,
                delivery_key="evt_other:sub_other",
                day="2026-03-02",
                now_s=clock.now().timestamp(),
                daily_budget=100,
                in_flight_cap=1,
                lease_s=30,
            )
        globex = Caller("globex", "system:test", "corr-g")
        await world.publish(
            task_completed(clock, "t1"),
            task_completed(clock, "g1", caller=globex, project=OTHER_PROJECT),
            task_completed(clock, "t2"),
            task_completed(clock, "g2", caller=globex, project=OTHER_PROJECT),
        )

        # WHEN the reactions consume the batch
        report = await world.react()

        # THEN acme's events wait on the stream, and globex's are delivered meanwhile
        assert (report.retried, report.applied) == (2, 2)
        assert [body["subject"]["id"] for _, body in receiver.received] == ["g1", "g2"]
    finally:
        await world.app.close()
