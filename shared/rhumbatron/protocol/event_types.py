"""``EVENT_TYPES``: the closed registry of Event types, one payload model each.

Names follow ``<subject>.<verb>`` in the past tense (an Event is a fact). Each type carries a
version (``eventVersion`` on the wire), the actor class that may write it, how its ID is made,
and the flags the router needs (resource Event, informational). A type outside this registry
is not a valid Event: it is rejected at construction, before it can reach an outbox.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from pydantic import Field

from rhumbatron.protocol.payloads import Payload
from rhumbatron.protocol.values import AgentId, Generation, Identifier, NameId, PromotedGeneration

__all__ = ["EVENT_TYPES", "EventIdKind", "EventTypeSpec", "Owner", "event_type_spec"]

_TYPE_NAME = re.compile(r"^[a-z][a-z_]*\.[a-z][a-z_]*$")


class Owner(StrEnum):
    """The actor class whose outbox writes a type (spec: two actor classes own an outbox)."""

    PROJECT_ROOT = "project_root"
    RESOURCE_SHARD = "resource_shard"


class EventIdKind(StrEnum):
    """How an Event of a type gets its ID."""

    #: ``stable_event_id(changeId, type, taskId, key)``: a retried workflow step repeats it.
    STABLE = "stable"
    #: ``new_event_id()``, minted once inside the actor's own transaction.
    ACTOR_MINTED = "actor_minted"


@dataclass(frozen=True, slots=True)
class EventTypeSpec:
    """Everything the system knows about one Event type."""

    name: str
    version: int
    payload: type[Payload]
    owner: Owner
    id_kind: EventIdKind
    summary: str
    requires_change: bool = False
    requires_task: bool = False
    #: One of the six resource Events the causal router checks for overlap.
    resource_event: bool = False
    #: No causal rule reacts to it (DECISIONS: every type not named by a causal rule).
    informational: bool = True


# --------------------------------------------------------------------------- payload models
# Project root ------------------------------------------------------------------------------


class ProjectCreated(Payload):
    name: str = Field(min_length=1, max_length=200)
    default_branch: str = "main"


class ArtifactPromoted(Payload):
    artifact_id: Identifier
    candidate_id: Identifier
    generation: PromotedGeneration


class CanonicalAdvanced(Payload):
    generation: PromotedGeneration
    previous_generation: Generation
    candidate_id: Identifier
    change_ids: tuple[Identifier, ...] = ()


class ProjectStatusChanged(Payload):
    """A project was archived or deleted; the type name says which."""

    reason: str = ""


class AppFact(Payload):
    app_name: NameId
    reason: str = ""


# Resource shard: claims, intents, challenges, changesets -------------------------------------

ClaimMode = Literal["exclusive", "shared"]


class ClaimAcquired(Payload):
    claim_id: Identifier
    agent_id: AgentId
    mode: ClaimMode = "exclusive"
    expires_at: datetime


class ClaimReleased(Payload):
    claim_id: Identifier
    agent_id: AgentId


class ClaimExpired(Payload):
    claim_id: Identifier
    agent_id: AgentId
    expired_at: datetime


class IntentDeclared(Payload):
    intent_id: Identifier
    agent_id: AgentId
    paths: tuple[str, ...] = Field(min_length=1)
    summary: str = ""


class IntentChanged(Payload):
    intent_id: Identifier
    agent_id: AgentId
    paths: tuple[str, ...] = Field(min_length=1)
    summary: str = ""


class ChallengeCreated(Payload):
    challenge_id: Identifier
    agent_id: AgentId
    target_agent_id: AgentId | None = None
    reason: str = Field(min_length=1)


class ChangesetProposed(Payload):
    changeset_id: Identifier
    agent_id: AgentId
    paths: tuple[str, ...] = Field(min_length=1)
    base_generation: Generation


# Change lifecycle -----------------------------------------------------------------------------


class ChangeCreated(Payload):
    title: str = Field(min_length=1, max_length=500)
    client_request_id: str = Field(min_length=1, max_length=200)
    requested_by: str = Field(min_length=1)


class ChangePlanned(Payload):
    task_ids: tuple[Identifier, ...] = Field(min_length=1)


class ChangeStatusChanged(Payload):
    """A Change moved between lifecycle states (verifying, awaiting_approval, releasing ...)."""

    from_status: str = Field(min_length=1)
    to_status: str = Field(min_length=1)
    reason: str = ""


class ChangeEnded(Payload):
    """A Change reached a terminal state; the type name says which."""

    reason: str = ""


class TaskReady(Payload):
    agent_role: str = "builder"


class TaskAssigned(Payload):
    agent_id: AgentId


class TaskStarted(Payload):
    agent_id: AgentId


class TaskCompleted(Payload):
    agent_id: AgentId
    changeset_id: Identifier | None = None


class TaskFailed(Payload):
    reason: str = Field(min_length=1)
    agent_id: AgentId | None = None
    blocked_limit: str | None = None


class TaskBlocked(Payload):
    reason: str = Field(min_length=1)
    blocked_limit: str | None = None


class AgentWoke(Payload):
    agent_id: AgentId
    false_wakeup: bool = False


class ModelRouted(Payload):
    model: str = Field(min_length=1)
    purpose: str = Field(min_length=1)


class VerificationStarted(Payload):
    reason: Literal["work_graph_completed", "rebase", "manual"] = "work_graph_completed"


class CandidateCreated(Payload):
    candidate_id: Identifier
    base_generation: Generation
    composition_key: str = Field(min_length=1)
    changeset_ids: tuple[Identifier, ...] = ()


class CandidateDecided(Payload):
    """verified / rejected / stale / promoted: the type name carries the decision."""

    candidate_id: Identifier
    reason: str = ""


class PromotionRequested(Payload):
    candidate_id: Identifier
    expected_generation: Generation


class PromotionDecided(Payload):
    candidate_id: Identifier
    expected_generation: Generation
    outcome: Literal["promoted", "already_promoted", "rejected"]
    reason: str = ""


class ReleaseFact(Payload):
    release_id: Identifier
    generation: PromotedGeneration
    reason: str = ""


# Reactions: the admission gate's refusals (rhumbatron.reactions) -------------------------------


class BudgetExceeded(Payload):
    """A tenant's daily reaction budget ran out: the reaction of ``subscription_id`` to
    ``event_id`` was skipped. Recorded once per tenant and UTC day, at the first refusal."""

    budget: Literal["reactions_per_day"] = "reactions_per_day"
    limit: Generation
    day: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    subscription_id: str = Field(min_length=1)
    event_id: str = Field(min_length=1)


class ReactionDisabled(Payload):
    """A webhook subscription was disabled because its endpoint keeps failing: it answered
    410 Gone (``gone``), or it failed without one success for the disable window
    (``failing``). Deliveries matched while it is disabled are kept as skipped, and can be
    replayed when it is enabled again."""

    subscription_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    reason: Literal["gone", "failing"]
    delivery_key: str = Field(min_length=1)
    last_error: str
    failing_since: datetime | None = None
    status_code: int | None = None


# Time events (S2-065, S2-100..102) ------------------------------------------------------------


class ScheduleFired(Payload):
    """A schedule fired: the sweep's tick, or a user-defined schedule of the registry. The
    subject is the schedule (``schedule_id``); ``scheduled_at`` is the fire time it was due,
    so a repeated fire of the same minute is the same fact."""

    schedule_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    mode: str = Field(pattern=r"^[a-z][a-z_]{0,31}$")
    scheduled_at: datetime


class LogGapDetected(Payload):
    """A replica of an event stream holds fewer messages than its own sequence range: it
    lost acknowledged events (reconciliation's check, each sweep tick). The subject is the
    stream; ``node`` is the replica's server."""

    stream: str = Field(pattern=r"^EVENTS_\d\d$")
    node: str = Field(min_length=1, max_length=128)
    lost_events: int = Field(ge=1)
    messages: int = Field(ge=0)
    first_seq: int = Field(ge=0)
    last_seq: int = Field(ge=0)


# --------------------------------------------------------------------------- the registry

_P, _S = Owner.PROJECT_ROOT, Owner.RESOURCE_SHARD
_MINTED, _STABLE = EventIdKind.ACTOR_MINTED, EventIdKind.STABLE


def _spec(
    name: str,
    payload: type[Payload],
    owner: Owner,
    id_kind: EventIdKind,
    summary: str,
    *,
    version: int = 1,
    **flags: bool,
) -> EventTypeSpec:
    if not _TYPE_NAME.match(name):
        raise ValueError(f"event type {name!r} does not follow <subject>.<verb>")
    return EventTypeSpec(name, version, payload, owner, id_kind, summary, **flags)


def _change(name: str, payload: type[Payload], summary: str, **flags: bool) -> EventTypeSpec:
    return _spec(name, payload, _S, _STABLE, summary, requires_change=True, **flags)


def _task(name: str, payload: type[Payload], summary: str, **flags: bool) -> EventTypeSpec:
    return _change(name, payload, summary, requires_task=True, **flags)


def _resource(name: str, payload: type[Payload], summary: str) -> EventTypeSpec:
    return _spec(name, payload, _S, _MINTED, summary, resource_event=True, informational=False)


_ALL: tuple[EventTypeSpec, ...] = (
    # ProjectRoot writes exactly these three.
    _spec("project.created", ProjectCreated, _P, _MINTED, "A project was provisioned."),
    _spec(
        "artifact.promoted",
        ArtifactPromoted,
        _P,
        _MINTED,
        "A candidate's artifact was promoted.",
        informational=False,
    ),
    _spec(
        "canonical.advanced",
        CanonicalAdvanced,
        _P,
        _MINTED,
        "The canonical generation moved.",
        informational=False,
    ),
    # A project's administration (archive, delete, apps) lives in the shard of
    # ``project:<id>``: ProjectRoot writes only the three above (spec).
    _spec("project.archived", ProjectStatusChanged, _S, _MINTED, "A project was archived."),
    _spec("project.deleted", ProjectStatusChanged, _S, _MINTED, "A project was deleted."),
    _spec("app.provisioned", AppFact, _S, _MINTED, "A project's app was provisioned (live)."),
    _spec("app.removed", AppFact, _S, _MINTED, "A project's app was removed."),
    # Claims: the shard's own transactions.
    _spec("claim.acquired", ClaimAcquired, _S, _MINTED, "An agent acquired a resource claim."),
    _resource("claim.released", ClaimReleased, "An agent released a resource claim."),
    _resource("claim.expired", ClaimExpired, "A resource claim expired unreleased."),
    _resource("intent.declared", IntentDeclared, "An agent declared what it intends to touch."),
    _resource("intent.changed", IntentChanged, "An agent changed a declared intent."),
    _resource("challenge.created", ChallengeCreated, "An agent challenged another's work."),
    _resource("changeset.proposed", ChangesetProposed, "An agent proposed a changeset."),
    # The Change lifecycle: deterministic IDs (a retried workflow step repeats them).
    _change("change.created", ChangeCreated, "A change request was accepted."),
    _change(
        "change.planned",
        ChangePlanned,
        "The change's work graph was planned; its first tasks are ready.",
        informational=False,
    ),
    _change("change.status_changed", ChangeStatusChanged, "A change moved to another state."),
    _change("change.settled", ChangeStatusChanged, "A settle pass decided a change's state."),
    _change("change.completed", ChangeEnded, "A change completed."),
    _change("change.failed", ChangeEnded, "A change failed."),
    _change("change.cancelled", ChangeEnded, "A change was cancelled."),
    _change("change.not_selected", ChangeEnded, "A change was not selected."),
    _change("change.declined", ChangeEnded, "A change was declined."),
    _task("task.ready", TaskReady, "A task became ready; the dispatcher sent its wake."),
    _task("task.assigned", TaskAssigned, "An agent was admitted to a task."),
    _task("task.started", TaskStarted, "The agent on a task started working on it."),
    _task(
        "task.completed",
        TaskCompleted,
        "A task completed; its agent slot is free.",
        informational=False,
    ),
    _task("task.failed", TaskFailed, "A task failed; its agent slot is free.", informational=False),
    _task("task.blocked", TaskBlocked, "A task cannot proceed without help."),
    _change("agent.woke", AgentWoke, "An agent woke for a change."),
    _change("model.routed", ModelRouted, "A model was chosen for a step."),
    _change(
        "verification.started",
        VerificationStarted,
        "The work graph completed; verify it.",
        informational=False,
    ),
    _change("candidate.created", CandidateCreated, "A candidate was composed."),
    _change("candidate.verified", CandidateDecided, "A candidate passed verification."),
    _change("candidate.rejected", CandidateDecided, "A candidate failed verification."),
    _change("candidate.stale", CandidateDecided, "A candidate's base generation fell behind."),
    _change("candidate.promoted", CandidateDecided, "A candidate became canonical."),
    _change("promotion.requested", PromotionRequested, "Promotion of a candidate was asked."),
    _change("promotion.completed", PromotionDecided, "A promotion decision was made."),
    _change("promotion.rejected", PromotionDecided, "A promotion was refused."),
    _change("release.started", ReleaseFact, "A release of a promoted generation started."),
    _change("release.completed", ReleaseFact, "A release finished."),
    _change("release.failed", ReleaseFact, "A release failed."),
    # The reactions' admission gate writes in the shard of ``project:<id>``.
    _spec(
        "budget.exceeded",
        BudgetExceeded,
        _S,
        _MINTED,
        "A tenant's daily reaction budget ran out; reactions are skipped until the next day.",
    ),
    _spec(
        "reaction.disabled",
        ReactionDisabled,
        _S,
        _MINTED,
        "A webhook subscription whose endpoint keeps failing was disabled.",
    ),
    _spec(
        "schedule.fired",
        ScheduleFired,
        _S,
        _MINTED,
        "A schedule fired (the sweep's tick, or a user-defined schedule).",
    ),
    # Written in the clock project's shard by the sweep, like its tick.
    _spec(
        "log.gap_detected",
        LogGapDetected,
        _S,
        _MINTED,
        "A replica of an event stream lost acknowledged events (reconciliation).",
    ),
)

#: The closed list of Event types, by name. Read-only.
EVENT_TYPES: MappingProxyType[str, EventTypeSpec] = MappingProxyType(
    {spec.name: spec for spec in _ALL}
)


def event_type_spec(name: str) -> EventTypeSpec:
    """The spec of ``name``; raises :class:`~rhumbatron.errors.UnknownTypeError` if absent."""
    from rhumbatron.errors import UnknownTypeError

    try:
        return EVENT_TYPES[name]
    except KeyError:
        raise UnknownTypeError(
            f"unknown event type {name!r}: EVENT_TYPES is closed; use one of "
            f"{', '.join(sorted(EVENT_TYPES))}"
        ) from None
