"""The Change lifecycle's aggregates as pure transitions: the Change state machine, its work
graph, Tasks, Candidates, releases, changesets, the project's administration, and the
scripted agent's scripts. No actor file, no NATS: each test calls a domain function and reads
the (patch, facts) it returns."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from rhumbatron.domain.candidates import (
    CANDIDATE_MOVES,
    CandidateState,
    CandidateStatus,
    candidate_id_for,
    composition_key,
    create_candidate,
    decide_candidate,
)
from rhumbatron.domain.changes import (
    CHANGE_MOVES,
    MAX_TASKS_PER_CHANGE,
    TERMINAL_STATUSES,
    ChangeState,
    ChangeStatus,
    TaskPlan,
    create_change,
    move_change,
)
from rhumbatron.domain.changesets import (
    MAX_CHANGESET_BYTES,
    Changeset,
    propose_changeset,
    shared_resource,
)
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import (
    ProjectState,
    create_project,
    promote_candidate,
    provision_app,
    remove_app,
    set_project_status,
)
from rhumbatron.domain.releases import (
    ReleaseState,
    ReleaseStatus,
    finish_release,
    release_id_for,
    start_release,
)
from rhumbatron.domain.tasks import (
    DEAD_LETTER_LIMIT,
    WORK_GRAPH_COMPLETED,
    TaskState,
    TaskStatus,
    complete_task,
    fail_task,
    retry_blocked_task,
    start_task,
)
from rhumbatron.domain.transition import Insert, Transition, Update, Upsert
from rhumbatron.errors import DomainError
from rhumbatron.lifecycle.scripted_agent import ScriptLibrary, _parts
from rhumbatron.protocol.ids import stable_event_id

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
PROJECT = "acme-web"
CHANGE = "chg-1"
AGENT = "builder-1"
CTX = FactContext(Caller("acme", "system:test", correlation_id="corr-life"), PROJECT, NOW)

S = ChangeStatus
LEGAL_MOVES = sorted((src, dst) for src, targets in CHANGE_MOVES.items() for dst in targets)


def change(status: ChangeStatus | str, **fields: Any) -> ChangeState:
    return ChangeState(change_id=CHANGE, status=str(status), client_request_id="req-1", **fields)


def task(task_id: str, status: TaskStatus, **fields: Any) -> TaskState:
    agent = fields.pop(
        "agent_id", AGENT if status in (TaskStatus.ASSIGNED, TaskStatus.RUNNING) else None
    )
    return TaskState(task_id=task_id, change_id=CHANGE, status=status, agent_id=agent, **fields)


def rows(transition: Transition, table: str) -> dict[str, Mapping[str, Any]]:
    """The rows a transition inserts or upserts into ``table``, by their first column."""
    found: dict[str, Mapping[str, Any]] = {}
    for mutation in transition.patch:
        if isinstance(mutation, Insert | Upsert) and mutation.table == table:
            found[str(next(iter(mutation.row.values())))] = mutation.row
    return found


def types(transition: Transition) -> list[str]:
    return [f.event_type for f in transition.facts]


def payload(transition: Transition, index: int = 0) -> dict[str, Any]:
    return transition.facts[index].payload.model_dump()


# ============================================================================ Change moves


@pytest.mark.parametrize(("source", "target"), LEGAL_MOVES)
def test_every_legal_move_updates_the_change_with_its_fact(
    source: ChangeStatus, target: ChangeStatus
) -> None:
    # GIVEN a Change in ``source``
    # WHEN it moves to a state CHANGE_MOVES allows
    moved = move_change(change(source), CTX, to=target, reason="why", key="k1")
    # THEN its row gets the new status, and the fact is change.<terminal> or status_changed
    (update,) = moved.patch
    assert isinstance(update, Update)
    assert (update.table, dict(update.key)) == ("changes", {"change_id": CHANGE})
    assert update.values["status"] == target.value
    (fact,) = moved.facts
    assert fact.change_id == CHANGE
    if target.value in TERMINAL_STATUSES:
        assert fact.event_type == f"change.{target.value}"
        assert fact.payload.model_dump() == {"reason": "why"}
    else:
        assert fact.event_type == "change.status_changed"
        assert fact.payload.model_dump() == {
            "from_status": source.value,
            "to_status": target.value,
            "reason": "why",
        }


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (S.OPEN, S.AWAITING_APPROVAL),
        (S.OPEN, S.RELEASING),
        (S.OPEN, S.COMPLETED),
        (S.VERIFYING, S.OPEN),
        (S.VERIFYING, S.RELEASING),
        (S.AWAITING_APPROVAL, S.OPEN),
        (S.AWAITING_APPROVAL, S.COMPLETED),
        (S.RELEASING, S.CANCELLED),
        (S.RELEASING, S.VERIFYING),
    ],
)
def test_an_illegal_move_is_refused_naming_the_legal_ones(
    source: ChangeStatus, target: ChangeStatus
) -> None:
    # GIVEN a Change in ``source``
    # WHEN it is asked to move where CHANGE_MOVES does not go
    with pytest.raises(DomainError) as refused:
        move_change(change(source), CTX, to=target)
    # THEN the error names the Change, the bad move, and every legal target
    message = str(refused.value)
    assert f"change '{CHANGE}' is {source.value}; it cannot become {target.value}" in message
    legal = ", ".join(sorted(s.value for s in CHANGE_MOVES[source]))
    assert f"it can become: {legal})" in message


@pytest.mark.parametrize(
    ("terminal", "target"),
    [
        (terminal, target)
        for terminal in sorted(TERMINAL_STATUSES)
        for target in (S.OPEN, S.VERIFYING, S.RELEASING, S.FAILED, S.COMPLETED)
        if terminal != target.value
    ],
)
def test_a_terminal_change_never_moves(terminal: str, target: ChangeStatus) -> None:
    # GIVEN an ended Change
    # WHEN anything tries to move it
    # THEN it is refused: from an ended Change no move is legal
    with pytest.raises(DomainError, match=r"none \(it has ended\)"):
        move_change(change(terminal), CTX, to=target)


@pytest.mark.parametrize("status", list(ChangeStatus))
def test_moving_to_the_state_a_change_has_changes_nothing(status: ChangeStatus) -> None:
    # GIVEN a Change in ``status`` (terminal or not)
    # WHEN it is moved to that same state
    # THEN nothing is written and no fact recorded
    assert move_change(change(status), CTX, to=status) == Transition()


def test_the_terminal_states_are_exactly_those_with_no_move() -> None:
    # GIVEN the state machine
    # THEN every state either moves somewhere or is terminal, never both
    assert set(CHANGE_MOVES) | {ChangeStatus(s) for s in TERMINAL_STATUSES} == set(ChangeStatus)
    assert not set(CHANGE_MOVES) & {ChangeStatus(s) for s in TERMINAL_STATUSES}


def test_moving_a_change_that_does_not_exist_is_refused() -> None:
    with pytest.raises(DomainError, match="create it first"):
        move_change(None, CTX, to=S.VERIFYING)


def test_the_move_fact_id_is_stable_for_one_key_and_differs_for_another() -> None:
    # GIVEN an open Change moved to verifying twice with key k1, once with k2
    first = move_change(change(S.OPEN), CTX, to=S.VERIFYING, key="k1")
    later = FactContext(CTX.caller, PROJECT, NOW.replace(hour=11))
    again = move_change(change(S.OPEN), later, to=S.VERIFYING, key="k1")
    other = move_change(change(S.OPEN), CTX, to=S.VERIFYING, key="k2")
    # THEN the same key gives the same ID at any time: sha256 "chg-1␟change.status_changed␟␟
    # open->verifying:k1" computed with sha256sum
    assert first.facts[0].event_id == again.facts[0].event_id
    assert first.facts[0].event_id == "evt_83e049d11330ab3452f9784153426c2e"
    assert other.facts[0].event_id != first.facts[0].event_id


def test_the_move_key_defaults_to_the_callers_correlation_id() -> None:
    # GIVEN no key
    moved = move_change(change(S.VERIFYING), CTX, to=S.FAILED)
    # THEN the key is the move plus the correlation ID of the caller
    assert moved.facts[0].event_id == stable_event_id(
        CHANGE, "change.failed", None, "verifying->failed:corr-life"
    )


def test_releasing_stamps_promoted_at_and_a_blank_reason_keeps_the_old_one() -> None:
    # WHEN an awaiting Change moves to releasing without a reason
    moved = move_change(change(S.AWAITING_APPROVAL, reason="kept"), CTX, to=S.RELEASING)
    # THEN promoted_at is now and reason is not overwritten
    (update,) = moved.patch
    assert isinstance(update, Update)
    assert update.values == {
        "status": "releasing",
        "updated_at": NOW.isoformat(),
        "promoted_at": NOW.isoformat(),
    }


def test_an_unknown_target_status_is_a_domain_error_naming_the_states() -> None:
    with pytest.raises(DomainError, match=r"bogus.*awaiting_approval"):
        move_change(change(S.OPEN), CTX, to="bogus")


# ============================================================================ create_change

DIAMOND = (
    TaskPlan("tsk-a", "schema", "builder-a"),
    TaskPlan("tsk-b", "checkout", "builder-a", depends_on=("tsk-a",)),
    TaskPlan("tsk-c", "payments", "builder-b", depends_on=("tsk-a",), script="payments"),
    TaskPlan("tsk-d", "docs", "builder-b", depends_on=("tsk-b", "tsk-c")),
)


def create(
    current: ChangeState | None = None,
    tasks: Sequence[TaskPlan] = DIAMOND,
    client_request_id: str = "req-1",
) -> Transition:
    return create_change(
        current,
        CTX,
        change_id=CHANGE,
        title="Gift cards",
        client_request_id=client_request_id,
        requested_by="user:ann",
        tasks=tasks,
    )


def test_creating_a_change_readies_its_roots_and_plans_the_rest() -> None:
    # WHEN a Change is created with a diamond work graph
    created = create()
    # THEN the Change is open, the root is ready and every other Task planned
    (change_row,) = rows(created, "changes").values()
    assert (change_row["status"], change_row["client_request_id"]) == ("open", "req-1")
    tasks = rows(created, "tasks")
    assert {t: r["status"] for t, r in tasks.items()} == {
        "tsk-a": "ready",
        "tsk-b": "planned",
        "tsk-c": "planned",
        "tsk-d": "planned",
    }
    assert json.loads(tasks["tsk-d"]["depends_on"]) == ["tsk-b", "tsk-c"]
    assert (tasks["tsk-c"]["planned_agent"], tasks["tsk-c"]["script"]) == ("builder-b", "payments")
    # AND the facts are change.created, change.planned, and task.ready for the root only
    assert types(created) == ["change.created", "change.planned", "task.ready"]
    assert payload(created, 1) == {"task_ids": ("tsk-a", "tsk-b", "tsk-c", "tsk-d")}
    ready = created.facts[2]
    assert ready.task_id == "tsk-a"
    assert ready.event_id == stable_event_id(CHANGE, "task.ready", "tsk-a", "planned")
    assert created.facts[0].event_id == stable_event_id(CHANGE, "change.created")


def test_every_task_without_dependencies_is_ready() -> None:
    created = create(tasks=[TaskPlan("t1", "a", "x"), TaskPlan("t2", "b", "x")])
    assert [f.task_id for f in created.facts if f.event_type == "task.ready"] == ["t1", "t2"]


def test_creating_again_for_the_same_client_request_changes_nothing() -> None:
    # GIVEN the Change exists for req-1
    # WHEN it is created again for req-1 (even with another plan)
    # THEN nothing is written
    assert create(change(S.VERIFYING), tasks=DIAMOND[:1]) == Transition()


def test_creating_the_same_change_for_another_client_request_is_refused() -> None:
    with pytest.raises(DomainError, match="'req-1', not 'req-2'"):
        create(change(S.OPEN), client_request_id="req-2")


@pytest.mark.parametrize(
    ("tasks", "complaint"),
    [
        pytest.param((), "at least one task", id="empty"),
        pytest.param(
            (TaskPlan("a", "a", "x", ("b",)), TaskPlan("b", "b", "x", ("a",))),
            r"\['a', 'b'\] .* cycle",
            id="cycle",
        ),
        pytest.param(
            (
                TaskPlan("a", "a", "x"),
                TaskPlan("b", "b", "x", ("a", "d")),
                TaskPlan("c", "c", "x", ("b",)),
                TaskPlan("d", "d", "x", ("c",)),
            ),
            r"\['b', 'c', 'd'\] .* cycle",
            id="cycle-behind-a-root",
        ),
        pytest.param(
            (TaskPlan("a", "a", "x", ("ghost",)),),
            r"task 'a' depends on \['ghost'\], which are not tasks",
            id="unknown-dependency",
        ),
        pytest.param(
            (TaskPlan("a", "a", "x", ("a",)),), "task 'a' depends on itself", id="self-dependency"
        ),
        pytest.param(
            (TaskPlan("a", "a", "x"), TaskPlan("a", "again", "y")),
            r"names tasks twice: \['a'\]",
            id="duplicate-ids",
        ),
        pytest.param(
            tuple(TaskPlan(f"t{i}", "t", "x") for i in range(MAX_TASKS_PER_CHANGE + 1)),
            f"{MAX_TASKS_PER_CHANGE + 1} tasks; at most {MAX_TASKS_PER_CHANGE}",
            id="too-many",
        ),
    ],
)
def test_a_bad_work_graph_is_refused(tasks: tuple[TaskPlan, ...], complaint: str) -> None:
    # GIVEN a work graph no order can finish (or no graph at all)
    # WHEN the Change is created
    # THEN it is refused, naming what is wrong
    with pytest.raises(DomainError, match=complaint):
        create(tasks=tasks)


def test_a_graph_of_exactly_the_task_limit_is_accepted() -> None:
    chain = [TaskPlan("t0", "t", "x")] + [
        TaskPlan(f"t{i}", "t", "x", (f"t{i - 1}",)) for i in range(1, MAX_TASKS_PER_CHANGE)
    ]
    assert len(rows(create(tasks=chain), "tasks")) == MAX_TASKS_PER_CHANGE


# ============================================================================ Tasks


def diamond(**statuses: TaskStatus) -> list[TaskState]:
    """The diamond's Tasks, planned unless told (``a=TaskStatus.COMPLETED``...)."""
    return [
        task(
            plan.task_id,
            statuses.get(plan.task_id.removeprefix("tsk-"), TaskStatus.PLANNED),
            depends_on=plan.depends_on,
        )
        for plan in DIAMOND
    ]


