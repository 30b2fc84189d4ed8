"""Admitting an Agent to a Task (spec ``admitAgent``): a ready Task gets one Agent, once.

The decision runs inside the shard's transaction that owns the Task, so two wakes racing for
one Task cannot both win: the first moves it to ``assigned`` (``task.assigned``), the second
finds it held. A ready wake for a Task the same Agent already holds is a duplicate; one held by
another Agent, or no longer ready, is stale. At most ``limit`` Agents (8) are active per
Change: a Task over the limit stays ready, and the router dispatches again when a slot frees.
"""

from __future__ import annotations

from enum import StrEnum

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.tasks import TaskState, TaskStatus, record_task_status
from rhumbatron.domain.transition import Transition

__all__ = ["Admission", "admit_agent"]


class Admission(StrEnum):
    ADMITTED = "admitted"
    ALREADY_HOLDS = "already_holds"  # a duplicate ready wake
    HELD_BY_OTHER = "held_by_other"  # stale
    NOT_READY = "not_ready"  # stale: planned, finished or blocked
    AT_LIMIT = "at_limit"  # stays ready; dispatched again when a slot frees


def admit_agent(
    task: TaskState | None,
    ctx: FactContext,
    *,
    agent_id: str,
    active_on_change: int,
    limit: int,
) -> tuple[Admission, Transition]:
    """Decide the admission of ``agent_id`` to ``task`` and the transition it writes."""
    if task is None:
        return Admission.NOT_READY, Transition()
    if task.status in (TaskStatus.ASSIGNED, TaskStatus.RUNNING):
        holds = task.agent_id == agent_id
        return (Admission.ALREADY_HOLDS if holds else Admission.HELD_BY_OTHER), Transition()
    if task.status is not TaskStatus.READY:
        return Admission.NOT_READY, Transition()
    if active_on_change >= limit:
        return Admission.AT_LIMIT, Transition()
    return Admission.ADMITTED, record_task_status(
        task,
        ctx,
        change_id=task.change_id,
        task_id=task.task_id,
        status=TaskStatus.ASSIGNED,
        agent_id=agent_id,
        # One admission per wake attempt: a Task readied again by an operator's Retry is
        # admitted again under a new key (a retried transaction never gets this far twice:
        # it finds the Task held).
        key=f"admit:{agent_id}:{ctx.caller.correlation_id}",
    )
