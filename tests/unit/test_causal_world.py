"""The causal rules' view of a project, read from real ResourceShard files: who is active on
which resources, what is ready, and the 8-agent limit per Change."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AcquireClaim, DeclareIntent, RecordTaskStatus
from rhumbatron.causal.world import ShardWorld
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.facts import Caller
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

SYSTEM = Caller("acme", "system:test", correlation_id="corr-world")
PROJECT = "acme-web"


@pytest.fixture
def app(offline_settings: Settings, clock: ManualClock) -> Iterator[Rhumbatron]:
    runtime = bootstrap(offline_settings, clock=clock, alarms=RecordingAlarmSink())
    yield runtime
    for ref in list(runtime.actor_refs()):
        runtime.actor(ref).close()


def task(app: Rhumbatron, change: str, task_id: str, status: str, agent: str | None = None) -> None:
    shard = app.resource_shard(PROJECT, change_resource_key(change))
    if status in ("assigned", "running"):
        shard.apply(SYSTEM, RecordTaskStatus(change_id=change, task_id=task_id, status="ready"))
    shard.apply(
        SYSTEM, RecordTaskStatus(change_id=change, task_id=task_id, status=status, agent_id=agent)
    )


def test_active_agents_carry_their_intents_and_claims_across_shards(app: Rhumbatron) -> None:
    # GIVEN agent a1 holding t1 with an intent on src/ and a claim on docs/readme.md
    task(app, "c1", "t1", "assigned", agent="a1")
    task(app, "c1", "t2", "ready")
    app.resource_shard(PROJECT, "src/").apply(
        SYSTEM, DeclareIntent(intent_id="i1", agent_id="a1", paths=("src/auth/",))
    )
    app.resource_shard(PROJECT, "docs/readme.md").apply(
        SYSTEM, AcquireClaim(resource="docs/readme.md", agent_id="a1", ttl=timedelta(minutes=5))
    )
    # WHEN the world is asked
    (agent,) = ShardWorld(app.actors).active_agents(PROJECT)
    # THEN the holder of t1 is active, with both resources; the ready t2 has nobody
    assert (agent.agent_id, agent.change_id, agent.task_id) == ("a1", "c1", "t1")
    assert sorted(agent.resources) == ["docs/readme.md", "src/auth/"]


def test_ready_tasks_and_the_8_agent_limit_are_per_change(app: Rhumbatron) -> None:
    for n in range(8):
        task(app, "busy", f"b{n}", "running", agent=f"agent-{n}")
    task(app, "busy", "b-waiting", "ready")
    task(app, "calm", "k1", "running", agent="agent-k")
    task(app, "calm", "k2", "ready")
    world = ShardWorld(app.actors)
    assert world.has_ready_tasks(PROJECT, "busy")
    assert world.waits_at_agent_limit(PROJECT, "busy")
    assert world.has_ready_tasks(PROJECT, "calm")
    assert not world.waits_at_agent_limit(PROJECT, "calm")
    # a Change nobody wrote yet has nothing ready, and asking creates no actor file
    files = sorted((app.settings.state_dir / "projects" / PROJECT).glob("*.sqlite"))
    assert not world.has_ready_tasks(PROJECT, "never-written")
    assert not world.waits_at_agent_limit(PROJECT, "never-written")
    assert sorted((app.settings.state_dir / "projects" / PROJECT).glob("*.sqlite")) == files


def test_an_active_agent_with_no_intent_or_claim_is_active_on_nothing(app: Rhumbatron) -> None:
    # GIVEN an agent running a Task that declared no intent and holds no claim
    task(app, "c1", "t1", "running", agent="quiet")
    # WHEN the world is asked
    (agent,) = ShardWorld(app.actors).active_agents(PROJECT)
    # THEN it is active, on no resource: no resource fact can overlap it
    assert (agent.agent_id, agent.task_id, agent.resources) == ("quiet", "t1", ())


@pytest.mark.parametrize(
    ("running", "ready", "waits"),
    [
        (7, 1, True),  # with the agent just freed, the Change was at 8: a ready Task waited
        (6, 1, False),  # the freed agent made 7: the dispatcher had a slot all along
        (8, 0, False),  # at the limit, but nothing is ready to wait
    ],
)
def test_a_ready_task_waits_only_when_the_freed_agent_made_eight(
    app: Rhumbatron, running: int, ready: int, waits: bool
) -> None:
    # GIVEN a Change with `running` agents at work (the freed one already gone) and `ready` Tasks
    for n in range(running):
        task(app, "c1", f"r{n}", "running", agent=f"agent-{n}")
    for n in range(ready):
        task(app, "c1", f"w{n}", "ready")
    # THEN a ready Task waited at the 8-agent limit exactly when running + 1 reaches 8
    assert ShardWorld(app.actors).waits_at_agent_limit(PROJECT, "c1") is waits