def complete(
    tasks: list[TaskState], task_id: str, current: ChangeState | None = None
) -> Transition:
    return complete_task(
        tasks,
        current or change(S.OPEN),
        CTX,
        task_id=task_id,
        agent_id=AGENT,
        changeset_id=f"cs-{task_id}",
    )


def ready_ids(transition: Transition) -> list[str | None]:
    return [f.task_id for f in transition.facts if f.event_type == "task.ready"]


def test_completing_the_root_readies_both_of_its_dependents() -> None:
    # GIVEN the diamond with its root running
    # WHEN the root completes
    done = complete(diamond(a=TaskStatus.RUNNING), "tsk-a")
    # THEN task.completed, then b and c become ready (key dependencies_completed); d waits
    assert types(done) == ["task.completed", "task.ready", "task.ready"]
    assert ready_ids(done) == ["tsk-b", "tsk-c"]
    assert done.facts[1].event_id == stable_event_id(
        CHANGE, "task.ready", "tsk-b", "dependencies_completed"
    )
    assert rows(done, "tasks")["tsk-a"]["changeset_id"] == "cs-tsk-a"
    assert payload(done) == {"agent_id": AGENT, "changeset_id": "cs-tsk-a"}


def test_a_task_waits_until_every_dependency_completed() -> None:
    # GIVEN a completed, b running, c still running
    tasks = diamond(a=TaskStatus.COMPLETED, b=TaskStatus.RUNNING, c=TaskStatus.RUNNING)
    # WHEN b completes
    # THEN d stays planned: c has not completed
    assert ready_ids(complete(tasks, "tsk-b")) == []


