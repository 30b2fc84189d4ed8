"""Admitting an Agent to a Task (spec ``admitAgent``): a ready Task gets one Agent, once; and
the two facts that narrate an Agent's activation in its Change's shard: ``agent.woke`` (a wake
reached it, or was a false wakeup) and ``model.routed`` (a model was asked on its behalf).

The decision runs inside the shard's transaction that owns the Task, so two wakes racing for
one Task cannot both win: the first moves it to ``assigned`` (``task.assigned``), the second
finds it held. A ready wake for a Task the same Agent already holds is a duplicate; one held by
another Agent, or no longer ready, is stale. At most ``limit`` Agents (8) are active per
Change: a Task over the limit stays ready, and the router dispatches again when a slot frees.

Both narration facts are Change Events with stable IDs, and both are recorded only for a Change
the shard knows: a wake or a routing question about a Change nobody created narrates nothing.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.tasks import TaskState, TaskStatus, record_task_status
from rhumbatron.domain.transition import Transition
from rhumbatron.errors import DomainError

if TYPE_CHECKING:
    from rhumbatron.domain.changes import ChangeState
    from rhumbatron.protocol.envelopes import Command

__all__ = [
    "CLEF_FLASH_PURPOSE",
    "Admission",
    "admit_agent",
    "record_agent_woke",
    "record_model_routed",
    "woke_fact_key",
]

#: The ``purpose`` of the ``model.routed`` a Clef-flash question records.
CLEF_FLASH_PURPOSE = "clef_flash"


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


def woke_fact_key(command: Command, agent_id: str) -> str:
    """``<commandId>:<attempt>:<agentId>``: the key of the ``agent.woke`` a wake records.

    A redelivered message (same command, same attempt) records it once. A dispatcher's ready
    wake keeps its command ID (``cmd_<task>_ready``) across send rounds and an operator's
    Retry, each a new attempt that really wakes an Agent again, so the attempt is part of the
    key; and so is the Agent, which a ready wake of the same Task may name differently.
    """
    return f"{command.command_id}:{command.attempt}:{agent_id}"


def record_agent_woke(
    change: ChangeState | None,
    ctx: FactContext,
    *,
    change_id: str,
    task_id: str | None,
    agent_id: str,
    key: str,
    false_wakeup: bool = False,
) -> Transition:
    """``agent.woke`` for ``agent_id`` about ``change_id`` (and its Task, when the wake names
    one): the wake consumer delivered a wake (``false_wakeup`` False), or found it stale and
    ended it (True). ``key`` is :func:`woke_fact_key`. A Change this shard does not know gets
    nothing."""
    if not agent_id:
        raise DomainError(f"agent.woke of change {change_id!r} needs the agent's ID")
    if change is None or change.change_id != change_id:
        return Transition()
    fact = ctx.fact(
        "agent.woke",
        {"agentId": agent_id, "falseWakeup": false_wakeup},
        change_id=change_id,
        task_id=task_id,
        key=key,
    )
    return Transition(facts=(fact,))


def record_model_routed(
    change: ChangeState | None,
    ctx: FactContext,
    *,
    change_id: str,
    task_id: str | None,
    model: str,
    purpose: str,
    key: str,
) -> Transition:
    """``model.routed``: ``model`` was asked a question for ``purpose`` on behalf of the
    Agent on ``task_id`` of ``change_id``. ``key`` names the question (Clef-flash: the ID of
    the Event it was asked about), so a redelivered Event records it once. A Change this
    shard does not know gets nothing."""
    if not model or not purpose:
        raise DomainError(
            f"model.routed of change {change_id!r} needs a model and a purpose "
            f"(got {model!r}, {purpose!r})"
        )
    if change is None or change.change_id != change_id:
        return Transition()
    fact = ctx.fact(
        "model.routed",
        {"model": model, "purpose": purpose},
        change_id=change_id,
        task_id=task_id,
        key=key,
    )
    return Transition(facts=(fact,))
