"""The causal router's deterministic rules: which commands each fresh Event causes.

:func:`plan_for` is the spec's flowchart as a pure function of the Event and a read-only
:class:`RoutingWorld` (who is active, what is ready). It returns a :class:`RoutingPlan`: the
commands to send, the Clef-flash questions to ask (a prefix-only resource overlap), and the
state effects the lifecycle applies after ``canonical.advanced``. Executing the plan (the
1,000-command cap, Clef-flash, the sends) is the router's job; planning twice for the same
Event gives the same plan with the same command IDs, so a redelivery sends nothing twice.

The rules, in the flowchart's order:

* ``task.ready`` — ignored: the dispatcher already sent the wake (``cmd_<task>_ready``);
* an informational type — no action;
* ``change.planned`` — ``change.dispatch`` for the Change's first ready Tasks (the lifecycle's
  start: the dispatcher, not the router, then wakes their Agents);
* ``task.completed`` — newly ready Tasks → ``change.dispatch``; it also frees an agent slot;
* ``task.failed`` — ``change.settle``; it also frees an agent slot;
* a freed slot with a ready Task waiting at the 8-agent limit → ``change.dispatch`` again;
* ``verification.started`` (work graph completed) → ``candidate.create``;
* ``canonical.advanced`` → wake every active agent, mark the promoted Candidate promoted and
  every other open Candidate on an earlier base stale, send a Change awaiting approval with no
  verified Candidate back to verifying, then ``candidates.recompose``;
* ``artifact.promoted`` and ``canonical.advanced`` → ``index.build``
  (``cmd_index_<project>_<generation>``: the second of the pair is a duplicate);
* a resource Event → per active agent (never the Event's own author): an exact overlap wakes,
  a prefix-only overlap asks Clef-flash, no overlap does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from rhumbatron.causal.overlap import Overlap, classify_overlap
from rhumbatron.protocol.command_types import COMMAND_TYPES
from rhumbatron.protocol.envelopes import Command, Event

__all__ = [
    "ActiveAgent",
    "ClefQuestion",
    "PlannedCommand",
    "RoutingPlan",
    "RoutingWorld",
    "StateEffect",
    "acts_on",
    "plan_for",
    "wake_command",
]


@dataclass(frozen=True, slots=True)
class ActiveAgent:
    """An Agent holding a Task of a Change, and the resources it declared or claimed."""

    agent_id: str
    change_id: str
    task_id: str
    resources: tuple[str, ...] = ()


class RoutingWorld(Protocol):
    """What the rules read; the lifecycle's actors answer it."""

    def active_agents(self, project_id: str) -> Sequence[ActiveAgent]:
        """Agents holding a Task of any Change of the project now."""
        ...

    def has_ready_tasks(self, project_id: str, change_id: str) -> bool:
        """The Change has ready Tasks not yet dispatched."""
        ...

    def waits_at_agent_limit(self, project_id: str, change_id: str) -> bool:
        """A ready Task of the Change waits because 8 agents are active on it."""
        ...


@dataclass(frozen=True, slots=True)
class PlannedCommand:
    """A command the Event causes, with its queue; ``capped`` says the 1,000-per-Change cap
    counts it."""

    queue: str
    command: Command

    @property
    def capped(self) -> bool:
        return COMMAND_TYPES[self.command.command_type].counts_toward_change_cap


@dataclass(frozen=True, slots=True)
class ClefQuestion:
    """A prefix-only overlap: should ``agent`` wake for ``event``?"""

    event: Event
    agent: ActiveAgent


@dataclass(frozen=True, slots=True)
class StateEffect:
    """A state change the lifecycle applies (after ``canonical.advanced``)."""

    kind: str
    detail: dict[str, Any]


@dataclass
class RoutingPlan:
    """Everything one fresh Event causes."""

    event_id: str
    rule: str
    commands: list[PlannedCommand] = field(default_factory=list)
    questions: list[ClefQuestion] = field(default_factory=list)
    effects: list[StateEffect] = field(default_factory=list)


#: The six resource Events (spec: the causal router checks them for overlap).
RESOURCE_EVENTS = frozenset(
    {
        "intent.declared",
        "intent.changed",
        "challenge.created",
        "changeset.proposed",
        "claim.released",
        "claim.expired",
    }
)


def _command(
    command_type: str,
    command_id: str,
    event: Event,
    payload: dict[str, Any],
    *,
    now: datetime,
    change_id: str | None,
    task_id: str | None = None,
) -> PlannedCommand:
    # ``change_id`` is always given: None means "no Change" (a project's index build), so it
    # cannot also mean "the fact's Change" (a promotion fact may name one).
    spec = COMMAND_TYPES[command_type]
    command = Command.create(
        command_id=command_id,
        command_type=command_type,
        project_id=event.project_id,
        change_id=change_id,
        task_id=task_id,
        created_at=now,
        payload=payload,
    )
    return PlannedCommand(spec.queue, command)


def wake_command(event: Event, agent: ActiveAgent, *, now: datetime, reason: str) -> PlannedCommand:
    """``agent.wake`` for ``agent`` caused by ``event``: command ID ``cmd_<event>_<task>``."""
    return _command(
        "agent.wake",
        f"cmd_{event.event_id}_{agent.task_id}",
        event,
        {"agentId": agent.agent_id, "reason": reason, "eventId": event.event_id},
        now=now,
        change_id=agent.change_id,
        task_id=agent.task_id,
    )


