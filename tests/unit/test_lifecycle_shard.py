"""The Change lifecycle through a real ResourceShard on a temporary actor file (no NATS):
every step writes its state and its facts in one transaction, the facts land in the outbox
with stable IDs, and a repeated step adds nothing."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pytest

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import (
    AdmitAgent,
    BlockTaskForDeadLetter,
    CompleteTask,
    ComposeCandidate,
    CreateChange,
    DecideCandidate,
    FinishRelease,
    MoveChange,
    ProposeChangeset,
    RecordPromotion,
    RetryBlockedTask,
    StartRelease,
    StartTask,
)
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.agents import Admission
from rhumbatron.domain.candidates import CandidateStatus, candidate_id_for
from rhumbatron.domain.changes import ChangeStatus, TaskPlan
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.tasks import DEAD_LETTER_LIMIT, WORK_GRAPH_COMPLETED, TaskStatus
from rhumbatron.errors import DomainError
from rhumbatron.lifecycle.requests import qualified_task_id
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import stable_event_id

PROJECT = "acme-web"
CHANGE = "chg-1"
AGENT = "builder-1"
CALLER = Caller("acme", "system:test", correlation_id="corr-shard")

DIAMOND = (
    TaskPlan("tsk-a", "schema", AGENT),
    TaskPlan("tsk-b", "checkout", AGENT, depends_on=("tsk-a",)),
    TaskPlan("tsk-c", "payments", AGENT, depends_on=("tsk-a",)),
    TaskPlan("tsk-d", "docs", AGENT, depends_on=("tsk-b", "tsk-c")),
)


@pytest.fixture
def shard(offline_settings: Settings, clock: ManualClock) -> Iterator[ResourceShard]:
    """The shard that owns ``change:chg-1``, on this test's temporary state directory."""
    ref = ResourceShard.ref_for(PROJECT, change_resource_key(CHANGE), 16)
    actor = ResourceShard(ref, offline_settings, clock=clock)
    yield actor
    actor.close()


def outbox(shard: ResourceShard) -> list[Event]:
    rows: list[sqlite3.Row] = list(shard.connection.execute("SELECT * FROM outbox ORDER BY seq"))
    return [Event.parse(bytes(row["envelope"])) for row in rows]


def outbox_types(shard: ResourceShard) -> list[str]:
    return [e.event_type for e in outbox(shard)]


def create(
    shard: ResourceShard,
    *,
    change_id: str = CHANGE,
    tasks: Sequence[TaskPlan] = DIAMOND,
    client_request_id: str = "req-1",
) -> int:
    return shard.apply(
        CALLER,
        CreateChange(
            change_id=change_id,
            title="Gift cards",
            client_request_id=client_request_id,
            requested_by="user:ann",
            tasks=tasks,
        ),
    ).events_added


def work(
    shard: ResourceShard, task_id: str, *, change_id: str = CHANGE, propose: bool = False
) -> int:
    """Admit, start and complete ``task_id`` (proposing ``cs-<task>`` first when asked); the
    events the completion added."""
    admitted = shard.apply(CALLER, AdmitAgent(change_id=change_id, task_id=task_id, agent_id=AGENT))
    assert admitted is Admission.ADMITTED
    shard.apply(CALLER, StartTask(task_id=task_id, agent_id=AGENT))
    changeset_id = None
    if propose:
        changeset_id = f"cs-{task_id}"
        shard.apply(
            CALLER,
            ProposeChangeset(
                changeset_id=changeset_id,
                task_id=task_id,
                agent_id=AGENT,
                files={f"src/{task_id}.py": "print('hi')"},
                base_generation=0,
            ),
        )
    return shard.apply(
        CALLER,
        CompleteTask(
            change_id=change_id, task_id=task_id, agent_id=AGENT, changeset_id=changeset_id
        ),
    ).events_added


def verifying(shard: ResourceShard, change_id: str = CHANGE) -> None:
    """A Change of two independent Tasks, both completed with a changeset: it is verifying."""
    plans = [TaskPlan(f"{change_id}-t1", "one", AGENT), TaskPlan(f"{change_id}-t2", "two", AGENT)]
    create(shard, change_id=change_id, tasks=plans, client_request_id=f"req-{change_id}")
    for plan in plans:
        work(shard, plan.task_id, change_id=change_id, propose=True)


def task_status(shard: ResourceShard, task_id: str) -> TaskStatus:
    state = shard.task_state(task_id)
    assert state is not None
    return state.status