def test_the_last_dependency_completing_readies_the_join() -> None:
    tasks = diamond(a=TaskStatus.COMPLETED, b=TaskStatus.COMPLETED, c=TaskStatus.RUNNING)
    assert ready_ids(complete(tasks, "tsk-c")) == ["tsk-d"]


def test_the_last_completion_moves_the_change_to_verifying_with_verification_started() -> None:
    # GIVEN every Task completed but d, which runs
    tasks = diamond(
        a=TaskStatus.COMPLETED, b=TaskStatus.COMPLETED, c=TaskStatus.COMPLETED, d=TaskStatus.RUNNING
    )
    # WHEN d completes
    done = complete(tasks, "tsk-d")
    # THEN the Change moves open → verifying, and verification.started (work graph completed)
    # is recorded with the stable key work_graph_completed: a retry cannot record it twice
    assert types(done) == ["task.completed", "change.status_changed", "verification.started"]
    assert payload(done, 1)["to_status"] == "verifying"
    started = done.facts[2]
    assert started.payload.model_dump() == {"reason": WORK_GRAPH_COMPLETED}
    assert started.event_id == stable_event_id(
        CHANGE, "verification.started", None, WORK_GRAPH_COMPLETED
    )
    assert done.facts[1].event_id == stable_event_id(
        CHANGE, "change.status_changed", None, f"open->verifying:{WORK_GRAPH_COMPLETED}"
    )


