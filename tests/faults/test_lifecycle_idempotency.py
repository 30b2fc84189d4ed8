"""Idempotency of the Change lifecycle, against a real nats-server, real SQLite actor files,
moto S3 and the in-process workflow engine (spec "Idempotency and dedupe").

Every row of the spec's idempotency table that the lifecycle owns gets a test that repeats its
step and finds no second logical result. A repeat is made the way production makes one:

* a JetStream redelivery — the handler ran, then its delivery failed before the ack
  (:class:`AckLostOnce`: the real handler, then a raise, so the runtime naks and JetStream
  delivers the same message again with ``delivered == 2``);
* a worker process killed at a named crash point (``RHUMBATRON_CRASH_AT=before_ack``) and a
  recovering consumer in this process that gets the unacknowledged command back;
* the same command sent again (JetStream's duplicate window answers ``duplicate``), or the
  same request made again (a client retrying its HTTP call);
* the router's durable consumer deleted (an operator's rewind: the stream is read from its
  start again, and the ``(consumer, event_id)`` claims drop every Event), and the causal
  rules given the same Events again (what a redelivery after a lost lease does).

Nothing of the project is patched: the tests drive it through its queues, its router and its
public calls, and read its files.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.shard_commands import (
    AdmitAgent,
    ComposeCandidate,
    ProvisionApp,
    StartRelease,
)
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.agents import Admission
from rhumbatron.domain.candidates import CandidateStatus, candidate_id_for, composition_key
from rhumbatron.domain.changes import TaskPlan
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.releases import release_id_for
from rhumbatron.domain.tasks import TaskStatus
from rhumbatron.lifecycle.commands import (
    lifecycle_command,
    ready_wake_id,
    release_command_id,
    verify_command_id,
    workflow_input,
)
from rhumbatron.lifecycle.commands import ready_wake as dispatched_wake
from rhumbatron.lifecycle.requests import qualified_task_id
from rhumbatron.lifecycle.scripted_agent import ScriptLibrary
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.queue_consumer import CommandHandler, Delivery, Retry
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.product.dead_letters import list_dead_letters
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.queues.dead_letter import DeadLetterConsumer
from rhumbatron.queues.wake_consumer import WakeOutcome
from rhumbatron.router.handlers import CausalRouting
from rhumbatron.router.records import APPLIED, RecordOutcome
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron.workflows.engine import WorkflowStatus
from rhumbatron_dev.local.loop import LOOP_QUEUES
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

from .worker import worker_env

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

TENANT = "acme"
USER = Caller(TENANT, "user:dana", "req-idempotency")
#: Fast retries: a nak or a conflict review comes due in 50 ms instead of 10-45 s.
FAST: dict[str, Any] = {
    "queue_retry_delay_s": {
        q: 0.05 for q in ("agent-wakeups", "integration", "verification", "release", "indexing")
    },
    "integration_more_work_delay_s": 0.05,
    "conflict_review_delay_s": 0.05,
}
#: One Task that proposes a valid Python file and completes: the shortest Change that goes
#: all the way to a verified Candidate.
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "model": [
        {"do": "declare_intent", "paths": ["src/models/card.py"]},
        {
            "do": "propose_changeset",
            "files": {"src/models/card.py": "CARD = 'gift'\n"},
        },
        {"do": "complete"},
    ],
    "hold": [{"do": "wait"}, {"do": "complete"}],
}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A real nats-server with JetStream per test, its store in the test's temp dir. Killed
    at the end: the store is thrown away, and a graceful stop costs 0.4 s a test."""
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    yield server
    server.kill()


def lifecycle_settings(
    tmp_path: Path, nats: NatsServerProcess, s3: S3ServerProcess, **overrides: Any
) -> Settings:
    bucket = f"evidence-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=bucket)
    values: dict[str, Any] = {
        "state_dir": tmp_path / "state",
        "nats_url": nats.url,
        "s3_endpoint_url": s3.endpoint_url,
        "evidence_bucket": bucket,
        **FAST,
        **overrides,
    }
    return load_settings(**values)


AppFactory = Callable[..., Rhumbatron]


@pytest_asyncio.fixture
async def make_app(
    tmp_path: Path, nats_server: NatsServerProcess, s3_server: S3ServerProcess
) -> AsyncIterator[AppFactory]:
    """Builds the embedded default on this test's nats-server; settings overridable."""
    opened: list[Rhumbatron] = []

    def build(*, causal_routing: CausalRouting | None = None, **overrides: Any) -> Rhumbatron:
        settings = lifecycle_settings(tmp_path, nats_server, s3_server, **overrides)
        app = bootstrap(
            settings,
            clock=ManualClock(),
            alarms=RecordingAlarmSink(),
            causal_routing=causal_routing,
        )
        app.lifecycle().scripts = ScriptLibrary.from_mapping(SCRIPTS)
        opened.append(app)
        return app

    yield build
    for app in opened:
        await app.close()


@pytest_asyncio.fixture
async def app(make_app: AppFactory) -> Rhumbatron:
    runtime = make_app()
    await runtime.ensure_streams()
    return runtime


# --------------------------------------------------------------------------- the world


def provision(app: Rhumbatron, project_id: str, *, app_name: str | None = "storefront") -> None:
    """The project (and its live app), written by the calls the integration handlers make."""
    system = Caller(TENANT, "system:integration", f"provision-{project_id}")
    app.project_root(project_id).create_project(system, name=project_id)
    if app_name:
        admin = app.lifecycle().world.admin_shard(project_id)
        admin.apply(system, ProvisionApp(app_name=app_name))


def request_change(
    app: Rhumbatron, project_id: str, tasks: Sequence[TaskPlan], *, request: str = "req-1"
) -> str:
    created = app.lifecycle().requests.create_change(
        USER, project_id=project_id, client_request_id=request, title="Gift cards", tasks=tasks
    )
    return created.change_id