def candidate_status(shard: ResourceShard, candidate_id: str) -> CandidateStatus:
    state = shard.candidate(candidate_id)
    assert state is not None
    return state.status


def status(shard: ResourceShard, change_id: str = CHANGE) -> str:
    state = shard.change_state(change_id)
    assert state is not None
    return state.status


# ============================================================================ creation


def test_creating_a_change_lands_its_facts_in_the_outbox_with_stable_ids(
    shard: ResourceShard,
) -> None:
    # WHEN the diamond Change is created
    added = create(shard)
    # THEN its three facts are in the outbox with the IDs stable_event_id gives
    assert added == 3
    assert [e.event_id for e in outbox(shard)] == [
        stable_event_id(CHANGE, "change.created"),
        stable_event_id(CHANGE, "change.planned"),
        stable_event_id(CHANGE, "task.ready", "tsk-a", "planned"),
    ]
    # AND the Change is open with its root ready and the rest planned
    assert status(shard) == "open"
    assert {t.task_id: t.status for t in shard.tasks_of_change(CHANGE)} == {
        "tsk-a": TaskStatus.READY,
        "tsk-b": TaskStatus.PLANNED,
        "tsk-c": TaskStatus.PLANNED,
        "tsk-d": TaskStatus.PLANNED,
    }


def test_creating_the_change_again_adds_nothing(shard: ResourceShard, clock: ManualClock) -> None:
    create(shard)
    clock.advance(minutes=5)
    assert create(shard) == 0
    assert len(outbox(shard)) == 3


def test_the_same_change_for_another_request_is_refused_and_writes_nothing(
    shard: ResourceShard,
) -> None:
    create(shard)
    with pytest.raises(DomainError, match="not 'req-2'"):
        create(shard, client_request_id="req-2")
    assert len(outbox(shard)) == 3


def test_a_refused_work_graph_writes_neither_rows_nor_facts(shard: ResourceShard) -> None:
    cycle = (TaskPlan("a", "a", AGENT, ("b",)), TaskPlan("b", "b", AGENT, ("a",)))
    with pytest.raises(DomainError, match="cycle"):
        create(shard, tasks=cycle)
    assert shard.change_state(CHANGE) is None
    assert shard.tasks_of_change(CHANGE) == []
    assert outbox(shard) == []


# ============================================================================ moves


def test_a_move_lands_once_for_its_key(shard: ResourceShard) -> None:
    # GIVEN an open Change
    create(shard)
    # WHEN it is cancelled twice with the same key
    first = shard.apply(CALLER, MoveChange(change_id=CHANGE, to="cancelled", reason="no", key="k"))
    again = shard.apply(CALLER, MoveChange(change_id=CHANGE, to="cancelled", reason="no", key="k"))
    # THEN change.cancelled is in the outbox once, with the stable ID of the move and key
    assert (first.events_added, again.events_added) == (1, 0)
    assert outbox(shard)[-1].event_id == stable_event_id(
        CHANGE, "change.cancelled", None, "open->cancelled:k"
    )
    assert status(shard) == "cancelled"


def test_an_illegal_move_writes_nothing(shard: ResourceShard) -> None:
    create(shard)
    with pytest.raises(DomainError, match="it can become: cancelled, failed, verifying"):
        shard.apply(CALLER, MoveChange(change_id=CHANGE, to=ChangeStatus.RELEASING))
    assert status(shard) == "open"
    assert len(outbox(shard)) == 3


# ============================================================================ the work graph


def test_working_the_diamond_readies_dependents_then_verifies_once(shard: ResourceShard) -> None:
    # GIVEN the diamond Change
    create(shard)
    # WHEN a completes: b and c become ready, d waits
    work(shard, "tsk-a")
    assert task_status(shard, "tsk-b") is TaskStatus.READY
    assert task_status(shard, "tsk-d") is TaskStatus.PLANNED
    # WHEN b completes: d still waits for c
    work(shard, "tsk-b")
    assert task_status(shard, "tsk-d") is TaskStatus.PLANNED
    # WHEN c completes: d is ready; the Change is still open
    work(shard, "tsk-c")
    assert task_status(shard, "tsk-d") is TaskStatus.READY
    assert status(shard) == "open"
    # WHEN d, the last Task, completes
    added = work(shard, "tsk-d")
    # THEN the Change is verifying, with verification.started recorded once
    assert added == 3  # task.completed, change.status_changed, verification.started
    assert status(shard) == "verifying"
    started = [e for e in outbox(shard) if e.event_type == "verification.started"]
    assert [e.event_id for e in started] == [
        stable_event_id(CHANGE, "verification.started", None, WORK_GRAPH_COMPLETED)
    ]
    # AND every Task's ready fact was recorded once, in dependency order
    ready = [e.task_id for e in outbox(shard) if e.event_type == "task.ready"]
    assert ready == ["tsk-a", "tsk-b", "tsk-c", "tsk-d"]