def test_a_completion_with_work_left_does_not_move_the_change() -> None:
    tasks = diamond(a=TaskStatus.COMPLETED, b=TaskStatus.RUNNING, c=TaskStatus.RUNNING)
    assert not [m for m in complete(tasks, "tsk-b").patch if m.table == "changes"]


def test_a_repeated_completion_by_the_same_agent_changes_nothing() -> None:
    # GIVEN a completed with its changeset
    tasks = diamond(a=TaskStatus.COMPLETED)
    tasks[0] = replace(tasks[0], agent_id=AGENT, changeset_id="cs-tsk-a")
    # WHEN the agent reports it again
    # THEN nothing happens
    assert complete(tasks, "tsk-a") == Transition()


@pytest.mark.parametrize(
    "held",
    [
        pytest.param(task("tsk-a", TaskStatus.RUNNING, agent_id="builder-2"), id="other-agent"),
        pytest.param(task("tsk-a", TaskStatus.READY), id="nobody-holds-it"),
    ],
)
def test_only_the_holding_agent_completes_a_task(held: TaskState) -> None:
    with pytest.raises(DomainError, match=f"agent '{AGENT}' does not hold task 'tsk-a'"):
        complete([held], "tsk-a")


def test_an_unknown_task_cannot_complete() -> None:
    with pytest.raises(DomainError, match="no task 'tsk-x'"):
        complete(diamond(), "tsk-x")


def test_a_task_of_an_ended_change_cannot_complete() -> None:
    with pytest.raises(DomainError, match="is cancelled; its tasks cannot complete"):
        complete(diamond(a=TaskStatus.RUNNING), "tsk-a", change(S.CANCELLED))


def test_the_holding_agent_starts_its_task_once() -> None:
    # GIVEN a Task assigned to the agent
    assigned = task("tsk-a", TaskStatus.ASSIGNED)
    # WHEN it starts
    started = start_task(assigned, CTX, task_id="tsk-a", agent_id=AGENT)
    # THEN it runs with task.started; starting the running Task again is nothing
    assert rows(started, "tasks")["tsk-a"]["status"] == "running"
    assert types(started) == ["task.started"]
    running = task("tsk-a", TaskStatus.RUNNING)
    assert start_task(running, CTX, task_id="tsk-a", agent_id=AGENT) == Transition()


@pytest.mark.parametrize(
    "current",
    [
        pytest.param(task("tsk-a", TaskStatus.ASSIGNED, agent_id="builder-2"), id="other-agent"),
        pytest.param(task("tsk-a", TaskStatus.READY), id="not-admitted"),
        pytest.param(task("tsk-a", TaskStatus.COMPLETED, agent_id=AGENT), id="finished"),
        pytest.param(None, id="missing"),
    ],
)
def test_only_the_holding_agent_starts_a_task(current: TaskState | None) -> None:
    with pytest.raises(DomainError, match="tsk-a"):
        start_task(current, CTX, task_id="tsk-a", agent_id=AGENT)


