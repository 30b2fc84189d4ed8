"""Decisions a ResourceShard takes from its own state, each in one transaction: an agent's
admission to a Task (spec: at most 8 agents active per Change) — which Tasks count toward a
Change's limit, and what a wake naming no Task of its Change gets — and the composition of a
Candidate, refused for a Change the shard does not know."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.shard_commands import AdmitAgent, ComposeCandidate
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.agents import Admission
from rhumbatron.domain.changes import TaskPlan
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.tasks import TaskStatus
from rhumbatron.errors import DomainError
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

from .test_known_gap_emitters import create

PROJECT = "acme-web"
CALLER = Caller("acme", "system:test", correlation_id="corr-admission")


@pytest.fixture
def app(offline_settings: Settings, clock: ManualClock) -> Iterator[Rhumbatron]:
    runtime = bootstrap(offline_settings, clock=clock, alarms=RecordingAlarmSink())
    runtime.project_root(PROJECT).create_project(CALLER, name="Storefront")
    yield runtime
    for ref in list(runtime.actor_refs()):
        runtime.actor(ref).close()


def change_with_tasks(app: Rhumbatron, change_id: str, count: int) -> ResourceShard:
    plans = [TaskPlan(f"{change_id}-t{n}", "schema", f"builder-{n}") for n in range(count)]
    return create(app, plans, change_id=change_id)


def admit(shard: ResourceShard, change_id: str, task: str, agent: str, limit: int) -> Admission:
    result = shard.apply(
        CALLER, AdmitAgent(change_id=change_id, task_id=task, agent_id=agent, limit=limit)
    )
    assert isinstance(result, Admission)
    return result


def ready_task_ids(shard: ResourceShard, change_id: str) -> list[str]:
    return [t.task_id for t in shard.tasks_of_change(change_id) if t.status is TaskStatus.READY]


def test_a_change_at_its_limit_admits_no_more_agents_and_other_changes_do_not_count(
    app: Rhumbatron,
) -> None:
    # GIVEN two Changes on one shard (chg-a and chg-1 hash to the same one), three ready Tasks each
    shard = change_with_tasks(app, "chg-a", 3)
    assert change_with_tasks(app, "chg-1", 3).ref == shard.ref
    first, second, third = ready_task_ids(shard, "chg-a")
    other = ready_task_ids(shard, "chg-1")

    # WHEN the limit is 2 and chg-1 fills its own two slots first
    assert admit(shard, "chg-1", other[0], "builder-10", limit=2) is Admission.ADMITTED
    assert admit(shard, "chg-1", other[1], "builder-11", limit=2) is Admission.ADMITTED

    # THEN chg-a still admits two agents (chg-1's active Tasks are not chg-a's), and not a third
    assert admit(shard, "chg-a", first, "builder-0", limit=2) is Admission.ADMITTED
    assert admit(shard, "chg-a", second, "builder-1", limit=2) is Admission.ADMITTED
    assert admit(shard, "chg-a", third, "builder-2", limit=2) is Admission.AT_LIMIT
    assert ready_task_ids(shard, "chg-a") == [third]


def test_a_wake_naming_an_unknown_task_or_another_changes_task_is_not_ready(
    app: Rhumbatron,
) -> None:
    shard = change_with_tasks(app, "chg-a", 1)
    change_with_tasks(app, "chg-1", 1)
    (theirs,) = ready_task_ids(shard, "chg-1")

    # an unknown Task
    assert admit(shard, "chg-a", "no-such-task", "builder-0", limit=8) is Admission.NOT_READY
    # chg-1's ready Task, named by a wake of chg-a: no Task of that wake, and left ready
    assert admit(shard, "chg-a", theirs, "builder-0", limit=8) is Admission.NOT_READY
    assert ready_task_ids(shard, "chg-1") == [theirs]


def test_a_candidate_of_a_change_the_shard_does_not_know_is_refused_naming_it(
    app: Rhumbatron,
) -> None:
    shard = change_with_tasks(app, "chg-a", 1)
    with pytest.raises(
        DomainError,
        match=r"^change 'chg-z' is unknown; a candidate is composed only while it is verifying$",
    ):
        shard.apply(CALLER, ComposeCandidate(change_id="chg-z", base_generation=0))
    assert shard.candidates() == []