def test_reporting_the_last_completion_again_adds_nothing(shard: ResourceShard) -> None:
    create(shard, tasks=DIAMOND[:1])
    work(shard, "tsk-a")
    before = len(outbox(shard))
    again = shard.apply(
        CALLER, CompleteTask(change_id=CHANGE, task_id="tsk-a", agent_id=AGENT, changeset_id=None)
    )
    assert again.events_added == 0
    assert len(outbox(shard)) == before


def test_another_agent_cannot_complete_and_writes_nothing(shard: ResourceShard) -> None:
    # GIVEN tsk-a running under builder-1
    create(shard)
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="tsk-a", agent_id=AGENT))
    shard.apply(CALLER, StartTask(task_id="tsk-a", agent_id=AGENT))
    before = len(outbox(shard))
    # WHEN builder-2 reports it completed
    with pytest.raises(DomainError, match="agent 'builder-2' does not hold task 'tsk-a'"):
        shard.apply(
            CALLER,
            CompleteTask(
                change_id=CHANGE, task_id="tsk-a", agent_id="builder-2", changeset_id=None
            ),
        )
    # THEN the Task still runs and no fact was written
    assert task_status(shard, "tsk-a") is TaskStatus.RUNNING
    assert len(outbox(shard)) == before


def wake(task_id: str, attempt: int = 1) -> Command:
    return Command.create(
        command_id=f"cmd_{task_id}_ready",
        command_type="agent.wake",
        project_id=PROJECT,
        change_id=CHANGE,
        task_id=task_id,
        attempt=attempt,
        created_at=ManualClock().now(),
        payload={"agentId": AGENT, "reason": "task_ready"},
    )


def test_a_retry_readies_a_dead_lettered_task_once(shard: ResourceShard) -> None:
    # GIVEN tsk-a assigned, then blocked by the dead letter of its wake
    create(shard)
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id="tsk-a", agent_id=AGENT))
    shard.apply(CALLER, BlockTaskForDeadLetter(command=wake("tsk-a"), reason="wake died"))
    blocked = shard.task_state("tsk-a")
    assert blocked is not None and blocked.blocked_limit == DEAD_LETTER_LIMIT
    # WHEN an operator retries it (attempt 2), twice
    first = shard.apply(CALLER, RetryBlockedTask(task_id="tsk-a", attempt=2))
    again = shard.apply(CALLER, RetryBlockedTask(task_id="tsk-a", attempt=2))
    # THEN it is ready, unassigned, with one task.ready keyed retry:2
    assert (first.events_added, again.events_added) == (1, 0)
    ready = shard.task_state("tsk-a")
    assert ready is not None and (ready.status, ready.agent_id) == (TaskStatus.READY, None)
    assert outbox(shard)[-1].event_id == stable_event_id(CHANGE, "task.ready", "tsk-a", "retry:2")


def test_re_admitting_the_agent_after_a_retry_records_a_new_assignment(
    shard: ResourceShard,
) -> None:
    # GIVEN tsk-a assigned, blocked by its wake's dead letter, then retried
    create(shard)
    first_wake = replace(CALLER, correlation_id="cmd_tsk-a_ready:1")
    shard.apply(first_wake, AdmitAgent(change_id=CHANGE, task_id="tsk-a", agent_id=AGENT))
    shard.apply(CALLER, BlockTaskForDeadLetter(command=wake("tsk-a"), reason="wake died"))
    shard.apply(CALLER, RetryBlockedTask(task_id="tsk-a", attempt=2))
    # WHEN the resent wake (attempt 2) admits the same agent
    retried_wake = replace(CALLER, correlation_id="cmd_tsk-a_ready:2")
    admitted = shard.apply(
        retried_wake, AdmitAgent(change_id=CHANGE, task_id="tsk-a", agent_id=AGENT)
    )
    # THEN the Task is assigned again, and the event log says so a second time
    assert admitted is Admission.ADMITTED
    assert outbox_types(shard).count("task.assigned") == 2


