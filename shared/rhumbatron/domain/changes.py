"""The Change aggregate: created with its work graph, moved only through its state machine.

A Change lives in the ResourceShard that owns ``change:<id>``, with its Tasks, changesets,
Candidates and release, so every move and its fact commit in one transaction (spec
``appendChangeEvents``). Change Events carry deterministic IDs: a retried step that appends
the same facts is a no-op in the outbox. The state machine is drawn in docs/lifecycle.md::

    open ──► verifying ──► awaiting_approval ──► releasing ──► completed
      │          │  ▲              │                  │
      │          │  └──────────────┤ (no verified     └──► failed
      ▼          ▼                 ▼   Candidate left)
    failed   failed / not_selected   declined / not_selected
    cancelled (from open, verifying, awaiting_approval)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.transition import (
    Insert,
    Transition,
    Update,
    Upsert,
    combine,
    parse_state,
)
from rhumbatron.errors import DomainError
from rhumbatron.protocol.event_types import EVENT_TYPES

__all__ = [
    "CHANGE_MOVES",
    "MAX_TASKS_PER_CHANGE",
    "TERMINAL_STATUSES",
    "ChangeFact",
    "ChangeState",
    "ChangeStatus",
    "TaskPlan",
    "append_change_events",
    "check_work_graph",
    "create_change",
    "move_change",
    "settle_change",
]


class ChangeStatus(StrEnum):
    """Every state the spec names (docs/lifecycle.md)."""

    OPEN = "open"
    VERIFYING = "verifying"
    AWAITING_APPROVAL = "awaiting_approval"
    RELEASING = "releasing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    NOT_SELECTED = "not_selected"
    DECLINED = "declined"


#: A Change in one of these states never moves again.
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "not_selected", "declined"})

_S = ChangeStatus
#: The legal moves: the only way a Change changes state.
CHANGE_MOVES: MappingProxyType[ChangeStatus, frozenset[ChangeStatus]] = MappingProxyType(
    {
        _S.OPEN: frozenset({_S.VERIFYING, _S.FAILED, _S.CANCELLED}),
        _S.VERIFYING: frozenset({_S.AWAITING_APPROVAL, _S.FAILED, _S.CANCELLED, _S.NOT_SELECTED}),
        _S.AWAITING_APPROVAL: frozenset(
            {_S.RELEASING, _S.VERIFYING, _S.DECLINED, _S.NOT_SELECTED, _S.CANCELLED}
        ),
        _S.RELEASING: frozenset({_S.COMPLETED, _S.FAILED}),
    }
)

#: A bound on one Change's work graph, so one request cannot plan unbounded work.
MAX_TASKS_PER_CHANGE = 200


@dataclass(frozen=True, slots=True)
class ChangeState:
    """One ``changes`` row."""

    change_id: str
    status: str
    reason: str = ""
    title: str = ""
    client_request_id: str = ""
    requested_by: str = ""
    created_at: str = ""
    updated_at: str = ""
    promoted_at: str | None = None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class ChangeFact:
    """One fact to append: its type, payload, and (for Task Events) the Task and a key."""

    event_type: str
    payload: dict[str, Any]
    task_id: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """One Task of a requested work graph: who plays it and what it waits for."""

    task_id: str
    title: str
    agent_id: str
    depends_on: tuple[str, ...] = ()
    script: str | None = None


def check_work_graph(change_id: str, tasks: Sequence[TaskPlan]) -> None:
    """Refuse a work graph that cannot finish: no tasks, too many, duplicate IDs, unknown or
    self dependencies, or a cycle (each with a DomainError naming it)."""
    if not tasks:
        raise DomainError(f"change {change_id!r} needs at least one task")
    if len(tasks) > MAX_TASKS_PER_CHANGE:
        raise DomainError(
            f"change {change_id!r} has {len(tasks)} tasks; at most {MAX_TASKS_PER_CHANGE} "
            "per change — split the work into several changes"
        )
    ids = [t.task_id for t in tasks]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise DomainError(f"change {change_id!r} names tasks twice: {duplicates}")
    known = set(ids)
    for task in tasks:
        missing = sorted(set(task.depends_on) - known)
        if missing:
            raise DomainError(
                f"task {task.task_id!r} depends on {missing}, which are not tasks of "
                f"change {change_id!r}"
            )
        if task.task_id in task.depends_on:
            raise DomainError(f"task {task.task_id!r} depends on itself")
    # Kahn: a graph whose every task can be ordered has no cycle.
    waiting = {t.task_id: set(t.depends_on) for t in tasks}
    done: set[str] = set()
    while True:
        free = [t for t, deps in waiting.items() if t not in done and deps <= done]
        if not free:
            break
        done.update(free)
    if len(done) != len(waiting):
        raise DomainError(
            f"the tasks {sorted(set(waiting) - done)} of change {change_id!r} depend on each "
            "other in a cycle; no order can finish them"
        )


def create_change(
    current: ChangeState | None,
    ctx: FactContext,
    *,
    change_id: str,
    title: str,
    client_request_id: str,
    requested_by: str,
    tasks: Sequence[TaskPlan],
) -> Transition:
    """Create the Change ``open`` with its work graph: ``change.created``, ``change.planned``
    and ``task.ready`` for every Task that waits for nothing.

    Creating it again for the same client request changes nothing (the API's idempotency
    key); the same Change ID for another request is refused.
    """
    if current is not None:
        if current.client_request_id == client_request_id:
            return Transition()
        raise DomainError(
            f"change {change_id!r} already exists for client request "
            f"{current.client_request_id!r}, not {client_request_id!r}"
        )
    check_work_graph(change_id, tasks)
    now = ctx.now.isoformat()
    patch: list[Any] = [
        _change_row(
            change_id,
            title=title,
            client_request_id=client_request_id,
            requested_by=requested_by,
            now=now,
        )
    ]
    facts = [
        ctx.fact(
            "change.created",
            {"title": title, "clientRequestId": client_request_id, "requestedBy": requested_by},
            change_id=change_id,
        ),
        ctx.fact("change.planned", {"taskIds": [t.task_id for t in tasks]}, change_id=change_id),
    ]
    for task in tasks:
        ready = not task.depends_on
        patch.append(_planned_task_row(change_id, task, ready=ready, now=now))
        if ready:
            facts.append(
                ctx.fact("task.ready", {}, change_id=change_id, task_id=task.task_id, key="planned")
            )
    return Transition(patch=tuple(patch), facts=tuple(facts))


def _change_row(
    change_id: str, *, title: str, client_request_id: str, requested_by: str, now: str
) -> Insert:
    """The ``changes`` row of a new, open Change."""
    return Insert(
        "changes",
        {
            "change_id": change_id,
            "status": ChangeStatus.OPEN.value,
            "reason": "",
            "title": title,
            "client_request_id": client_request_id,
            "requested_by": requested_by,
            "created_at": now,
            "updated_at": now,
        },
    )


def _planned_task_row(change_id: str, task: TaskPlan, *, ready: bool, now: str) -> Insert:
    """The ``tasks`` row of a planned Task: ``ready`` when it waits for nothing."""
    return Insert(
        "tasks",
        {
            "task_id": task.task_id,
            "change_id": change_id,
            "status": "ready" if ready else "planned",
            "agent_id": None,
            "blocked_limit": None,
            "reason": "",
            "title": task.title,
            "planned_agent": task.agent_id,
            "depends_on": json.dumps(list(task.depends_on)),
            "script": task.script,
            "changeset_id": None,
            "updated_at": now,
        },
    )


def move_change(
    current: ChangeState | None,
    ctx: FactContext,
    *,
    to: ChangeStatus | str,
    reason: str = "",
    key: str | None = None,
) -> Transition:
    """Move the Change along :data:`CHANGE_MOVES`, with its fact.

    A terminal state records ``change.<state>``; any other move records
    ``change.status_changed``. The fact's stable key is the move plus ``key`` (by default the
    caller's correlation ID: the command or event that caused it), so a retried step writes
    it once. Being in ``to`` already changes nothing; an illegal move raises
    :class:`DomainError` naming the legal ones.
    """
    target = parse_state(ChangeStatus, to)
    if current is None:
        raise DomainError(f"no such change to move to {target}; create it first")
    source = ChangeStatus(current.status)
    if source is target:
        return Transition()
    allowed = CHANGE_MOVES.get(source, frozenset())
    if target not in allowed:
        legal = ", ".join(sorted(s.value for s in allowed)) or "none (it has ended)"
        raise DomainError(
            f"change {current.change_id!r} is {source}; it cannot become {target} "
            f"(from {source} it can become: {legal})"
        )
    fact_key = f"{source}->{target}:{key if key is not None else ctx.caller.correlation_id}"
    if target.value in TERMINAL_STATUSES:
        fact = ctx.fact(
            f"change.{target.value}", {"reason": reason}, change_id=current.change_id, key=fact_key
        )
    else:
        fact = ctx.fact(
            "change.status_changed",
            {"fromStatus": source.value, "toStatus": target.value, "reason": reason},
            change_id=current.change_id,
            key=fact_key,
        )
    values: dict[str, Any] = {"status": target.value, "updated_at": ctx.now.isoformat()}
    if reason:
        values["reason"] = reason
    if target is ChangeStatus.RELEASING:
        values["promoted_at"] = ctx.now.isoformat()
    return Transition(
        patch=(Update("changes", {"change_id": current.change_id}, values),), facts=(fact,)
    )


def settle_change(
    current: ChangeState | None,
    ctx: FactContext,
    *,
    from_status: ChangeStatus | str,
    to: ChangeStatus | str,
    reason: str,
    key: str,
) -> Transition:
    """A settle pass's decision about a Change it read in ``from_status``: ``change.settled``
    (from, to, reason), with the move to ``to`` when it differs.

    The move is :func:`move_change`'s, with its own fact (``change.status_changed`` or the
    terminal ``change.<state>``) under its usual key; ``change.settled`` records the
    decision itself, keyed by ``key`` (the settle command's ID), so a redelivered settle
    writes it once. ``to == from_status`` is a decision that leaves the Change where it is
    (the pass re-drove its work). A Change that is no longer in ``from_status`` (it moved
    since the pass read it) or that this shard does not know is left alone: the pass
    decided about a state that is gone, and a later settle decides again.
    """
    source = parse_state(ChangeStatus, from_status)
    target = parse_state(ChangeStatus, to)
    if current is None or current.status != source.value:
        return Transition()
    moved = move_change(current, ctx, to=target, reason=reason)
    settled = ctx.fact(
        "change.settled",
        {"fromStatus": source.value, "toStatus": target.value, "reason": reason},
        change_id=current.change_id,
        key=key,
    )
    return combine(moved, Transition(facts=(settled,)))


def append_change_events(
    current: ChangeState | None,
    ctx: FactContext,
    *,
    change_id: str,
    status: str,
    facts: tuple[ChangeFact, ...],
) -> Transition:
    """Move the Change to ``status`` and append its facts, with stable IDs.

    The low-level ``appendChangeEvents`` of the spec, kept for replaying recorded scenarios;
    the lifecycle moves Changes with :func:`move_change`.
    """
    if current is not None and current.status in TERMINAL_STATUSES and status != current.status:
        raise DomainError(
            f"change {change_id!r} is {current.status}; a terminal change cannot become {status}"
        )
    for fact in facts:
        spec = EVENT_TYPES.get(fact.event_type)
        if spec is None or not spec.requires_change:
            raise DomainError(
                f"{fact.event_type!r} is not a Change Event; Change Events are "
                + ", ".join(sorted(n for n, s in EVENT_TYPES.items() if s.requires_change))
            )
    row = {"change_id": change_id, "status": status, "updated_at": ctx.now.isoformat()}
    events = tuple(
        ctx.fact(f.event_type, f.payload, change_id=change_id, task_id=f.task_id, key=f.key)
        for f in facts
    )
    return Transition(patch=(Upsert("changes", row, key=("change_id",)),), facts=events)