def one_task(task_id: str = "tsk-model", script: str = "model") -> list[TaskPlan]:
    return [TaskPlan(task_id, "The card model", "builder-a", script=script)]


def task_of(change_id: str, task_id: str = "tsk-model") -> str:
    """The Task's ID in its shard (qualified by its Change)."""
    return qualified_task_id(change_id, task_id)


def shard_of(app: Rhumbatron, project_id: str, change_id: str) -> ResourceShard:
    return app.lifecycle().world.change_shard(project_id, change_id)


def status_of(app: Rhumbatron, project_id: str, change_id: str) -> str:
    change = shard_of(app, project_id, change_id).change_state(change_id)
    return change.status if change else "missing"


def facts(app: Rhumbatron, project_id: str) -> Counter[str]:
    """Every fact of the project's actors (root and shards), counted by type."""
    counts: Counter[str] = Counter()
    for ref in app.actor_refs():
        if ref.project_id == project_id:
            rows = app.actor(ref).connection.execute("SELECT event_type FROM outbox")
            counts.update(str(row[0]) for row in rows)
    return counts


def workflow_rows(app: Rhumbatron) -> dict[str, tuple[Any, ...]]:
    """The in-process engine's instances (``instance_id -> (workflow, status, updated_at,
    finished steps)``), read from its file."""
    path = app.settings.state_dir / "workflows.sqlite"
    if not path.exists():
        return {}
    with closing(sqlite3.connect(path)) as db:
        steps = Counter(str(row[0]) for row in db.execute("SELECT instance_id FROM workflow_steps"))
        return {
            str(row[0]): (row[1], row[2], row[3], steps[str(row[0])])
            for row in db.execute(
                "SELECT instance_id, workflow, status, updated_at FROM workflow_instances"
            )
        }


async def stored_on(app: Rhumbatron, queue: str) -> int:
    """Messages the COMMANDS stream holds on ``cmd.<queue>`` (acked ones are gone: work
    queue)."""
    js = (await app.nats()).jetstream()
    info = await js.stream_info(COMMAND_STREAM, subjects_filter=command_subject(queue))
    return int((info.state.subjects or {}).get(command_subject(queue), 0))


# --------------------------------------------------------------------------- driving


class AckLostError(RuntimeError):
    """The handler finished, then its delivery failed before the ack."""


@dataclass
class AckLostOnce:
    """A queue handler: the real one, then — on the first delivery of each command it
    finished — a failure before the ack, so the runtime naks it and JetStream delivers the
    same message again. The second delivery runs the real handler again and is acked."""

    inner: CommandHandler
    only: frozenset[str] | None = None
    deliveries: list[tuple[str, int]] = field(default_factory=list)

    async def __call__(self, command: Command, delivery: Delivery) -> Retry | None:
        self.deliveries.append((command.command_id, delivery.delivered))
        outcome = await self.inner(command, delivery)
        chosen = self.only is None or command.command_type in self.only
        if outcome is None and chosen and delivery.delivered == 1:
            raise AckLostError(f"{command.command_id}: the ack was lost after the handler ran")
        return outcome


Wrap = Callable[[str, CommandHandler], CommandHandler]


async def run_until(
    app: Rhumbatron,
    done: Callable[[], bool],
    *,
    wrap: Wrap | None = None,
    skip: Sequence[str] = (),
    max_rounds: int = 200,
    max_idle_rounds: int = 40,
) -> bool:
    """Every role in rounds, as :class:`~rhumbatron_dev.local.loop.LocalLoop` plays
    them, with a test's handler wrapper and queues left unpolled. A quiet round waits 50 ms
    for a delayed redelivery (a nak with a delay) to come due; gives up when quiet for long."""
    lifecycle = app.lifecycle()
    idle = 0
    for _ in range(max_rounds):
        if done():
            return True
        moved = sum(getattr(r, "published", 0) for r in await app.drain_alarms())
        totals = await app.router().drain(max_rounds=50)
        moved += int(totals.get("applied", 0)) + int(totals.get("dead_lettered", 0))
        runtime = await app.queue_runtime()
        for queue in LOOP_QUEUES:
            if queue in skip:
                continue
            if queue == "dead-letter":
                letters = DeadLetterConsumer(app)
                poll = await runtime.poll(
                    queue, letters, max_fetches=5, on_undecodable=letters.on_undecodable
                )
            else:
                handler = lifecycle.handler(queue)
                poll = await runtime.poll(
                    queue, wrap(queue, handler) if wrap else handler, max_fetches=5
                )
            moved += poll.done + poll.retried + poll.failed + poll.dead_lettered + poll.expired
        if moved:
            idle = 0
            continue
        idle += 1
        if idle >= max_idle_rounds:
            return done()
        await asyncio.sleep(0.05)  # a bounded wait for a nak's delay to come due
    return done()


async def verified_change(app: Rhumbatron, project_id: str = "acme-shop") -> tuple[str, str]:
    """A one-Task Change driven to ``awaiting_approval``; its ID and its Candidate's."""
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task())
    assert await run_until(
        app, lambda: status_of(app, project_id, change_id) == "awaiting_approval"
    ), status_of(app, project_id, change_id)
    (candidate,) = shard_of(app, project_id, change_id).candidates(change_id=change_id)
    return change_id, candidate.candidate_id


def ready_wake(
    app: Rhumbatron, project_id: str, change_id: str, task_id: str, agent: str
) -> Command:
    """The dispatcher's wake of a ready Task, as it builds it (``cmd_<task>_ready``)."""
    return dispatched_wake(
        project_id=project_id,
        change_id=change_id,
        task_id=task_id,
        agent_id=agent,
        now=app.clock.now(),
    )


# --------------------------------------------------------------------------- wake command