def test_two_changes_in_one_shard_can_use_the_same_task_names_once_qualified(
    shard: ResourceShard,
) -> None:
    # GIVEN two requests that both name a task "tsk-a" (ChangeRequests qualifies task IDs)
    for change_id, request in ((CHANGE, "req-1"), ("chg-2", "req-2")):
        plan = TaskPlan(qualified_task_id(change_id, "tsk-a"), "schema", AGENT)
        # WHEN each Change is created in the same shard
        added = create(shard, change_id=change_id, tasks=[plan], client_request_id=request)
        # THEN both are (change.created, change.planned, task.ready)
        assert added == 3
    assert qualified_task_id("chg-2", "tsk-a") == "chg-2.tsk-a"
    assert qualified_task_id("chg-2", "chg-2.tsk-a") == "chg-2.tsk-a"


# ============================================================================ Candidates


def test_composing_twice_is_one_candidate_keyed_by_its_changesets(shard: ResourceShard) -> None:
    # GIVEN a verifying Change whose two Tasks proposed cs-chg-1-t1 and cs-chg-1-t2
    verifying(shard)
    assert status(shard) == "verifying"
    before = len(outbox(shard))
    # WHEN its work is composed on base 0, twice
    first = shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=0))
    again = shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=0))
    # THEN it is one Candidate whose ID derives from SHA-256("0␟cs-chg-1-t1␟cs-chg-1-t2")
    key = hashlib.sha256(b"0\x1fcs-chg-1-t1\x1fcs-chg-1-t2").hexdigest()
    assert first == again
    assert (first.candidate_id, first.composition_key) == (candidate_id_for(key), key)
    assert first.paths == ("src/chg-1-t1.py", "src/chg-1-t2.py")
    # AND candidate.created is in the outbox once
    assert outbox_types(shard)[before:] == ["candidate.created"]


def test_another_base_composes_another_candidate(shard: ResourceShard) -> None:
    verifying(shard)
    first = shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=0))
    second = shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=1))
    assert first.candidate_id != second.candidate_id
    assert len(shard.candidates(change_id=CHANGE)) == 2


def test_an_open_change_cannot_compose(shard: ResourceShard) -> None:
    create(shard)
    with pytest.raises(DomainError, match="is open; a candidate is composed only"):
        shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=0))
    assert shard.candidates() == []


def test_a_change_without_changesets_has_nothing_to_compose(
    shard: ResourceShard,
) -> None:
    # GIVEN two verifying Changes whose single Task completed without a changeset
    for change_id in (CHANGE, "chg-2"):
        create(
            shard,
            change_id=change_id,
            tasks=[TaskPlan(f"{change_id}-t", "t", AGENT)],
            client_request_id=f"req-{change_id}",
        )
        work(shard, f"{change_id}-t", change_id=change_id)
    # WHEN each is composed on base 0
    # THEN each is refused (an empty composition would be both Changes' one Candidate)
    for change_id in (CHANGE, "chg-2"):
        with pytest.raises(DomainError, match="nothing to compose"):
            shard.apply(CALLER, ComposeCandidate(change_id=change_id, base_generation=0))
    assert shard.candidates() == []


def test_verifying_a_candidate_moves_its_change_in_the_same_transaction(
    shard: ResourceShard,
) -> None:
    # GIVEN a composed Candidate
    verifying(shard)
    candidate = shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=0))
    before = len(outbox(shard))
    # WHEN it is verified with change_to awaiting_approval, twice
    first, again = (
        shard.apply(
            CALLER,
            DecideCandidate(
                candidate_id=candidate.candidate_id,
                to=CandidateStatus.VERIFIED,
                reason="every check passed",
                change_to=ChangeStatus.AWAITING_APPROVAL,
            ),
        )
        for _ in range(2)
    )
    # THEN both moves and both facts were written once, the move keyed <candidate>:verified
    assert (first.events_added, again.events_added) == (2, 0)
    assert outbox_types(shard)[before:] == ["candidate.verified", "change.status_changed"]
    assert outbox(shard)[-1].event_id == stable_event_id(
        CHANGE,
        "change.status_changed",
        None,
        f"verifying->awaiting_approval:{candidate.candidate_id}:verified",
    )
    assert status(shard) == "awaiting_approval"
    assert candidate_status(shard, candidate.candidate_id) is CandidateStatus.VERIFIED


