"""What a :class:`~rhumbatron.actors.resource_shard.ResourceShard` can be asked to do: one
command per lifecycle operation, applied by ``ResourceShard.apply(caller, command)``.

A command is plain data (as in cosmicpython's ``commands.py``): it names its fields once,
with their types, and the API, the agent callbacks, the lifecycle handlers and the tests all
build the same object. :mod:`rhumbatron.actors.shard_handlers` maps each command to its
domain transition; the shard runs that in one transaction. The caller (who asks, in which
causal chain) is not part of a command: it travels beside it, as every transition's
:class:`~rhumbatron.domain.facts.FactContext`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from rhumbatron.domain.candidates import CandidateStatus
from rhumbatron.domain.changes import ChangeFact, ChangeStatus, TaskPlan
from rhumbatron.domain.releases import ReleaseStatus
from rhumbatron.domain.tasks import TaskStatus
from rhumbatron.protocol.envelopes import Command

__all__ = [
    "CLAIM_TTL",
    "AcquireClaim",
    "AdmitAgent",
    "AgentReport",
    "AppendChangeEvents",
    "BlockTaskForDeadLetter",
    "CompleteTask",
    "ComposeCandidate",
    "CreateChallenge",
    "CreateChange",
    "DecideCandidate",
    "DeclareIntent",
    "ExpireClaims",
    "FailTask",
    "FinishRelease",
    "MoveChange",
    "ProposeChangeset",
    "ProvisionApp",
    "RecordAgentWoke",
    "RecordModelRouted",
    "RecordPromotion",
    "RecordPromotionRefused",
    "RecordTaskStatus",
    "ReleaseClaim",
    "RemoveApp",
    "RetryBlockedTask",
    "SetProjectStatus",
    "SettleChange",
    "ShardCommand",
    "ShardWrite",
    "StartRelease",
    "StartTask",
]

#: How long an Agent's claim lasts unless its holder claims again (which renews it).
CLAIM_TTL = timedelta(minutes=15)

# Every command is frozen (a command is a request, not a record to edit), slotted, and
# keyword-only: the fields of one operation read as a sentence at the call site, and two
# fields of one type can never be swapped by position.


# -- claims, intents, challenges (the shard of the resource) -----------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class AcquireClaim:
    """An exclusive claim on ``resource`` for ``ttl``; its holder claiming again renews it
    (see :func:`~rhumbatron.domain.resources.acquire_claim`)."""

    resource: str
    agent_id: str
    ttl: timedelta = CLAIM_TTL


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseClaim:
    """``claim.released``; only its holder releases a claim."""

    resource: str
    agent_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireClaims:
    """Drop every claim whose time is up (``claim.expired`` each)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclareIntent:
    """``intent.declared``, or ``intent.changed`` when the intent names other paths."""

    intent_id: str
    agent_id: str
    paths: tuple[str, ...]
    summary: str = ""
    change_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateChallenge:
    """``challenge.created``, once per ``challenge_id`` (see
    :func:`~rhumbatron.domain.resources.create_challenge`); the shard must own
    ``resource``."""

    challenge_id: str
    agent_id: str
    resource: str
    target_agent_id: str | None
    reason: str
    change_id: str | None = None