async def test_a_ready_wake_dispatched_twice_admits_one_agent_and_jetstream_drops_the_repeat(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change whose one Task is ready (its agent holds it once admitted)
    project_id = "acme-shop"
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task(script="hold"))
    lifecycle = app.lifecycle()
    runtime = await app.queue_runtime()

    # WHEN the Change is dispatched twice (two change.dispatch commands, e.g. the planned
    # Change's and a settle's), before any wake is consumed
    for n in (1, 2):
        dispatch = lifecycle_command(
            "change.dispatch",
            f"cmd_dispatch_{n}",
            project_id=project_id,
            change_id=change_id,
            now=app.clock.now(),
            payload={"reason": "test"},
        )
        assert (await lifecycle.sender.send(dispatch)).outcome == "sent"
    await runtime.poll("integration", lifecycle.handler("integration"))

    # THEN both sent cmd_<task>_ready, and JetStream kept one: the same wake sent once more
    # is reported as a duplicate
    assert [h.outcome for h in lifecycle.integration.handled] == ["done", "done"]
    assert await stored_on(app, "agent-wakeups") == 1
    task_id = task_of(change_id)
    again = await lifecycle.sender.send(
        ready_wake(app, project_id, change_id, task_id, "builder-a")
    )
    assert (again.command_id, again.outcome) == (f"cmd_{task_id}_ready", "duplicate")

    # WHEN the wake consumer runs
    await runtime.poll("agent-wakeups", lifecycle.handler("agent-wakeups"))

    # THEN one admission: the Task is held by its agent, with one task.assigned
    task = shard_of(app, project_id, change_id).task_state(task_id)
    assert task is not None and task.agent_id == "builder-a"
    assert task.status is TaskStatus.RUNNING
    assert lifecycle.wake_consumer.outcomes == [(f"cmd_{task_id}_ready", WakeOutcome.DELIVERED)]
    assert facts(app, project_id)["task.assigned"] == 1


async def test_a_ready_wake_for_a_task_its_agent_already_holds_is_a_duplicate(
    app: Rhumbatron,
) -> None:
    # GIVEN a Task its agent was admitted to by the dispatcher's wake
    project_id = "acme-shop"
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task(script="hold"))
    lifecycle = app.lifecycle()
    assert await run_until(
        app, lambda: lifecycle.wake_consumer.outcomes != [] and app.outbox_backlog()["pending"] == 0
    )
    task_id = task_of(change_id)
    assert lifecycle.wake_consumer.outcomes == [(f"cmd_{task_id}_ready", WakeOutcome.DELIVERED)]
    woken = len(lifecycle.scripted.wakes)

    # WHEN the same ready wake arrives again as a new message — the dispatcher sending it
    # after JetStream's 2-hour window, which inside the window drops it (previous test); the
    # consumer's handler is called as the queue runtime calls it for a first delivery
    first = Delivery("agent-wakeups", stream_seq=99, delivered=1, max_deliveries=4, headers={})
    wake = ready_wake(app, project_id, change_id, task_id, "builder-a")
    await lifecycle.wake_consumer(wake, first)

    # THEN it is a duplicate: no second admission, and the agent is not woken again
    assert lifecycle.wake_consumer.outcomes[-1] == (f"cmd_{task_id}_ready", WakeOutcome.DUPLICATE)
    assert len(lifecycle.scripted.wakes) == woken
    assert facts(app, project_id)["task.assigned"] == 1
    task = shard_of(app, project_id, change_id).task_state(task_id)
    assert task is not None and (task.status, task.agent_id) == (TaskStatus.RUNNING, "builder-a")


async def test_two_agents_racing_for_one_ready_task_are_admitted_once(
    app: Rhumbatron, make_app: AppFactory
) -> None:
    # GIVEN a ready Task, and a second process (its own connections to the same actor files)
    project_id = "acme-shop"
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task(script="hold"))
    other = make_app()
    barrier = threading.Barrier(2)

    def admit(runtime: Rhumbatron, agent: str) -> Admission:
        shard = shard_of(runtime, project_id, change_id)
        shard.change_state(change_id)  # the file is open before the start line
        barrier.wait()
        return shard.apply(
            Caller(TENANT, f"agent:{agent}", ready_wake_id(task_of(change_id))),
            AdmitAgent(
                change_id=change_id,
                task_id=task_of(change_id),
                agent_id=agent,
                limit=app.settings.max_active_agents_per_change,
            ),
        )

    # WHEN two different agents are admitted to it at the same moment, one per process
    results = await asyncio.gather(
        asyncio.to_thread(admit, app, "builder-a"), asyncio.to_thread(admit, other, "builder-b")
    )

    # THEN exactly one wins; the other finds the Task held by another agent (a stale wake)
    assert sorted(results) == sorted([Admission.ADMITTED, Admission.HELD_BY_OTHER])
    winner = ("builder-a", "builder-b")[results.index(Admission.ADMITTED)]
    task = shard_of(app, project_id, change_id).task_state(task_of(change_id))
    assert task is not None and (task.status, task.agent_id) == (TaskStatus.ASSIGNED, winner)
    assert facts(app, project_id)["task.assigned"] == 1


# --------------------------------------------------------------------------- change creation


