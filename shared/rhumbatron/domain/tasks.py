"""Tasks of a Change, kept in the shard that owns ``change:<id>``, and what a dead letter does
to them (spec "Dead-letter path").

A Task moves ``planned → ready → assigned → running → completed | failed``, and can be
``blocked`` when it cannot proceed without help (``blocked_limit`` says which limit stopped it).
Tasks form a dependency graph: a ``planned`` Task becomes ``ready`` in the transaction that
completes the last Task it depends on, and the completion of the last Task of the graph moves
the Change to ``verifying`` with ``verification.started`` (work graph completed).

Every move to ``blocked`` records ``task.blocked`` (the reason and the limit) in the
transaction that blocks the Task.

The dead-letter rule (workers/event-router/src/dead-letter.ts): a dead-lettered command whose
Task is **ready or assigned** blocks that Task with ``blocked_limit = dead_letter`` and records
``task.failed`` (and ``task.blocked``); a command **without a Task**, or whose Task **runs**,
puts the reason on the Change instead. Only a blocked Task records ``task.failed``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from rhumbatron.domain.changes import TERMINAL_STATUSES, ChangeState, ChangeStatus, move_change
from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.transition import Transition, Update, Upsert, combine
from rhumbatron.errors import DomainError
from rhumbatron.protocol.envelopes import Command, Event

__all__ = [
    "DEAD_LETTER_LIMIT",
    "TERMINAL_TASK_STATUSES",
    "WORK_GRAPH_COMPLETED",
    "TaskState",
    "TaskStatus",
    "complete_task",
    "dead_letter_fact_key",
    "dead_letter_outcome",
    "fail_task",
    "record_task_status",
    "retry_blocked_task",
    "start_task",
]


class TaskStatus(StrEnum):
    """Where a Task is in its lifecycle."""

    PLANNED = "planned"
    READY = "ready"
    ASSIGNED = "assigned"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    BLOCKED = "blocked"


#: A Task in one of these states never moves again.
TERMINAL_TASK_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED})
#: The ``blocked_limit`` of a Task blocked because one of its commands was dead-lettered.
DEAD_LETTER_LIMIT = "dead_letter"
#: Tasks a dead letter blocks; a Task in any other state is left alone.
_BLOCKABLE = frozenset({TaskStatus.READY, TaskStatus.ASSIGNED})
#: A Task in these states has an Agent on it.
_WITH_AGENT = frozenset({TaskStatus.ASSIGNED, TaskStatus.RUNNING})


@dataclass(frozen=True, slots=True)
class TaskState:
    """One ``tasks`` row."""

    task_id: str
    change_id: str
    status: TaskStatus
    agent_id: str | None = None
    blocked_limit: str | None = None
    reason: str = ""
    title: str = ""
    #: The Agent the plan names for this Task (the dispatcher wakes it).
    planned_agent: str | None = None
    depends_on: tuple[str, ...] = ()
    #: The sample script a scripted agent plays (None for an external agent).
    script: str | None = None
    changeset_id: str | None = None

    @property
    def active(self) -> bool:
        """An Agent holds it (assigned or running): it takes one of the 8 slots."""
        return self.status in _WITH_AGENT


def _status(value: str) -> TaskStatus:
    try:
        return TaskStatus(value)
    except ValueError:
        raise DomainError(
            f"task status {value!r} is not one of {', '.join(s.value for s in TaskStatus)}"
        ) from None


def _row(task: TaskState, ctx: FactContext) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "change_id": task.change_id,
        "status": task.status.value,
        "agent_id": task.agent_id,
        "blocked_limit": task.blocked_limit,
        "reason": task.reason,
        "title": task.title,
        "planned_agent": task.planned_agent,
        "depends_on": json.dumps(list(task.depends_on)),
        "script": task.script,
        "changeset_id": task.changeset_id,
        "updated_at": ctx.now.isoformat(),
    }


def record_task_status(
    current: TaskState | None,
    ctx: FactContext,
    *,
    change_id: str,
    task_id: str,
    status: TaskStatus | str,
    agent_id: str | None = None,
    blocked_limit: str | None = None,
    reason: str = "",
    key: str | None = None,
) -> Transition:
    """Create the Task or move it to ``status``.

    Moving to ``ready`` records ``task.ready``; moving to ``assigned`` records
    ``task.assigned`` (it needs the Agent); moving to ``blocked`` records ``task.blocked``
    with the reason and ``blocked_limit`` (it needs a reason). Other moves only write the
    row: their facts (completed, failed) belong to the lifecycle steps that decide them. The
    facts get stable IDs over ``(change, type, task, key)``: a retried step writes them once,
    and a Task that becomes ready (or blocked) a second time needs a new ``key``.

    Recording the state the Task already has changes nothing. A completed or failed Task
    cannot move, and a Task cannot change its Change; both raise :class:`DomainError`.
    """
    target = _status(status)
    _check_may_move(current, change_id=change_id, task_id=task_id, target=target)
    agent = agent_id if agent_id is not None else (current.agent_id if current else None)
    if target in _WITH_AGENT and agent is None:
        raise DomainError(f"task {task_id!r} cannot be {target} without an agent_id")
    moves = current is None or current.status is not target
    if moves and target is TaskStatus.BLOCKED and not reason.strip():
        raise DomainError(
            f"task {task_id!r} cannot be blocked without a reason; say what it waits for"
        )
    task = replace(
        current or TaskState(task_id=task_id, change_id=change_id, status=target),
        status=target,
        agent_id=agent,
        # A limit only describes a blocked Task; leaving ``blocked`` clears it.
        blocked_limit=blocked_limit if target is TaskStatus.BLOCKED else None,
        reason=reason,
    )
    if task == current:
        return Transition()
    facts: tuple[Event, ...] = ()
    if moves:
        facts = _move_facts(task, ctx, change_id=change_id, task_id=task_id, key=key)
    return Transition(patch=(Upsert("tasks", _row(task, ctx), key=("task_id",)),), facts=facts)


def _check_may_move(
    current: TaskState | None, *, change_id: str, task_id: str, target: TaskStatus
) -> None:
    """A Task keeps its Change, and a completed or failed Task does not move."""
    if current is not None:
        if current.change_id != change_id:
            raise DomainError(
                f"task {task_id!r} belongs to change {current.change_id!r}, not {change_id!r}"
            )
        if current.status in TERMINAL_TASK_STATUSES and target is not current.status:
            raise DomainError(
                f"task {task_id!r} is {current.status}; a finished task cannot become {target}"
            )


def _move_facts(
    task: TaskState, ctx: FactContext, *, change_id: str, task_id: str, key: str | None
) -> tuple[Event, ...]:
    """The fact of a move to ``task.status``: ``task.ready``, ``task.assigned`` (with the
    Agent) or ``task.blocked``; other moves record none."""
    target = task.status
    if target is TaskStatus.READY:
        return (ctx.fact("task.ready", {}, change_id=change_id, task_id=task_id, key=key),)
    if target is TaskStatus.ASSIGNED:
        payload = {"agentId": task.agent_id}
        return (ctx.fact("task.assigned", payload, change_id=change_id, task_id=task_id, key=key),)
    if target is TaskStatus.BLOCKED:
        return (_blocked_fact(task, ctx, key=key),)
    return ()


def _blocked_fact(task: TaskState, ctx: FactContext, *, key: str | None) -> Event:
    """``task.blocked`` of ``task`` (already in its blocked state): why, and which limit."""
    return ctx.fact(
        "task.blocked",
        {"reason": task.reason, "blockedLimit": task.blocked_limit},
        change_id=task.change_id,
        task_id=task.task_id,
        key=key,
    )


def dead_letter_fact_key(command: Command) -> str:
    """``dead_letter:<commandId>:<attempt>``: the key of the ``task.failed`` a dead letter
    records, so a redelivered letter writes it once and an operator's Retry that fails
    again (a new attempt) can write its own."""
    return f"{DEAD_LETTER_LIMIT}:{command.command_id}:{command.attempt}"


def dead_letter_outcome(
    task: TaskState | None,
    change: ChangeState | None,
    ctx: FactContext,
    *,
    command: Command,
    reason: str,
) -> Transition:
    """What a dead-lettered ``command`` does to its Task or its Change.

    ``task`` is the command's Task (None when it names none or the shard has no such Task)
    and ``change`` its Change, both read from the shard that owns the Change.

    * A **ready or assigned** Task becomes ``blocked`` with ``blocked_limit = dead_letter``
      and records ``task.failed`` then ``task.blocked`` (stable IDs, key
      :func:`dead_letter_fact_key`): the failure frees the Agent's slot and asks
      ``change.settle``; the block is the Task's state, which the project view keeps.
    * A Task **already blocked by a dead letter** is left as it is: this is a redelivery of a
      letter already applied (or a second letter of the same Task), and applying it again
      must not move the reason elsewhere.
    * **No Task**, or a Task in any other state (running, planned, finished, blocked by
      another limit): the reason goes on the Change (``changes.reason``); no ``task.failed``.
      An ended Change, or one this shard does not know, is left alone: nobody needs to act
      on it, and the dead letter keeps the reason either way.
    """
    change_id = command.change_id
    if change_id is None:
        raise DomainError(
            f"command {command.command_id} ({command.command_type}) names no change; "
            "its dead letter has no Task or Change to mark"
        )
    if not reason.strip():
        raise DomainError(f"the dead letter of {command.command_id} needs a reason")
    if task is not None and task.change_id != change_id:
        task = None  # a Task of another Change is not this command's Task
    if task is not None and task.status in _BLOCKABLE:
        return _block_for_dead_letter(task, ctx, command=command, reason=reason)
    if (
        task is not None
        and task.status is TaskStatus.BLOCKED
        and task.blocked_limit == DEAD_LETTER_LIMIT
    ):
        return Transition()
    if change is None or change.status in TERMINAL_STATUSES:
        return Transition()
    # ``updated_at`` is left as it is: the reason is a note for an operator, not a move of
    # the Change, and must not make a quiet Change look busy to the settle sweep.
    return Transition(patch=(Update("changes", {"change_id": change_id}, {"reason": reason}),))


def _block_for_dead_letter(
    task: TaskState, ctx: FactContext, *, command: Command, reason: str
) -> Transition:
    """A ready or assigned Task (of the command's Change) blocked by the dead letter:
    ``task.failed`` then ``task.blocked``."""
    blocked = replace(
        task, status=TaskStatus.BLOCKED, blocked_limit=DEAD_LETTER_LIMIT, reason=reason
    )
    fact = ctx.fact(
        "task.failed",
        {"reason": reason, "agentId": task.agent_id, "blockedLimit": DEAD_LETTER_LIMIT},
        change_id=command.change_id,
        task_id=task.task_id,
        key=dead_letter_fact_key(command),
    )
    return Transition(
        patch=(Upsert("tasks", _row(blocked, ctx), key=("task_id",)),),
        facts=(fact, _blocked_fact(blocked, ctx, key=dead_letter_fact_key(command))),
    )


#: The reason (and stable key) of the ``verification.started`` a completed work graph records.
WORK_GRAPH_COMPLETED = "work_graph_completed"


def _held_by(task: TaskState | None, task_id: str, agent_id: str) -> TaskState:
    if task is None:
        raise DomainError(f"no task {task_id!r}; check the task ID the agent reported")
    if task.agent_id != agent_id or task.status not in _WITH_AGENT:
        holder = f"held by {task.agent_id!r}" if task.agent_id else "held by no agent"
        raise DomainError(
            f"agent {agent_id!r} does not hold task {task_id!r} (it is {task.status}, "
            f"{holder}); only the admitted agent reports on a task"
        )
    return task


def start_task(
    task: TaskState | None, ctx: FactContext, *, task_id: str, agent_id: str
) -> Transition:
    """The admitted Agent starts work: ``assigned → running`` (``task.started``); again is
    nothing."""
    if task is not None and task.status is TaskStatus.RUNNING and task.agent_id == agent_id:
        return Transition()
    held = _held_by(task, task_id, agent_id)
    running = replace(held, status=TaskStatus.RUNNING)
    fact = ctx.fact(
        "task.started", {"agentId": agent_id}, change_id=held.change_id, task_id=task_id
    )
    return Transition(patch=(Upsert("tasks", _row(running, ctx), key=("task_id",)),), facts=(fact,))


def complete_task(
    tasks: Sequence[TaskState],
    change: ChangeState | None,
    ctx: FactContext,
    *,
    task_id: str,
    agent_id: str,
    changeset_id: str | None,
) -> Transition:
    """The Agent holding ``task_id`` finished it (``task.completed``, which frees its slot).

    In the same transaction, each planned Task whose dependencies are now all completed
    becomes ready (``task.ready``), and when this was the last Task of the graph the Change
    moves ``open → verifying`` with ``verification.started`` (work graph completed). A repeat
    by the same Agent is nothing.
    """
    by_id = {t.task_id: t for t in tasks}
    task = by_id.get(task_id)
    if (
        task is not None
        and task.status is TaskStatus.COMPLETED
        and task.agent_id == agent_id
        and task.changeset_id == changeset_id
    ):
        return Transition()
    held = _held_by(task, task_id, agent_id)
    if change is None or change.ended:
        state = change.status if change else "unknown"
        raise DomainError(f"change {held.change_id!r} is {state}; its tasks cannot complete")
    done = replace(held, status=TaskStatus.COMPLETED, changeset_id=changeset_id, reason="")
    by_id[task_id] = done
    steps = [
        Transition(
            patch=(Upsert("tasks", _row(done, ctx), key=("task_id",)),),
            facts=(
                ctx.fact(
                    "task.completed",
                    {"agentId": agent_id, "changesetId": changeset_id},
                    change_id=held.change_id,
                    task_id=task_id,
                ),
            ),
        )
    ]
    completed = {t.task_id for t in by_id.values() if t.status is TaskStatus.COMPLETED}
    steps.extend(_ready_dependents(by_id.values(), completed, ctx))
    if len(completed) == len(by_id) and change.status == ChangeStatus.OPEN.value:
        steps.extend(_work_graph_completed(change, ctx))
    return combine(*steps)


def _ready_dependents(
    tasks: Iterable[TaskState], completed: set[str], ctx: FactContext
) -> list[Transition]:
    """Each planned Task whose dependencies are all ``completed`` becomes ready, in task ID
    order."""
    steps: list[Transition] = []
    for other in sorted(tasks, key=lambda t: t.task_id):
        if other.status is TaskStatus.PLANNED and set(other.depends_on) <= completed:
            steps.append(
                record_task_status(
                    other,
                    ctx,
                    change_id=other.change_id,
                    task_id=other.task_id,
                    status=TaskStatus.READY,
                    key="dependencies_completed",
                )
            )
    return steps


def _work_graph_completed(change: ChangeState, ctx: FactContext) -> list[Transition]:
    """The last Task of the graph completed: the Change moves ``open → verifying`` with
    ``verification.started``."""
    return [
        move_change(
            change,
            ctx,
            to=ChangeStatus.VERIFYING,
            reason="every task completed",
            key=WORK_GRAPH_COMPLETED,
        ),
        Transition(
            facts=(
                ctx.fact(
                    "verification.started",
                    {"reason": WORK_GRAPH_COMPLETED},
                    change_id=change.change_id,
                    key=WORK_GRAPH_COMPLETED,
                ),
            )
        ),
    ]


def fail_task(
    task: TaskState | None, ctx: FactContext, *, task_id: str, agent_id: str, reason: str
) -> Transition:
    """The Agent holding ``task_id`` gave up on it (``task.failed``, which frees its slot and
    asks ``change.settle``). A repeat is nothing."""
    if task is not None and task.status is TaskStatus.FAILED and task.agent_id == agent_id:
        return Transition()
    if not reason.strip():
        raise DomainError(f"a failure of task {task_id!r} needs a reason")
    held = _held_by(task, task_id, agent_id)
    failed = replace(held, status=TaskStatus.FAILED, reason=reason)
    fact = ctx.fact(
        "task.failed",
        {"reason": reason, "agentId": agent_id},
        change_id=held.change_id,
        task_id=task_id,
    )
    return Transition(patch=(Upsert("tasks", _row(failed, ctx), key=("task_id",)),), facts=(fact,))


def retry_blocked_task(task: TaskState | None, ctx: FactContext, *, attempt: int) -> Transition:
    """An operator's Retry of a dead-lettered wake: the Task blocked by the dead letter is
    ready again (``task.ready``, key ``retry:<attempt>``) so the resent wake can admit an
    Agent. Any other Task is left alone."""
    if (
        task is None
        or task.status is not TaskStatus.BLOCKED
        or task.blocked_limit != DEAD_LETTER_LIMIT
    ):
        return Transition()
    return record_task_status(
        replace(task, agent_id=None),
        ctx,
        change_id=task.change_id,
        task_id=task.task_id,
        status=TaskStatus.READY,
        key=f"retry:{attempt}",
    )