def test_the_holding_agent_fails_its_task_once() -> None:
    running = task("tsk-a", TaskStatus.RUNNING)
    failed = fail_task(running, CTX, task_id="tsk-a", agent_id=AGENT, reason="tests red")
    assert rows(failed, "tasks")["tsk-a"]["status"] == "failed"
    assert payload(failed) == {"reason": "tests red", "agent_id": AGENT, "blocked_limit": None}
    done = task("tsk-a", TaskStatus.FAILED, agent_id=AGENT)
    assert fail_task(done, CTX, task_id="tsk-a", agent_id=AGENT, reason="again") == Transition()


def test_another_agent_cannot_fail_a_task() -> None:
    running = task("tsk-a", TaskStatus.RUNNING, agent_id="builder-2")
    with pytest.raises(DomainError, match="does not hold"):
        fail_task(running, CTX, task_id="tsk-a", agent_id=AGENT, reason="not mine")


def test_a_failure_needs_a_reason() -> None:
    with pytest.raises(DomainError, match="needs a reason"):
        fail_task(
            task("tsk-a", TaskStatus.RUNNING), CTX, task_id="tsk-a", agent_id=AGENT, reason=" "
        )


def test_a_retry_readies_a_task_its_dead_letter_blocked() -> None:
    # GIVEN a Task blocked by a dead letter while assigned
    blocked = task(
        "tsk-a", TaskStatus.BLOCKED, agent_id=AGENT, blocked_limit=DEAD_LETTER_LIMIT, reason="x"
    )
    # WHEN an operator retries (attempt 3)
    retried = retry_blocked_task(blocked, CTX, attempt=3)
    # THEN it is ready again, unassigned, the limit cleared, with task.ready keyed retry:3
    row = rows(retried, "tasks")["tsk-a"]
    assert (row["status"], row["agent_id"], row["blocked_limit"]) == ("ready", None, None)
    (fact,) = retried.facts
    assert fact.event_id == stable_event_id(CHANGE, "task.ready", "tsk-a", "retry:3")


@pytest.mark.parametrize(
    "current",
    [
        pytest.param(None, id="missing"),
        pytest.param(task("tsk-a", TaskStatus.BLOCKED, blocked_limit="budget"), id="other-limit"),
        pytest.param(task("tsk-a", TaskStatus.READY), id="ready"),
        pytest.param(task("tsk-a", TaskStatus.ASSIGNED), id="assigned"),
        pytest.param(task("tsk-a", TaskStatus.RUNNING, agent_id=AGENT), id="running"),
        pytest.param(task("tsk-a", TaskStatus.COMPLETED), id="completed"),
        pytest.param(task("tsk-a", TaskStatus.FAILED), id="failed"),
    ],
)
def test_a_retry_leaves_any_other_task_alone(current: TaskState | None) -> None:
    assert retry_blocked_task(current, CTX, attempt=2) == Transition()


# ============================================================================ Candidates


def test_the_composition_key_is_sha256_over_the_base_and_sorted_ids() -> None:
    # GIVEN base 3 and two changesets given out of order
    key = composition_key(3, ["cs-b", "cs-a"])
    # THEN it is SHA-256 of "3␟cs-a␟cs-b": hashlib by hand, and the vector from sha256sum
    by_hand = hashlib.sha256("\x1f".join(["3", "cs-a", "cs-b"]).encode("utf-8")).hexdigest()
    assert key == by_hand
    assert key == "85d552f8d29b233fb0e1ef8b5f152afc33691f646722d66daa12209ad2f49b96"
    assert candidate_id_for(key) == "cand_85d552f8d29b233fb0e1ef8b5f152afc"


def test_the_composition_key_ignores_the_order_of_changesets() -> None:
    assert composition_key(1, ["x", "y", "z"]) == composition_key(1, ["z", "x", "y"])


def test_the_composition_key_depends_on_the_base_and_on_the_set() -> None:
    key = composition_key(1, ["x", "y"])
    assert key != composition_key(2, ["x", "y"])
    assert key != composition_key(1, ["x"])


def test_a_negative_base_generation_has_no_composition_key() -> None:
    with pytest.raises(DomainError, match="-1 is negative"):
        composition_key(-1, ["x"])


def test_a_changeset_id_holding_the_separator_is_refused() -> None:
    # GIVEN one changeset ID holding U+001F (it would compose like the two IDs a and b)
    # THEN composing it is refused, naming the separator
    with pytest.raises(DomainError, match="U\\+001F"):
        composition_key(0, ["a\x1fb"])


def compose(
    existing: CandidateState | None = None, change_status: str | None = "verifying"
) -> tuple[CandidateState, Transition]:
    return create_candidate(
        existing,
        change_status,
        CTX,
        change_id=CHANGE,
        base_generation=2,
        changeset_ids=["cs-2", "cs-1"],
        paths=["src/b.py", "src/a.py", "src/b.py"],
    )