def _index_build(event: Event, generation: int, *, now: datetime) -> PlannedCommand:
    # One ID per promoted generation: artifact.promoted and canonical.advanced both ask for
    # it, and JetStream drops the second (DECISIONS).
    return _command(
        "index.build",
        f"cmd_index_{event.project_id}_{generation}",
        event,
        {"generation": generation, "reason": "promotion"},
        now=now,
        change_id=None,
    )


def _dispatch(event: Event, reason: str, *, now: datetime) -> PlannedCommand:
    return _command(
        "change.dispatch",
        f"cmd_{event.event_id}_dispatch",
        event,
        {"reason": reason},
        now=now,
        change_id=event.change_id,
    )


#: The Event types a rule acts on beyond the resource Events; any other type plans nothing.
_ACTED_ON = frozenset(
    {
        "change.planned",
        "task.completed",
        "task.failed",
        "verification.started",
        "canonical.advanced",
        "artifact.promoted",
    }
)


def acts_on(event: Event) -> bool:
    """Whether some rule may act on ``event``: False means :func:`plan_for` plans nothing
    for it, whatever the world, so routing it needs no claim (DECISIONS: no lease for an
    Event no rule routes). It reads the Event alone, in the flowchart's order."""
    kind = event.event_type
    if kind == "task.ready":
        return False
    if kind in RESOURCE_EVENTS:
        return event.resource is not None
    return not event.spec.informational and kind in _ACTED_ON


def plan_for(event: Event, world: RoutingWorld, *, now: datetime) -> RoutingPlan:
    """The commands, Clef-flash questions and state effects ``event`` causes."""
    kind = event.event_type
    if kind == "task.ready":
        return RoutingPlan(event.event_id, "task.ready: the dispatcher already sent the wake")
    if kind in RESOURCE_EVENTS:
        return _resource_plan(event, world, now=now)
    if event.spec.informational:
        return RoutingPlan(event.event_id, "informational: no action")
    plan = RoutingPlan(event.event_id, kind)
    payload = event.payload.model_dump()
    if kind == "change.planned":
        plan.commands.append(_dispatch(event, "change_planned", now=now))
    elif kind in ("task.completed", "task.failed"):
        _plan_task_outcome(plan, event, payload, world, now=now)
    elif kind == "verification.started":
        if payload.get("reason") == "work_graph_completed":
            plan.commands.append(
                _command(
                    "candidate.create",
                    f"cmd_{event.event_id}_candidate",
                    event,
                    {"reason": "work_graph_completed"},
                    now=now,
                    change_id=event.change_id,
                )
            )
    elif kind == "canonical.advanced":
        _plan_canonical_advanced(plan, event, payload, world, now=now)
    elif kind == "artifact.promoted":
        plan.commands.append(_index_build(event, int(payload["generation"]), now=now))
    return plan


def _plan_task_outcome(
    plan: RoutingPlan,
    event: Event,
    payload: dict[str, Any],
    world: RoutingWorld,
    *,
    now: datetime,
) -> None:
    """A ``task.completed`` or ``task.failed``: settle the Change after a failure, and
    dispatch again when the freed slot or a completion lets a ready Task run."""
    kind = event.event_type
    assert event.change_id is not None
    if kind == "task.failed":
        plan.commands.append(
            _command(
                "change.settle",
                f"cmd_{event.event_id}_settle",
                event,
                {"reason": f"task {event.task_id} failed: {payload.get('reason', '')}"},
                now=now,
                change_id=event.change_id,
            )
        )
    # The freed agent slot: dispatch again when a ready Task waits at the limit; after a
    # completion, newly ready Tasks are dispatched too. One command either way.
    waiting = world.waits_at_agent_limit(event.project_id, event.change_id)
    newly_ready = kind == "task.completed" and world.has_ready_tasks(
        event.project_id, event.change_id
    )
    if waiting or newly_ready:
        reason = "task_completed" if newly_ready else "agent_slot_freed"
        plan.commands.append(_dispatch(event, reason, now=now))


def _plan_canonical_advanced(
    plan: RoutingPlan,
    event: Event,
    payload: dict[str, Any],
    world: RoutingWorld,
    *,
    now: datetime,
) -> None:
    """A ``canonical.advanced``: wake every active Agent, the Candidates' state effect, then
    ``candidates.recompose`` and the new generation's ``index.build``."""
    generation = int(payload["generation"])
    for agent in world.active_agents(event.project_id):
        plan.commands.append(wake_command(event, agent, now=now, reason="canonical_advanced"))
    plan.effects.append(
        StateEffect(
            "candidates_after_advance",
            {
                "promoted_candidate_id": payload["candidate_id"],
                "generation": generation,
                "change_ids": list(payload.get("change_ids", ())),
            },
        )
    )
    plan.commands.append(
        _command(
            "candidates.recompose",
            f"cmd_{event.event_id}_recompose",
            event,
            {"generation": generation},
            now=now,
            change_id=None,
        )
    )
    plan.commands.append(_index_build(event, generation, now=now))


def _resource_plan(event: Event, world: RoutingWorld, *, now: datetime) -> RoutingPlan:
    plan = RoutingPlan(event.event_id, f"{event.event_type}: resource overlap")
    if event.resource is None:
        return plan
    author = event.actor.removeprefix("agent:") if event.actor.startswith("agent:") else None
    for agent in world.active_agents(event.project_id):
        if agent.agent_id == author:
            continue  # an agent never wakes on its own writes
        match classify_overlap(event.resource, agent.resources):
            case Overlap.EXACT:
                plan.commands.append(
                    wake_command(event, agent, now=now, reason="exact_resource_overlap")
                )
            case Overlap.PREFIX:
                plan.questions.append(ClefQuestion(event, agent))
            case Overlap.NONE:
                pass
    return plan