# -- the Change (the shard of ``change:<id>``) -------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class AppendChangeEvents:
    """appendChangeEvents: move the Change and append its facts (stable IDs)."""

    change_id: str
    status: str
    facts: tuple[ChangeFact, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateChange:
    """The Change ``open`` with its work graph (see
    :func:`~rhumbatron.domain.changes.create_change`)."""

    change_id: str
    title: str
    client_request_id: str
    requested_by: str
    tasks: tuple[TaskPlan, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveChange:
    """Move the Change along its state machine, with its fact."""

    change_id: str
    to: ChangeStatus | str
    reason: str = ""
    key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SettleChange:
    """A settle pass's decision: ``change.settled`` and, when ``to`` differs, the move, in
    one transaction (see :func:`~rhumbatron.domain.changes.settle_change`)."""

    change_id: str
    from_status: ChangeStatus | str
    to: ChangeStatus | str
    reason: str
    key: str


# -- the Tasks of a Change ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class RecordTaskStatus:
    """Create the Task or move it (task.ready / task.assigned where it applies); see
    :func:`~rhumbatron.domain.tasks.record_task_status`."""

    change_id: str
    task_id: str
    status: TaskStatus | str
    agent_id: str | None = None
    blocked_limit: str | None = None
    reason: str = ""
    key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockTaskForDeadLetter:
    """A dead-lettered ``command`` on its Task or its Change: a ready or assigned Task is
    blocked (``dead_letter``) with ``task.failed``; otherwise the reason goes on the Change.
    See :func:`~rhumbatron.domain.tasks.dead_letter_outcome`."""

    command: Command
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmitAgent:
    """``admitAgent``: assign ``task_id`` to ``agent_id`` once, at most ``limit`` Agents
    active on the Change (see :func:`~rhumbatron.domain.agents.admit_agent`). Applying it
    answers the :class:`~rhumbatron.domain.agents.Admission`."""

    change_id: str
    task_id: str
    agent_id: str
    limit: int = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordAgentWoke:
    """``agent.woke`` (see :func:`~rhumbatron.domain.agents.record_agent_woke`): once per
    ``key``, and only for a Change the shard holds."""

    change_id: str
    task_id: str | None
    agent_id: str
    key: str
    false_wakeup: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordModelRouted:
    """``model.routed`` (see :func:`~rhumbatron.domain.agents.record_model_routed`): once
    per ``key``, and only for a Change the shard holds."""

    change_id: str
    task_id: str | None
    model: str
    purpose: str
    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StartTask:
    """``assigned → running`` (``task.started``) by the Agent that holds the Task."""

    task_id: str
    agent_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteTask:
    """``task.completed``, the newly ready Tasks, and the work graph's completion."""

    change_id: str
    task_id: str
    agent_id: str
    changeset_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FailTask:
    """``task.failed`` with ``reason``, by the Agent that holds the Task."""

    task_id: str
    agent_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryBlockedTask:
    """An operator's Retry: the Task its dead letter blocked is ready again."""

    task_id: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProposeChangeset:
    """``changeset.proposed`` for the Task, on canonical generation ``base_generation``."""

    changeset_id: str
    task_id: str
    agent_id: str
    files: Mapping[str, str]
    base_generation: int


# -- Candidates, promotion, releases -----------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ComposeCandidate:
    """Compose the Change's completed changesets on ``base_generation`` (the same work on the
    same base is the same Candidate). Applying it answers the
    :class:`~rhumbatron.domain.candidates.CandidateState`."""

    change_id: str
    base_generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DecideCandidate:
    """Move the Candidate and, in the same transaction, its Change (when ``change_to`` is
    given and the Change is not there yet)."""

    candidate_id: str
    to: CandidateStatus | str
    reason: str = ""
    change_to: ChangeStatus | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordPromotion:
    """The Change's Candidate was promoted: ``promotion.requested``, then
    ``awaiting_approval → releasing`` with ``promotion.completed`` (once per Candidate)."""

    change_id: str
    candidate_id: str
    expected_generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordPromotionRefused:
    """``decidePromotion`` refused the Candidate (canonical moved past its base):
    ``promotion.requested`` and ``promotion.rejected``, once per Candidate and expected
    generation. The Change does not move: canonical.advanced sends it back to verifying and
    recomposes it."""

    change_id: str
    candidate_id: str
    expected_generation: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StartRelease:
    """``release.started`` for canonical ``generation`` on ``app_name``."""

    change_id: str
    generation: int
    candidate_id: str
    app_name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishRelease:
    """``release.completed`` / ``release.failed`` and the Change's end, together."""

    release_id: str
    outcome: ReleaseStatus | str
    reason: str = ""


# -- project administration (the shard of ``project:<id>``) ------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SetProjectStatus:
    """Archive or delete the project (``project.archived`` / ``project.deleted``)."""

    to: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvisionApp:
    """``app.provisioned``: the app is live (an active project only)."""

    app_name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoveApp:
    """``app.removed``: the app is no longer live."""

    app_name: str
    reason: str = ""


#: The commands whose application answers what the transaction wrote
#: (:class:`~rhumbatron.actors.actor.TransactResult`).
ShardWrite = (
    AcquireClaim
    | ReleaseClaim
    | ExpireClaims
    | DeclareIntent
    | CreateChallenge
    | AppendChangeEvents
    | CreateChange
    | MoveChange
    | SettleChange
    | RecordTaskStatus
    | BlockTaskForDeadLetter
    | RecordAgentWoke
    | RecordModelRouted
    | StartTask
    | CompleteTask
    | FailTask
    | RetryBlockedTask
    | ProposeChangeset
    | DecideCandidate
    | RecordPromotion
    | RecordPromotionRefused
    | StartRelease
    | FinishRelease
    | SetProjectStatus
    | ProvisionApp
    | RemoveApp
)

#: Every command: the writes, and the two that answer their decision.
ShardCommand = ShardWrite | AdmitAgent | ComposeCandidate

#: What an Agent reports while it works on a Task (``AgentCallbacks.report``).
AgentReport = (
    StartTask
    | DeclareIntent
    | AcquireClaim
    | ReleaseClaim
    | CreateChallenge
    | ProposeChangeset
    | CompleteTask
    | FailTask
)