def test_composing_a_verifying_change_creates_its_candidate() -> None:
    # WHEN a verifying Change's changesets are composed on base 2
    candidate, created = compose()
    key = composition_key(2, ["cs-1", "cs-2"])
    # THEN the Candidate is created with the ID of the key, sorted IDs and unique sorted paths
    assert candidate.candidate_id == candidate_id_for(key)
    assert candidate.status is CandidateStatus.CREATED
    assert (candidate.changeset_ids, candidate.paths) == (
        ("cs-1", "cs-2"),
        ("src/a.py", "src/b.py"),
    )
    (fact,) = created.facts
    assert fact.event_type == "candidate.created"
    assert fact.event_id == stable_event_id(
        CHANGE, "candidate.created", None, candidate.candidate_id
    )
    assert fact.payload.model_dump()["composition_key"] == key


def test_composing_the_same_work_again_is_the_same_candidate() -> None:
    first, _ = compose()
    again, transition = compose(existing=first)
    assert (again, transition) == (first, Transition())


def test_a_candidate_is_composed_only_while_the_change_is_verifying() -> None:
    with pytest.raises(DomainError, match="'chg-1' is open; a candidate is composed only"):
        compose(change_status="open")


def test_the_same_composition_of_another_change_is_refused() -> None:
    first, _ = compose()
    with pytest.raises(DomainError, match="of change 'chg-other' is not the composition"):
        compose(existing=replace(first, change_id="chg-other"))


LEGAL_CANDIDATE_MOVES = sorted((s, t) for s, targets in CANDIDATE_MOVES.items() for t in targets)


def candidate(status: CandidateStatus) -> CandidateState:
    return replace(compose()[0], status=status)


@pytest.mark.parametrize(("source", "target"), LEGAL_CANDIDATE_MOVES)
def test_every_legal_candidate_move_records_candidate_status(
    source: CandidateStatus, target: CandidateStatus
) -> None:
    current = candidate(source)
    moved = decide_candidate(current, CTX, candidate_id=current.candidate_id, to=target, reason="r")
    (update,) = moved.patch
    assert isinstance(update, Update) and update.values["status"] == target.value
    assert types(moved) == [f"candidate.{target.value}"]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (CandidateStatus.CREATED, CandidateStatus.PROMOTED),
        (CandidateStatus.VERIFIED, CandidateStatus.REJECTED),
        (CandidateStatus.REJECTED, CandidateStatus.VERIFIED),
        (CandidateStatus.STALE, CandidateStatus.VERIFIED),
        (CandidateStatus.PROMOTED, CandidateStatus.STALE),
    ],
)
def test_an_illegal_candidate_move_is_refused(
    source: CandidateStatus, target: CandidateStatus
) -> None:
    current = candidate(source)
    with pytest.raises(DomainError, match=f"cannot become {target.value}"):
        decide_candidate(current, CTX, candidate_id=current.candidate_id, to=target)


def test_deciding_what_a_candidate_already_is_changes_nothing() -> None:
    current = candidate(CandidateStatus.VERIFIED)
    assert (
        decide_candidate(current, CTX, candidate_id=current.candidate_id, to="verified")
        == Transition()
    )


def test_deciding_a_missing_candidate_is_refused() -> None:
    with pytest.raises(DomainError, match="no candidate 'cand_x'"):
        decide_candidate(None, CTX, candidate_id="cand_x", to="verified")


# ============================================================================ releases


def test_a_release_id_is_rel_project_generation() -> None:
    assert release_id_for("acme-web", 7) == "rel_acme-web_7"


def test_generation_zero_has_no_release() -> None:
    with pytest.raises(DomainError, match="generation 0 was never promoted"):
        release_id_for("acme-web", 0)


def release(status: ReleaseStatus = ReleaseStatus.STARTED) -> ReleaseState:
    return ReleaseState("rel_acme-web_1", CHANGE, 1, "cand_1", "shop", status)


def test_starting_a_release_records_release_started_once() -> None:
    # WHEN generation 1's release starts
    started = start_release(
        None, CTX, change_id=CHANGE, generation=1, candidate_id="cand_1", app_name="shop"
    )
    # THEN its row is keyed rel_acme-web_1 and release.started has the stable ID of that key
    assert list(rows(started, "releases")) == ["rel_acme-web_1"]
    (fact,) = started.facts
    assert fact.event_id == stable_event_id(CHANGE, "release.started", None, "rel_acme-web_1")
    # AND starting it again writes nothing
    again = start_release(
        release(), CTX, change_id=CHANGE, generation=1, candidate_id="cand_1", app_name="shop"
    )
    assert again == Transition()


@pytest.mark.parametrize("outcome", [ReleaseStatus.COMPLETED, ReleaseStatus.FAILED])
def test_finishing_a_release_records_its_outcome_once(outcome: ReleaseStatus) -> None:
    finished = finish_release(release(), CTX, release_id="rel_acme-web_1", outcome=outcome)
    assert types(finished) == [f"release.{outcome.value}"]
    same = finish_release(release(outcome), CTX, release_id="rel_acme-web_1", outcome=outcome)
    assert same == Transition()


def test_a_finished_release_cannot_finish_the_other_way() -> None:
    with pytest.raises(DomainError, match="already completed; it cannot failed"):
        finish_release(
            release(ReleaseStatus.COMPLETED), CTX, release_id="rel_acme-web_1", outcome="failed"
        )