async def test_creating_a_change_twice_for_one_client_request_returns_the_first_change(
    app: Rhumbatron,
) -> None:
    # GIVEN an active project
    project_id = "acme-shop"
    provision(app, project_id)
    requests = app.lifecycle().requests

    # WHEN the same client request creates a Change twice (a client retrying its call)
    first = requests.create_change(
        USER, project_id=project_id, client_request_id="req-7", title="Gift", tasks=one_task()
    )
    second = requests.create_change(
        USER, project_id=project_id, client_request_id="req-7", title="Gift", tasks=one_task()
    )

    # THEN the repeat is the first Change, with one change.created (and one work graph)
    assert first.created and not second.created
    assert second.change_id == first.change_id
    recorded = facts(app, project_id)
    assert (recorded["change.created"], recorded["change.planned"], recorded["task.ready"]) == (
        1,
        1,
        1,
    )
    assert [c.change_id for c in app.lifecycle().world.changes(project_id)] == [first.change_id]
    # ... and published, the stream holds that one change.created
    await app.drain_alarms()
    assert await event_types_on_stream(app, project_id) == Counter(
        ["project.created", "app.provisioned", "change.created", "change.planned", "task.ready"]
    )
    # ... while another client request is another Change
    third = requests.create_change(
        USER, project_id=project_id, client_request_id="req-8", title="Gift", tasks=one_task("t2")
    )
    assert third.created and third.change_id != first.change_id


async def test_one_client_request_id_in_two_projects_creates_a_change_in_each(
    app: Rhumbatron,
) -> None:
    # GIVEN two active projects
    provision(app, "acme-shop")
    provision(app, "acme-blog")
    requests = app.lifecycle().requests

    # WHEN each gets a Change with the same client request ID (the key is per project)
    shop = requests.create_change(
        USER, project_id="acme-shop", client_request_id="req-7", title="Gift", tasks=one_task()
    )
    blog = requests.create_change(
        USER, project_id="acme-blog", client_request_id="req-7", title="Post", tasks=one_task()
    )

    # THEN both are created, each a Change of its own project
    assert shop.created and blog.created
    assert shop.change_id != blog.change_id
    assert [c.change_id for c in app.lifecycle().world.changes("acme-shop")] == [shop.change_id]
    assert [c.change_id for c in app.lifecycle().world.changes("acme-blog")] == [blog.change_id]