def test_an_illegal_change_move_rolls_the_candidate_decision_back(shard: ResourceShard) -> None:
    # GIVEN a composed Candidate whose Change was cancelled meanwhile
    verifying(shard)
    candidate = shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=0))
    shard.apply(CALLER, MoveChange(change_id=CHANGE, to=ChangeStatus.CANCELLED))
    before = len(outbox(shard))
    # WHEN verification tries to verify it and move the Change to awaiting_approval
    with pytest.raises(DomainError, match="is cancelled; it cannot become awaiting_approval"):
        shard.apply(
            CALLER,
            DecideCandidate(
                candidate_id=candidate.candidate_id,
                to=CandidateStatus.VERIFIED,
                change_to=ChangeStatus.AWAITING_APPROVAL,
            ),
        )
    # THEN neither the Candidate nor the outbox changed: one transaction
    assert candidate_status(shard, candidate.candidate_id) is CandidateStatus.CREATED
    assert len(outbox(shard)) == before


# ============================================================================ promotion, release


def awaiting(shard: ResourceShard) -> str:
    """A Change awaiting approval with its verified Candidate; the Candidate ID."""
    verifying(shard)
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


def test_a_promotion_moves_the_change_to_releasing_once(shard: ResourceShard) -> None:
    # GIVEN a Change awaiting approval
    candidate_id = awaiting(shard)
    before = len(outbox(shard))
    # WHEN its promotion is recorded twice
    first = shard.apply(
        CALLER, RecordPromotion(change_id=CHANGE, candidate_id=candidate_id, expected_generation=0)
    )
    again = shard.apply(
        CALLER, RecordPromotion(change_id=CHANGE, candidate_id=candidate_id, expected_generation=0)
    )
    # THEN the Change is releasing (promoted_at set) with promotion.completed, once
    assert (first.events_added, again.events_added) == (3, 0)
    assert outbox_types(shard)[before:] == [
        "promotion.requested",
        "change.status_changed",
        "promotion.completed",
    ]
    state = shard.change_state(CHANGE)
    assert state is not None and state.status == "releasing" and state.promoted_at
    assert outbox(shard)[-1].event_id == stable_event_id(
        CHANGE, "promotion.completed", None, candidate_id
    )


def releasing(shard: ResourceShard) -> str:
    candidate_id = awaiting(shard)
    shard.apply(
        CALLER, RecordPromotion(change_id=CHANGE, candidate_id=candidate_id, expected_generation=0)
    )
    return candidate_id


def test_a_release_starts_once_under_rel_project_generation(shard: ResourceShard) -> None:
    candidate_id = releasing(shard)
    first, again = (
        shard.apply(
            CALLER,
            StartRelease(
                change_id=CHANGE, generation=1, candidate_id=candidate_id, app_name="shop"
            ),
        )
        for _ in range(2)
    )
    assert (first.events_added, again.events_added) == (1, 0)
    (release,) = shard.releases(change_id=CHANGE)
    assert (release.release_id, release.status.value) == ("rel_acme-web_1", "started")
    assert outbox(shard)[-1].event_id == stable_event_id(
        CHANGE, "release.started", None, "rel_acme-web_1"
    )


@pytest.mark.parametrize(("outcome", "end"), [("completed", "completed"), ("failed", "failed")])
def test_finishing_the_release_ends_the_change_once(
    shard: ResourceShard, outcome: str, end: str
) -> None:
    # GIVEN a started release
    candidate_id = releasing(shard)
    shard.apply(
        CALLER,
        StartRelease(change_id=CHANGE, generation=1, candidate_id=candidate_id, app_name="shop"),
    )
    before = len(outbox(shard))
    # WHEN it finishes, twice
    first = shard.apply(CALLER, FinishRelease(release_id="rel_acme-web_1", outcome=outcome))
    again = shard.apply(CALLER, FinishRelease(release_id="rel_acme-web_1", outcome=outcome))
    # THEN release.<outcome> and change.<end> are written together, once
    assert (first.events_added, again.events_added) == (2, 0)
    assert outbox_types(shard)[before:] == [f"release.{outcome}", f"change.{end}"]
    assert status(shard) == end


def test_a_completed_release_cannot_fail_afterwards(shard: ResourceShard) -> None:
    candidate_id = releasing(shard)
    shard.apply(
        CALLER,
        StartRelease(change_id=CHANGE, generation=1, candidate_id=candidate_id, app_name="shop"),
    )
    shard.apply(CALLER, FinishRelease(release_id="rel_acme-web_1", outcome="completed"))
    with pytest.raises(DomainError, match="already completed"):
        shard.apply(CALLER, FinishRelease(release_id="rel_acme-web_1", outcome="failed"))
    assert status(shard) == "completed"


def test_finishing_a_release_never_started_is_refused(shard: ResourceShard) -> None:
    with pytest.raises(DomainError, match="no release 'rel_acme-web_9'; start it first"):
        shard.apply(CALLER, FinishRelease(release_id="rel_acme-web_9", outcome="completed"))