@pytest.mark.parametrize(
    ("existing", "outcome", "complaint"),
    [
        (release(), "started", "completed or failed, not started"),
        (None, "completed", "no release 'rel_acme-web_1'; start it first"),
    ],
)
def test_a_release_finishes_only_as_completed_or_failed_once_started(
    existing: ReleaseState | None, outcome: str, complaint: str
) -> None:
    with pytest.raises(DomainError, match=complaint):
        finish_release(existing, CTX, release_id="rel_acme-web_1", outcome=outcome)


# ============================================================================ changesets


@pytest.mark.parametrize(
    ("paths", "resource"),
    [
        (("src/app.py",), "src/app.py"),
        (("src/a.py", "src/b.py"), "src/"),
        (("src/a/x.py", "src/a/y/z.py"), "src/a/"),
        (("src/a.py", "src/b/c.py"), "src/"),
        (("src/app.py", "src/app.py.bak"), "src/"),
        (("docs/x.md", "src/y.py"), "docs/x.md"),
        (("src/y.py", "docs/x.md"), "docs/x.md"),
    ],
)
def test_the_shared_resource_is_the_one_path_or_the_deepest_common_directory(
    paths: tuple[str, ...], resource: str
) -> None:
    assert shared_resource(paths) == resource


HOLDING = task("tsk-a", TaskStatus.RUNNING)


def propose(
    files: Mapping[str, str],
    current: TaskState | None = HOLDING,
    existing: Changeset | None = None,
) -> Transition:
    return propose_changeset(
        existing,
        current,
        CTX,
        changeset_id="cs-1",
        task_id="tsk-a",
        agent_id=AGENT,
        files=files,
        base_generation=0,
    )


def test_the_holding_agent_proposes_a_changeset_on_the_shared_resource() -> None:
    proposed = propose({"src/b.py": "b", "src/a.py": "a"})
    assert json.loads(rows(proposed, "changesets")["cs-1"]["files"]) == {
        "src/a.py": "a",
        "src/b.py": "b",
    }
    (fact,) = proposed.facts
    assert (fact.event_type, fact.resource, fact.task_id) == ("changeset.proposed", "src/", "tsk-a")
    assert fact.payload.model_dump()["paths"] == ("src/a.py", "src/b.py")


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x.py", "src/../../x.py", "src/..", "src\\a.py", ""]
)
def test_a_path_that_is_absolute_climbs_or_uses_backslashes_is_refused(path: str) -> None:
    with pytest.raises(DomainError, match="must be relative, use '/', and not climb"):
        propose({path: "x"})


def test_a_changeset_at_the_size_cap_is_accepted_and_one_byte_more_refused() -> None:
    # GIVEN content sized so the stored JSON is exactly the cap
    overhead = len(json.dumps({"a.txt": ""}))
    at_cap = "x" * (MAX_CHANGESET_BYTES - overhead)
    # THEN the cap is accepted, one byte over refused with the size in the message
    assert propose({"a.txt": at_cap}).facts
    with pytest.raises(DomainError, match=f"{MAX_CHANGESET_BYTES + 1} bytes; at most"):
        propose({"a.txt": at_cap + "x"})


def test_an_empty_changeset_is_refused() -> None:
    with pytest.raises(DomainError, match="has no files"):
        propose({})


@pytest.mark.parametrize(
    "current",
    [
        pytest.param(None, id="missing"),
        pytest.param(task("tsk-a", TaskStatus.RUNNING, agent_id="builder-2"), id="other-agent"),
        pytest.param(task("tsk-a", TaskStatus.COMPLETED, agent_id=AGENT), id="finished"),
    ],
)
def test_only_the_holding_agent_proposes(current: TaskState | None) -> None:
    with pytest.raises(DomainError, match="only its agent proposes"):
        propose({"a.py": "x"}, current=current)


def test_proposing_the_same_changeset_again_is_nothing_and_other_content_refused() -> None:
    existing = Changeset("cs-1", CHANGE, "tsk-a", AGENT, {"a.py": "x"}, 0)
    assert propose({"a.py": "x"}, existing=existing) == Transition()
    with pytest.raises(DomainError, match="propose a new changeset ID"):
        propose({"a.py": "y"}, existing=existing)


# ============================================================================ the project


def project(generation: int = 0, candidate_id: str | None = None) -> ProjectState:
    return ProjectState(PROJECT, "acme", "Acme", "active", generation, candidate_id)


def test_a_project_is_created_once_by_name() -> None:
    created = create_project(None, CTX, name="Acme")
    assert types(created) == ["project.created"]
    assert create_project(project(), CTX, name="Acme") == Transition()
    with pytest.raises(DomainError, match="already exists named 'Acme', not 'Other'"):
        create_project(project(), CTX, name="Other")


def test_promoting_advances_canonical_by_one_generation() -> None:
    promoted = promote_candidate(
        project(2), CTX, candidate_id="cand_1", artifact_id="art_1", expected_generation=2
    )
    assert types(promoted) == ["artifact.promoted", "canonical.advanced"]
    assert payload(promoted, 1)["generation"] == 3
    assert promoted.facts[1].canonical_generation == 3


