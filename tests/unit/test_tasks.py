"""Task transitions and what a dead letter does to a Task or its Change (spec "Dead-letter
path": S0-202, S0-203, S0-206, S0-207, S0-208). Pure transitions: no actor file, no NATS."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rhumbatron.domain.changes import ChangeState
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.tasks import (
    DEAD_LETTER_LIMIT,
    TaskState,
    TaskStatus,
    dead_letter_fact_key,
    dead_letter_outcome,
    record_task_status,
)
from rhumbatron.domain.transition import Transition, Update, Upsert
from rhumbatron.errors import DomainError
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.ids import stable_event_id

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
PROJECT = "acme-web"
CHANGE = "chg-1"
TASK = "tsk-1"
CTX = FactContext(Caller("acme", "system:test", correlation_id="corr-tasks"), PROJECT, NOW)
REASON = "agent.wake cmd_x failed on agent-wakeups after 4 deliveries: boom"


def task(status: TaskStatus, **fields: object) -> TaskState:
    values: dict[str, object] = {
        "task_id": TASK,
        "change_id": CHANGE,
        "status": status,
        "agent_id": "agent-7",
    }
    return TaskState(**(values | fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "takes_a_slot"),
    [
        (TaskStatus.PLANNED, False),
        (TaskStatus.READY, False),
        (TaskStatus.ASSIGNED, True),
        (TaskStatus.RUNNING, True),
        (TaskStatus.COMPLETED, False),  # task.completed frees the Agent slot (S0-146)
        (TaskStatus.FAILED, False),  # task.failed frees the Agent slot (S0-147)
        (TaskStatus.BLOCKED, False),
    ],
)
def test_a_task_takes_one_of_the_8_agent_slots_only_while_an_agent_holds_it(
    status: TaskStatus, takes_a_slot: bool
) -> None:
    assert task(status).active is takes_a_slot


def command(
    *, change_id: str | None = CHANGE, task_id: str | None = TASK, attempt: int = 1
) -> Command:
    return Command.create(
        command_id="cmd_wake_tsk-1",
        command_type="agent.wake",
        project_id=PROJECT,
        change_id=change_id,
        task_id=task_id,
        attempt=attempt,
        created_at=NOW,
        payload={"agentId": "agent-7", "reason": "task_ready"},
    )


def row_of(transition: Transition) -> dict[str, object]:
    (mutation,) = transition.patch
    assert isinstance(mutation, Upsert)
    return dict(mutation.row)


OPEN_CHANGE = ChangeState(CHANGE, "running")


# --------------------------------------------------------------------------- record_task_status


def test_a_new_ready_task_is_written_with_task_ready() -> None:
    # GIVEN no Task yet
    # WHEN it is recorded as ready
    transition = record_task_status(None, CTX, change_id=CHANGE, task_id=TASK, status="ready")
    # THEN the row is upserted and task.ready carries the stable ID of (change, type, task)
    row = row_of(transition)
    assert row["status"] == "ready"
    assert row["change_id"] == CHANGE
    assert row["blocked_limit"] is None
    (fact,) = transition.facts
    assert fact.event_type == "task.ready"
    assert fact.event_id == stable_event_id(CHANGE, "task.ready", TASK, None)


def test_assigning_a_task_records_task_assigned_with_its_agent() -> None:
    ready = task(TaskStatus.READY, agent_id=None)
    transition = record_task_status(
        ready, CTX, change_id=CHANGE, task_id=TASK, status="assigned", agent_id="agent-7"
    )
    assert row_of(transition)["agent_id"] == "agent-7"
    (fact,) = transition.facts
    assert fact.event_type == "task.assigned"
    assert fact.payload.agent_id == "agent-7"  # type: ignore[attr-defined]


def test_other_moves_write_the_row_without_a_fact() -> None:
    # GIVEN an assigned Task
    # WHEN it starts running (its facts belong to the lifecycle steps)
    transition = record_task_status(
        task(TaskStatus.ASSIGNED), CTX, change_id=CHANGE, task_id=TASK, status="running"
    )
    # THEN only the row moves; the agent is kept
    assert row_of(transition)["status"] == "running"
    assert row_of(transition)["agent_id"] == "agent-7"
    assert transition.facts == ()


def test_recording_the_state_a_task_already_has_changes_nothing() -> None:
    transition = record_task_status(
        task(TaskStatus.READY), CTX, change_id=CHANGE, task_id=TASK, status="ready"
    )
    assert transition == Transition()


def test_a_task_becoming_ready_again_with_a_new_key_gets_a_new_fact_id() -> None:
    blocked = task(TaskStatus.BLOCKED, blocked_limit=DEAD_LETTER_LIMIT, reason="boom")
    transition = record_task_status(
        blocked, CTX, change_id=CHANGE, task_id=TASK, status="ready", key="retry-2"
    )
    # THEN the block is cleared and the fact's ID differs from the first task.ready's
    row = row_of(transition)
    assert row["blocked_limit"] is None
    assert row["reason"] == ""
    (fact,) = transition.facts
    assert fact.event_id == stable_event_id(CHANGE, "task.ready", TASK, "retry-2")
    assert fact.event_id != stable_event_id(CHANGE, "task.ready", TASK, None)


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_a_finished_task_cannot_move(status: str) -> None:
    with pytest.raises(DomainError, match=f"is {status}; a finished task cannot become ready"):
        record_task_status(
            task(TaskStatus(status)), CTX, change_id=CHANGE, task_id=TASK, status="ready"
        )


def test_a_task_cannot_change_its_change() -> None:
    with pytest.raises(DomainError, match="belongs to change 'chg-1', not 'chg-2'"):
        record_task_status(
            task(TaskStatus.READY), CTX, change_id="chg-2", task_id=TASK, status="assigned"
        )


def test_an_unknown_status_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(DomainError, match="'paused' is not one of planned, ready"):
        record_task_status(None, CTX, change_id=CHANGE, task_id=TASK, status="paused")


def test_an_assigned_task_needs_an_agent() -> None:
    with pytest.raises(DomainError, match="cannot be assigned without an agent_id"):
        record_task_status(None, CTX, change_id=CHANGE, task_id=TASK, status="assigned")


# --------------------------------------------------------------------------- dead_letter_outcome


@pytest.mark.parametrize("status", [TaskStatus.READY, TaskStatus.ASSIGNED])
def test_a_dead_letter_blocks_a_ready_or_assigned_task_and_records_task_failed(
    status: TaskStatus,
) -> None:
    # GIVEN a ready or assigned Task of an open Change
    current = task(status)
    # WHEN a command of that Task is dead-lettered
    transition = dead_letter_outcome(current, OPEN_CHANGE, CTX, command=command(), reason=REASON)
    # THEN the Task is blocked by the dead_letter limit, with the reason (S0-202)
    row = row_of(transition)
    assert row["status"] == "blocked"
    assert row["blocked_limit"] == DEAD_LETTER_LIMIT
    assert row["reason"] == REASON
    assert row["agent_id"] == "agent-7"
    # AND task.failed is recorded with a stable ID keyed by command and attempt (S0-203),
    # then task.blocked under the same key
    fact, blocked = transition.facts
    assert (blocked.event_type, blocked.event_id) == (
        "task.blocked",
        stable_event_id(CHANGE, "task.blocked", TASK, "dead_letter:cmd_wake_tsk-1:1"),
    )
    assert blocked.payload.model_dump() == {"reason": REASON, "blocked_limit": "dead_letter"}
    assert fact.event_type == "task.failed"
    assert fact.event_id == stable_event_id(
        CHANGE, "task.failed", TASK, "dead_letter:cmd_wake_tsk-1:1"
    )
    assert fact.payload.model_dump() == {
        "reason": REASON,
        "agent_id": "agent-7",
        "blocked_limit": "dead_letter",
    }


def test_the_task_failed_of_a_later_attempt_gets_its_own_id() -> None:
    first, second = command(attempt=1), command(attempt=2)
    assert dead_letter_fact_key(first) == "dead_letter:cmd_wake_tsk-1:1"
    assert dead_letter_fact_key(second) == "dead_letter:cmd_wake_tsk-1:2"
    ids = {
        dead_letter_outcome(task(TaskStatus.READY), OPEN_CHANGE, CTX, command=c, reason=REASON)
        .facts[0]
        .event_id
        for c in (first, second)
    }
    assert len(ids) == 2


@pytest.mark.parametrize(
    "status", [TaskStatus.RUNNING, TaskStatus.PLANNED, TaskStatus.COMPLETED, TaskStatus.FAILED]
)
def test_a_dead_letter_of_a_task_in_any_other_state_puts_the_reason_on_the_change(
    status: TaskStatus,
) -> None:
    # GIVEN a Task that runs (or is otherwise not ready/assigned)
    # WHEN its command is dead-lettered
    transition = dead_letter_outcome(
        task(status), OPEN_CHANGE, CTX, command=command(), reason=REASON
    )
    # THEN only the Change gets the reason: the Task is untouched, no task.failed (S0-207/208)
    assert transition.patch == (Update("changes", {"change_id": CHANGE}, {"reason": REASON}),)
    assert transition.facts == ()


def test_a_dead_letter_without_a_task_puts_the_reason_on_the_change() -> None:
    # GIVEN a command that names a Change but no Task (S0-206)
    transition = dead_letter_outcome(
        None, OPEN_CHANGE, CTX, command=command(task_id=None), reason=REASON
    )
    assert transition.patch == (Update("changes", {"change_id": CHANGE}, {"reason": REASON}),)
    assert transition.facts == ()


def test_a_task_of_another_change_counts_as_no_task() -> None:
    other = task(TaskStatus.READY, change_id="chg-2")
    transition = dead_letter_outcome(other, OPEN_CHANGE, CTX, command=command(), reason=REASON)
    assert transition.patch == (Update("changes", {"change_id": CHANGE}, {"reason": REASON}),)
    assert transition.facts == ()


def test_a_task_already_blocked_by_a_dead_letter_is_left_alone() -> None:
    # GIVEN the outcome was applied once (the letter is redelivered)
    blocked = task(TaskStatus.BLOCKED, blocked_limit=DEAD_LETTER_LIMIT, reason=REASON)
    # WHEN it is applied again
    transition = dead_letter_outcome(blocked, OPEN_CHANGE, CTX, command=command(), reason=REASON)
    # THEN nothing changes: the reason does not move to the Change on the second delivery
    assert transition == Transition()


def test_a_task_blocked_by_another_limit_puts_the_reason_on_the_change() -> None:
    blocked = task(TaskStatus.BLOCKED, blocked_limit="agent_limit", reason="8 agents")
    transition = dead_letter_outcome(blocked, OPEN_CHANGE, CTX, command=command(), reason=REASON)
    assert transition.patch == (Update("changes", {"change_id": CHANGE}, {"reason": REASON}),)
    assert transition.facts == ()


@pytest.mark.parametrize("change", [None, ChangeState(CHANGE, "completed")])
def test_an_unknown_or_ended_change_is_left_alone(change: ChangeState | None) -> None:
    transition = dead_letter_outcome(
        None, change, CTX, command=command(task_id=None), reason=REASON
    )
    assert transition == Transition()


def test_a_command_without_a_change_has_no_outcome_to_apply() -> None:
    with pytest.raises(DomainError, match="names no change"):
        dead_letter_outcome(None, None, CTX, command=command(change_id=None), reason=REASON)


def test_a_dead_letter_needs_a_reason() -> None:
    with pytest.raises(DomainError, match="needs a reason"):
        dead_letter_outcome(
            task(TaskStatus.READY), OPEN_CHANGE, CTX, command=command(), reason="  "
        )