async def test_a_client_retrying_its_request_a_day_later_gets_the_first_change(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change created for a client request
    project_id = "acme-shop"
    provision(app, project_id)
    requests = app.lifecycle().requests
    first = requests.create_change(
        USER, project_id=project_id, client_request_id="req-7", title="Gift", tasks=one_task()
    )

    # WHEN the client retries the same request a day and a minute later (the key is the
    # request, not the moment it arrived)
    assert isinstance(app.clock, ManualClock)
    app.clock.advance(days=1, minutes=1)
    again = requests.create_change(
        USER, project_id=project_id, client_request_id="req-7", title="Gift", tasks=one_task()
    )

    # THEN the retry is the first Change, and the project holds that one Change
    assert first.created and not again.created
    assert again.change_id == first.change_id
    assert [c.change_id for c in app.lifecycle().world.changes(project_id)] == [first.change_id]
    assert facts(app, project_id)["change.created"] == 1


async def read_project_events(app: Rhumbatron, project_id: str) -> list[Event]:
    """Every Event of ``project_id`` on its stream, in stream order."""
    js = (await app.nats()).jetstream()
    name = event_stream_name(stream_index(project_id))
    state = (await js.stream_info(name)).state
    events: list[Event] = []
    if not state.messages:
        return events
    for seq in range(state.first_seq, state.last_seq + 1):
        event = Event.parse((await js.get_msg(name, seq)).data or b"")
        if event.project_id == project_id:
            events.append(event)
    return events


async def event_types_on_stream(app: Rhumbatron, project_id: str) -> Counter[str]:
    return Counter(e.event_type for e in await read_project_events(app, project_id))


def redeliver(queue: str, *types: str) -> tuple[Wrap, list[AckLostOnce]]:
    """A wrapper making each ``types`` command of ``queue`` lose its first ack."""
    made: list[AckLostOnce] = []

    def wrap(name: str, handler: CommandHandler) -> CommandHandler:
        if name != queue:
            return handler
        if not made:
            made.append(AckLostOnce(handler, only=frozenset(types)))
        return made[0]

    return wrap, made


def delivered(wrapped: list[AckLostOnce], command_id: str) -> list[int]:
    """The delivery numbers the wrapper saw of ``command_id``."""
    return [n for c, n in (wrapped[0].deliveries if wrapped else []) if c == command_id]


def redelivered(wrapped: list[AckLostOnce]) -> bool:
    """The wrapper saw a second delivery of some command."""
    return any(n == 2 for _, n in (wrapped[0].deliveries if wrapped else []))


# --------------------------------------------------------------------------- workflow start


async def test_verification_start_delivered_twice_runs_one_instance_once(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change whose work is done, and a verification queue whose first ack of every
    # verification.start is lost
    project_id = "acme-shop"
    wrap, wrapped = redeliver("verification", "verification.start")
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task())

    # WHEN the lifecycle runs until the Change awaits approval
    assert await run_until(
        app,
        lambda: (
            status_of(app, project_id, change_id) == "awaiting_approval" and redelivered(wrapped)
        ),
        wrap=wrap,
    )

    # THEN cmd_<candidate>_verify was delivered twice and ran the handler both times ...
    (candidate,) = shard_of(app, project_id, change_id).candidates(change_id=change_id)
    command_id = verify_command_id(candidate.candidate_id)
    assert command_id == f"cmd_{candidate.candidate_id}_verify"
    assert delivered(wrapped, command_id) == [1, 2]
    # ... and there is one instance, keyed by the Candidate ID, whose two steps ran once:
    # one candidate.verified, one move to awaiting_approval
    assert workflow_rows(app) == {
        candidate.candidate_id: ("verification", "succeeded", app.clock.now().isoformat(), 2)
    }
    instance = await app.lifecycle().engine.describe("verification", candidate.candidate_id)
    assert instance is not None and instance.status is WorkflowStatus.succeeded
    assert facts(app, project_id)["candidate.verified"] == 1
    assert candidate.status is CandidateStatus.VERIFIED
    # ... a third start (what a delivery after the 2-hour window does) is refused as a repeat
    start = await app.lifecycle().engine.start(
        "verification",
        candidate.candidate_id,
        {"projectId": project_id, "changeId": change_id, "candidate_id": candidate.candidate_id},
    )
    assert not start.started


async def test_release_start_delivered_twice_makes_one_release(app: Rhumbatron) -> None:
    # GIVEN a verified Change of a project with a live app, and a release queue whose first
    # ack of every release.start is lost
    project_id = "acme-shop"
    change_id, candidate_id = await verified_change(app, project_id)
    wrap, wrapped = redeliver("release", "release.start")

    # WHEN it is approved and the lifecycle runs until the Change completes
    app.lifecycle().requests.approve(USER, project_id=project_id, change_id=change_id)
    assert await run_until(
        app,
        lambda: status_of(app, project_id, change_id) == "completed" and redelivered(wrapped),
        wrap=wrap,
    )

    # THEN cmd_<release>_release, release rel_<project>_1, was delivered twice ...
    release_id = release_id_for(project_id, 1)
    assert release_id == f"rel_{project_id}_1"
    assert release_command_id(release_id) == f"cmd_{release_id}_release"
    assert delivered(wrapped, release_command_id(release_id)) == [1, 2]
    # ... and made one release row, one instance keyed by the release ID (its three steps
    # ran once), one release.started and one release.completed
    releases = shard_of(app, project_id, change_id).releases(change_id=change_id)
    assert [(r.release_id, r.status.value, r.candidate_id) for r in releases] == [
        (release_id, "completed", candidate_id)
    ]
    rows = workflow_rows(app)
    assert rows[release_id][:2] == ("release", "succeeded") and rows[release_id][3] == 3
    recorded = facts(app, project_id)
    assert (recorded["release.started"], recorded["release.completed"]) == (1, 1)
    # ... and a third start of the release (what a delivery after the 2-hour window does) is
    # refused as a repeat
    start = await app.lifecycle().engine.start(
        "release",
        release_id,
        {"projectId": project_id, "changeId": change_id, "release_id": release_id},
    )
    assert not start.started


# --------------------------------------------------------------------------- composition


async def test_candidate_create_redelivered_composes_the_same_candidate(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change whose work is done, an integration queue whose first ack of every
    # candidate.create is lost, and verification not running yet
    project_id = "acme-shop"
    wrap, wrapped = redeliver("integration", "candidate.create")
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task())
    shard = shard_of(app, project_id, change_id)

    # WHEN candidate.create is delivered twice while its verification waits
    assert await run_until(app, lambda: redelivered(wrapped), wrap=wrap, skip=("verification",))

    # THEN both deliveries found one Candidate, named by its composition key ...
    (candidate,) = shard.candidates(change_id=change_id)
    assert candidate.status is CandidateStatus.CREATED
    (changeset,) = candidate.changeset_ids
    assert candidate.candidate_id == candidate_id_for(composition_key(0, [changeset]))
    assert facts(app, project_id)["candidate.created"] == 1
    # ... its one verification.start waits (the repeat was a JetStream duplicate) ...
    assert await stored_on(app, "verification") == 1
    # ... composing the same work on the same base again is the same Candidate, writing
    # nothing
    again = shard.apply(USER, ComposeCandidate(change_id=change_id, base_generation=0))
    assert again.candidate_id == candidate.candidate_id
    assert facts(app, project_id)["candidate.created"] == 1

    # WHEN verification runs
    assert await run_until(
        app, lambda: status_of(app, project_id, change_id) == "awaiting_approval"
    )
    # THEN one instance verified the one Candidate
    assert list(workflow_rows(app)) == [candidate.candidate_id]


# --------------------------------------------------------------------------- promotion


async def test_approving_twice_promotes_once(app: Rhumbatron) -> None:
    # GIVEN a verified Change
    project_id = "acme-shop"
    change_id, candidate_id = await verified_change(app, project_id)
    requests = app.lifecycle().requests
    root = app.project_root(project_id)

    # WHEN it is approved twice (a double click, a retried request)
    first = requests.approve(USER, project_id=project_id, change_id=change_id)
    second = requests.approve(USER, project_id=project_id, change_id=change_id)

    # THEN the same Candidate was promoted once: canonical moved to generation 1 once
    assert first.candidate_id == second.candidate_id == candidate_id
    state = root.state()
    assert state is not None
    assert (state.canonical_generation, state.canonical_candidate_id) == (1, candidate_id)
    recorded = facts(app, project_id)
    assert (recorded["artifact.promoted"], recorded["canonical.advanced"]) == (1, 1)
    assert recorded["promotion.completed"] == 1
    # ... decidePromotion answers a repeat of (Candidate, expected generation) with
    # already_promoted: no fact, no move
    repeat = root.promote(
        USER,
        candidate_id=candidate_id,
        artifact_id=f"art_{candidate_id.removeprefix('cand_')}",
        expected_generation=0,
    )
    assert repeat.events_added == 0
    assert root.promoted_candidate_ids() == [candidate_id]

    # WHEN the router and the release run
    assert await run_until(app, lambda: status_of(app, project_id, change_id) == "completed")
    # THEN generation 1 is the only one, and a third approval changes nothing
    requests.approve(USER, project_id=project_id, change_id=change_id)
    assert root.state() == state
    assert facts(app, project_id)["canonical.advanced"] == 1


# --------------------------------------------------------------------------- release key


async def test_a_release_is_keyed_by_its_project_and_generation(app: Rhumbatron) -> None:
    # GIVEN a Change released as generation 1
    project_id = "acme-shop"
    change_id, candidate_id = await verified_change(app, project_id)
    app.lifecycle().requests.approve(USER, project_id=project_id, change_id=change_id)
    assert await run_until(app, lambda: status_of(app, project_id, change_id) == "completed")
    shard = shard_of(app, project_id, change_id)
    (release,) = shard.releases()
    assert release.release_id == f"rel_{project_id}_1"

    # WHEN the release of generation 1 is started again, at the actor and by the module
    system = Caller(TENANT, "system:integration", "again")
    again = shard.apply(
        system,
        StartRelease(
            change_id=change_id, generation=1, candidate_id=candidate_id, app_name="storefront"
        ),
    )
    outcome = await app.lifecycle().integration.start_release(project_id, change_id, system)

    # THEN the primary key finds the row: nothing is written, the start command is a
    # JetStream duplicate, and the release stays completed
    assert again.events_added == 0
    assert outcome == "duplicate"
    assert [(r.release_id, r.status.value) for r in shard.releases()] == [
        (release.release_id, "completed")
    ]
    assert facts(app, project_id)["release.started"] == 1


# --------------------------------------------------------------------------- replay


async def released_change(app: Rhumbatron, project_id: str = "acme-shop") -> str:
    change_id, _ = await verified_change(app, project_id)
    app.lifecycle().requests.approve(USER, project_id=project_id, change_id=change_id)
    assert await run_until(
        app,
        lambda: (
            status_of(app, project_id, change_id) == "completed"
            and app.lifecycle().indexer.ready_generation(project_id) == 1
        ),
    )
    assert await run_until(app, lambda: False, max_idle_rounds=3) is False  # quiet now
    return change_id


async def queues_empty(app: Rhumbatron) -> dict[str, int]:
    return {q: await stored_on(app, q) for q in LOOP_QUEUES}


async def test_replaying_the_whole_event_stream_through_the_router_changes_nothing(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change released end to end, everything quiet
    project_id = "acme-shop"
    change_id = await released_change(app, project_id)
    lifecycle = app.lifecycle()
    events = await read_project_events(app, project_id)
    before = (facts(app, project_id), workflow_rows(app), status_of(app, project_id, change_id))
    routed = len(lifecycle.routed)
    assert await queues_empty(app) == dict.fromkeys(LOOP_QUEUES, 0)

    # WHEN an operator rewinds the causal router: its durable consumer is deleted, and the
    # router reads the stream from its start again
    js = (await app.nats()).jetstream()
    await js.delete_consumer(
        event_stream_name(stream_index(project_id)), Subscription.CAUSAL_ROUTER.value
    )
    totals = await app.router().drain()

    # THEN every Event came back: each one a rule acts on was a duplicate by its (consumer,
    # event_id) claim, and each other one was acked with no claim, as the first time; the
    # rules saw none of them
    acted_on = [e for e in events if lifecycle.routing.acts_on(e)]
    assert 0 < len(acted_on) < len(events)
    assert (totals["duplicates"], totals["applied"]) == (
        len(acted_on),
        len(events) - len(acted_on),
    )
    assert len(lifecycle.routed) == routed

    # WHEN the rules themselves are given every Event again (what a redelivery does whose
    # lease was lost after routing: the claim no longer protects it)
    outcomes = await lifecycle.routing.route(events)

    # THEN each Event is applied, and what it causes again is nothing new: every command it
    # sends is a JetStream duplicate of its first sending, and its state effects are no-ops
    assert set(outcomes.values()) == {APPLIED}
    replayed = lifecycle.routed[routed:]
    assert [r.event_id for r in replayed] == [e.event_id for e in events]
    assert [r.sent for r in replayed if r.sent] == []
    assert sum(len(r.duplicates) for r in replayed) > 0
    # ... so nothing moves afterwards either: no fact, no workflow, no queued command
    assert await run_until(app, lambda: False, max_idle_rounds=3) is False
    assert (facts(app, project_id), workflow_rows(app), status_of(app, project_id, change_id)) == (
        before
    )
    assert await queues_empty(app) == dict.fromkeys(LOOP_QUEUES, 0)


# --------------------------------------------------------------------------- every step twice

SAMPLE = Path(__file__).resolve().parents[2] / "samplefiles" / "lifecycle.json"


@dataclass
class RoutedTwice:
    """The causal rules, given every batch twice in a row: what the router does when it
    crashes after routing and before its lease completes (the redelivery routes again)."""

    app: Rhumbatron | None = None
    batches: int = 0

    def acts_on(self, event: Event) -> bool:
        assert self.app is not None
        return self.app.lifecycle().routing.acts_on(event)

    async def route(
        self, events: Sequence[Event], traces: Mapping[str, str] | None = None
    ) -> dict[str, RecordOutcome]:
        assert self.app is not None
        routing = self.app.lifecycle().routing
        await routing.route(events, traces)
        self.batches += 1
        return await routing.route(events)


async def test_every_lifecycle_step_delivered_twice_still_releases_one_of_everything(
    make_app: AppFactory,
) -> None:
    # GIVEN the sample project's whole lifecycle (provision, an app, four Tasks of two
    # agents with a prefix overlap, verification, promotion, release), where every command
    # on every lifecycle queue loses its first ack and every Event is routed twice
    sample = json.loads(SAMPLE.read_text())
    project_id, tenant = sample["project"]["id"], sample["tenant"]
    routing = RoutedTwice()
    app = make_app(causal_routing=routing)
    routing.app = app
    await app.ensure_streams()
    lifecycle = app.lifecycle()
    lifecycle.scripts = ScriptLibrary.from_file(SAMPLE)
    lost: dict[str, AckLostOnce] = {}

    def wrap(queue: str, handler: CommandHandler) -> CommandHandler:
        return lost.setdefault(queue, AckLostOnce(handler))

    def seen_twice() -> bool:
        """No command waits for its second delivery."""
        counts = Counter((q, c) for q, w in lost.items() for c, _ in w.deliveries)
        return set(counts.values()) <= {2}

    for command_type, command_id, payload in (
        ("project.provision", "cmd_provision", {"name": "Acme", "tenantId": tenant}),
        ("app.provision", "cmd_app", {"appName": sample["app"]["name"]}),
    ):
        command = lifecycle_command(
            command_type, command_id, project_id=project_id, now=app.clock.now(), payload=payload
        )
        await lifecycle.sender.send(command)
    assert await run_until(
        app, lambda: lifecycle.world.admin_shard(project_id).live_apps() != [], wrap=wrap
    )
    plans = [
        TaskPlan(t["taskId"], t["title"], t["agentId"], tuple(t.get("dependsOn", ())), t["script"])
        for t in sample["change"]["tasks"]
    ]
    change_id = request_change(app, project_id, plans)

    # WHEN the lifecycle runs to a verified Change, is approved, and runs to its release
    assert await run_until(
        app, lambda: status_of(app, project_id, change_id) == "awaiting_approval", wrap=wrap
    ), status_of(app, project_id, change_id)
    lifecycle.requests.approve(USER, project_id=project_id, change_id=change_id)
    assert await run_until(
        app,
        lambda: (
            status_of(app, project_id, change_id) == "completed"
            and lifecycle.indexer.ready_generation(project_id) == 1
            and seen_twice()
        ),
        wrap=wrap,
    ), status_of(app, project_id, change_id)

    # THEN every command of every lifecycle queue was handled twice (one delivery lost its
    # ack), and every Event was routed twice ...
    for queue in ("integration", "verification", "release", "agent-wakeups", "indexing"):
        seen = Counter(c for c, _ in lost[queue].deliveries)
        assert seen and set(seen.values()) == {2}, (queue, seen)
    assert routing.batches > 0
    # ... and the Change still made one of everything: one Candidate and one release, one
    # verification and one release instance, generation 1 once, one admission per Task
    shard = shard_of(app, project_id, change_id)
    (candidate,) = shard.candidates(change_id=change_id)
    assert candidate.status is CandidateStatus.PROMOTED
    (release,) = shard.releases(change_id=change_id)
    assert (release.release_id, release.status.value) == (
        release_id_for(project_id, 1),
        "completed",
    )
    assert {k: v[:2] for k, v in workflow_rows(app).items()} == {
        candidate.candidate_id: ("verification", "succeeded"),
        release.release_id: ("release", "succeeded"),
    }
    root = app.project_root(project_id).state()
    assert root is not None and root.canonical_generation == 1
    recorded = facts(app, project_id)
    once = (
        "project.created",
        "app.provisioned",
        "change.created",
        "change.planned",
        "verification.started",
        "candidate.created",
        "candidate.verified",
        "candidate.promoted",
        "promotion.completed",
        "artifact.promoted",
        "canonical.advanced",
        "release.started",
        "release.completed",
        "change.completed",
    )
    assert {t: recorded[t] for t in once} == dict.fromkeys(once, 1)
    per_task = ("task.ready", "task.assigned", "task.started", "task.completed")
    assert {t: recorded[t] for t in per_task} == dict.fromkeys(per_task, len(plans))
    assert list_dead_letters(app.product().connection, status=None) == []
    assert (
        app.settings.state_dir / "apps" / project_id / "storefront" / "live.txt"
    ).read_text() == ("1\n")


# --------------------------------------------------------------------------- kill points


async def test_a_candidate_whose_first_composition_failed_midway_is_verified_on_redelivery(
    app: Rhumbatron,
) -> None:
    # GIVEN a Change whose work is done, and a disk that refuses the Candidate's fork once:
    # a file stands where the project's fork directory goes, and is cleared as soon as the
    # first delivery of candidate.create has failed on it
    project_id = "acme-shop"
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task())
    obstacle = app.settings.state_dir / "forks" / project_id
    obstacle.parent.mkdir(parents=True)
    obstacle.write_text("not a directory")
    failures: list[str] = []

    def wrap(queue: str, handler: CommandHandler) -> CommandHandler:
        async def disk_recovers(command: Command, delivery: Delivery) -> Retry | None:
            try:
                return await handler(command, delivery)
            except OSError as exc:
                failures.append(f"{command.command_type}: {type(exc).__name__}")
                obstacle.unlink()
                raise

        return disk_recovers if queue == "integration" else handler

    # WHEN the lifecycle runs: the first candidate.create composes the Candidate (its shard
    # transaction commits) and then fails writing the fork; the redelivery comes back
    finished = await run_until(
        app,
        lambda: status_of(app, project_id, change_id) == "awaiting_approval",
        wrap=wrap,
        max_idle_rounds=20,
    )

    # THEN the redelivery finished what the first delivery left undone: the one Candidate
    # got its fork and its one verification, and the Change awaits approval
    assert failures == ["candidate.create: FileExistsError"]
    (candidate,) = shard_of(app, project_id, change_id).candidates(change_id=change_id)
    assert finished, (status_of(app, project_id, change_id), candidate.status)
    assert candidate.status is CandidateStatus.VERIFIED
    assert list(workflow_rows(app)) == [candidate.candidate_id]
    assert facts(app, project_id)["candidate.created"] == 1


#: A queue worker of its own process: the lifecycle's handler of one queue, polled once.
#: Settings come from RHUMBATRON_* (state dir, NATS URL, RHUMBATRON_CRASH_AT).
QUEUE_WORKER = """
import asyncio, sys
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron.core.settings import load_settings

async def main(queue):
    app = bootstrap(load_settings())
    try:
        runtime = await app.queue_runtime()
        await runtime.poll(queue, app.lifecycle().handler(queue), max_fetches=1)
    finally:
        await app.close()

asyncio.run(main(sys.argv[1]))
"""


async def test_a_candidate_create_killed_before_its_ack_makes_one_candidate_and_one_verification(
    make_app: AppFactory,
) -> None:
    # GIVEN a Change whose work graph just completed, its candidate.create waiting on the
    # integration queue, and consumers whose unacknowledged messages come back after 1 s
    project_id = "acme-shop"
    app = make_app(command_ack_wait_s=1.0, command_in_progress_s=0.3)
    await app.ensure_streams()
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task())
    assert await run_until(app, lambda: status_of(app, project_id, change_id) == "verifying")
    await app.drain_alarms()
    await app.router().drain()
    assert await stored_on(app, "integration") == 1

    # WHEN a worker process handles it — composes the Candidate, writes its fork, sends its
    # verification.start — and is killed before its ack
    settings = app.settings
    env = worker_env(
        settings,
        command_ack_wait_s=str(settings.command_ack_wait_s),
        command_in_progress_s=str(settings.command_in_progress_s),
        crash_at="before_ack",
    )
    crashed = subprocess.run(
        [sys.executable, "-c", QUEUE_WORKER, "integration"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    # THEN it died there, its work done and its command still unacknowledged
    assert crashed.returncode == 137, crashed.stderr
    shard = shard_of(app, project_id, change_id)
    (candidate,) = shard.candidates(change_id=change_id)
    assert candidate.status is CandidateStatus.CREATED
    assert (await stored_on(app, "integration"), await stored_on(app, "verification")) == (1, 1)

    # WHEN this process's consumers run, and JetStream delivers the command again
    lifecycle = app.lifecycle()
    assert await run_until(
        app,
        lambda: (
            status_of(app, project_id, change_id) == "awaiting_approval"
            and any(h.command_type == "candidate.create" for h in lifecycle.integration.handled)
        ),
        max_idle_rounds=100,
    )

    # THEN the redelivery (its 2nd delivery) found the Candidate: still one Candidate, one
    # candidate.created, one verification instance, which verified it
    (handled,) = [h for h in lifecycle.integration.handled if h.command_type == "candidate.create"]
    assert (handled.delivered, handled.outcome) == (2, "done")
    assert [c.candidate_id for c in shard.candidates(change_id=change_id)] == [
        candidate.candidate_id
    ]
    assert facts(app, project_id)["candidate.created"] == 1
    assert {k: v[:2] for k, v in workflow_rows(app).items()} == {
        candidate.candidate_id: ("verification", "succeeded")
    }


# --------------------------------------------------------------------------- send failing


async def without_subject(app: Rhumbatron, queue: str) -> None:
    """Take ``cmd.<queue>`` off the COMMANDS stream: JetStream answers no publish to it (a
    stream that is down for that queue), while the other queues keep working."""
    js = (await app.nats()).jetstream()
    config = (await js.stream_info(COMMAND_STREAM)).config
    config.subjects = [s for s in config.subjects or [] if s != command_subject(queue)]
    await js.update_stream(config)


async def test_a_workflow_start_whose_send_succeeds_starts_nothing_directly(
    app: Rhumbatron, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a verification queue that takes commands
    lifecycle = app.lifecycle()
    candidate_id = "cand_" + "0" * 32
    start = lifecycle_command(
        "verification.start",
        verify_command_id(candidate_id),
        project_id="acme-shop",
        change_id="chg_sent",
        now=app.clock.now(),
        payload={"candidateId": candidate_id},
    )

    # WHEN the producer sends its workflow start command
    sent = await lifecycle.sender.start_workflow(start)

    # THEN the command waits on its queue, and the producer started no instance: only the
    # consumer's delivery starts it
    assert sent.outcome == "sent"
    assert await stored_on(app, "verification") == 1
    assert workflow_rows(app) == {}
    assert "directly" not in caplog.text


async def test_a_workflow_start_whose_send_fails_starts_directly_and_a_later_delivery_finds_it(
    app: Rhumbatron, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a Change whose work graph just completed, and a verification queue JetStream
    # refuses to take commands for
    project_id = "acme-shop"
    provision(app, project_id)
    change_id = request_change(app, project_id, one_task())
    assert await run_until(app, lambda: status_of(app, project_id, change_id) == "verifying")
    await without_subject(app, "verification")
    lifecycle = app.lifecycle()

    # WHEN candidate.create composes the Candidate and sends its verification.start
    assert await run_until(
        app, lambda: status_of(app, project_id, change_id) == "awaiting_approval"
    ), status_of(app, project_id, change_id)

    # THEN the send failed and the producer started the workflow directly: one instance,
    # keyed by the Candidate ID, which verified the Candidate without any delivery
    (candidate,) = shard_of(app, project_id, change_id).candidates(change_id=change_id)
    assert candidate.status is CandidateStatus.VERIFIED
    rows = workflow_rows(app)
    assert {k: v[:2] for k, v in rows.items()} == {
        candidate.candidate_id: ("verification", "succeeded")
    }
    assert not any(h.command_type == "verification.start" for h in lifecycle.integration.handled)
    assert f"starting workflow verification {candidate.candidate_id} directly" in caplog.text
    before = facts(app, project_id)

    # WHEN the queue is back and the same start command arrives later (a producer that
    # retries its send)
    await app.ensure_streams()
    start = lifecycle_command(
        "verification.start",
        verify_command_id(candidate.candidate_id),
        project_id=project_id,
        change_id=change_id,
        now=app.clock.now(),
        payload={"candidateId": candidate.candidate_id},
    )
    assert (await lifecycle.sender.start_workflow(start)).outcome == "sent"
    assert await run_until(
        app,
        lambda: any(h.command_type == "verification.start" for h in lifecycle.integration.handled),
    )

    # THEN its delivery found the existing instance: nothing ran again
    assert workflow_rows(app) == rows
    assert facts(app, project_id) == before
    assert status_of(app, project_id, change_id) == "awaiting_approval"
    again = await lifecycle.engine.start(
        "verification", candidate.candidate_id, workflow_input(start)
    )
    assert not again.started