def test_promoting_again_is_already_promoted() -> None:
    # GIVEN cand_1 already took canonical from 2 to 3
    # WHEN the same promotion (cand_1, expected 2) repeats
    # THEN decidePromotion answers already_promoted: nothing to write
    again = promote_candidate(
        project(3, "cand_1"), CTX, candidate_id="cand_1", artifact_id="art_1", expected_generation=2
    )
    assert again == Transition()


def test_promoting_from_a_generation_no_longer_canonical_is_refused() -> None:
    with pytest.raises(DomainError, match=r"expects canonical generation 2.*is at 3; recompose"):
        promote_candidate(
            project(3, "cand_other"),
            CTX,
            candidate_id="cand_1",
            artifact_id="art_1",
            expected_generation=2,
        )


@pytest.mark.parametrize(
    ("current", "to"),
    [(None, "archived"), ("active", "archived"), ("active", "deleted"), ("archived", "deleted")],
)
def test_a_project_is_archived_then_deleted(current: str | None, to: str) -> None:
    moved = set_project_status(current, CTX, to=to, reason="done")
    assert types(moved) == [f"project.{to}"]
    assert rows(moved, "project_admin")[PROJECT]["status"] == to


@pytest.mark.parametrize(
    ("current", "to"),
    [("archived", "active"), ("deleted", "archived"), ("deleted", "active"), ("active", "bogus")],
)
def test_a_project_never_moves_back(current: str, to: str) -> None:
    with pytest.raises(DomainError, match=f"is {current}; it cannot become {to}"):
        set_project_status(current, CTX, to=to)


@pytest.mark.parametrize(("current", "to"), [(None, "active"), ("archived", "archived")])
def test_setting_the_status_a_project_has_changes_nothing(current: str | None, to: str) -> None:
    assert set_project_status(current, CTX, to=to) == Transition()


def test_an_app_is_provisioned_once_for_an_active_project() -> None:
    provisioned = provision_app(None, None, CTX, app_name="shop")
    assert types(provisioned) == ["app.provisioned"]
    assert provision_app("live", "active", CTX, app_name="shop") == Transition()
    with pytest.raises(DomainError, match="is archived; apps are provisioned only"):
        provision_app(None, "archived", CTX, app_name="shop")


def test_only_a_live_app_is_removed() -> None:
    removed = remove_app("live", CTX, app_name="shop", reason="archived")
    assert rows(removed, "apps")["shop"]["status"] == "removed"
    assert types(removed) == ["app.removed"]
    assert remove_app("removed", CTX, app_name="shop") == Transition()
    assert remove_app(None, CTX, app_name="shop") == Transition()


# ============================================================================ scripted agent


def test_a_script_library_keeps_valid_scripts_by_name() -> None:
    steps: list[dict[str, Any]] = [
        {"do": "declare_intent", "paths": ["a.py"]},
        {"do": "wait"},
        {"do": "complete"},
    ]
    library = ScriptLibrary.from_mapping({"schema": steps})
    assert list(library.script("schema")) == steps


@pytest.mark.parametrize(
    ("step", "named"),
    [({"do": "dance"}, "does 'dance'"), ({"paths": ["a"]}, "does None")],
)
def test_a_step_that_does_no_known_thing_is_refused_naming_the_script_and_step(
    step: dict[str, Any], named: str
) -> None:
    # GIVEN a script whose 2nd step is not one of the steps
    scripts = {"schema": [{"do": "complete"}, step]}
    # WHEN the library is loaded
    # THEN the error names the source, the script, the step number and the legal steps
    with pytest.raises(DomainError) as refused:
        ScriptLibrary.from_mapping(scripts, source="lifecycle.json")
    message = str(refused.value)
    assert f"lifecycle.json: script 'schema' step 2 {named}" in message
    assert "acquire_claim, complete, declare_intent, fail" in message


def test_a_step_that_is_not_an_object_is_refused_naming_the_step() -> None:
    scripts: Any = {"schema": [{"do": "complete"}, "wait"]}
    with pytest.raises(DomainError, match="script 'schema' step 2"):
        ScriptLibrary.from_mapping(scripts)


def test_an_unknown_script_name_lists_the_scripts() -> None:
    empty: dict[str, list[dict[str, Any]]] = {"b": [], "a": []}
    library = ScriptLibrary.from_mapping(empty)
    with pytest.raises(DomainError, match="no script 'c'; the scripts are a, b"):
        library.script("c")


def test_a_script_is_cut_into_parts_at_each_wait_keeping_step_numbers() -> None:
    # GIVEN steps 1-2, a wait (3), step 4, two waits (5, 6), step 7
    a, b, c, d = (
        {"do": "declare_intent"},
        {"do": "acquire_claim"},
        {"do": "complete"},
        {"do": "fail"},
    )
    wait = {"do": "wait"}
    # WHEN it is cut
    parts = _parts([a, b, wait, c, wait, wait, d])
    # THEN each wake plays one part; back-to-back waits make an empty part
    assert parts == [[(1, a), (2, b)], [(4, c)], [], [(7, d)]]


def test_a_script_without_wait_is_one_part_and_a_leading_wait_an_empty_first_part() -> None:
    step = {"do": "complete"}
    assert _parts([step]) == [[(1, step)]]
    assert _parts([{"do": "wait"}, step]) == [[], [(2, step)]]
