"""Each resource-shard command's handler: read the state it decides on, run its domain
transition.

A handler runs inside the shard's write transaction (``ResourceShard.apply``) with the
transaction's connection and the caller's :class:`FactContext`; what it returns is written
in that same transaction. :func:`transition_for` finds the handler of a write command;
:func:`decision_for` runs the two commands that also answer what they decided.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from rhumbatron.actors import shard_state as state
from rhumbatron.actors.shard_commands import (
    AcquireClaim,
    AdmitAgent,
    AppendChangeEvents,
    BlockTaskForDeadLetter,
    CompleteTask,
    ComposeCandidate,
    CreateChallenge,
    CreateChange,
    DecideCandidate,
    DeclareIntent,
    ExpireClaims,
    FailTask,
    FinishRelease,
    MoveChange,
    ProposeChangeset,
    ProvisionApp,
    RecordAgentWoke,
    RecordModelRouted,
    RecordPromotion,
    RecordPromotionRefused,
    RecordTaskStatus,
    ReleaseClaim,
    RemoveApp,
    RetryBlockedTask,
    SetProjectStatus,
    SettleChange,
    ShardWrite,
    StartRelease,
    StartTask,
)
from rhumbatron.domain import (
    agents,
    candidates,
    changes,
    changesets,
    project,
    releases,
    resources,
    tasks,
)
from rhumbatron.domain.agents import Admission
from rhumbatron.domain.candidates import CandidateState
from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.releases import ReleaseStatus
from rhumbatron.domain.transition import Transition, combine
from rhumbatron.protocol.envelopes import Event

__all__ = ["decision_for", "transition_for"]

_Command = TypeVar("_Command", bound=ShardWrite)
_Handler = Callable[[sqlite3.Connection, FactContext, _Command], Transition]

#: Command type → its handler; every :data:`ShardWrite` has one (the handlers register
#: themselves below, each with the command it takes, so the two cannot disagree).
_HANDLERS: dict[type[Any], _Handler[Any]] = {}


def _handles(kind: type[_Command]) -> Callable[[_Handler[_Command]], _Handler[_Command]]:
    def register(handler: _Handler[_Command]) -> _Handler[_Command]:
        _HANDLERS[kind] = handler
        return handler

    return register


def transition_for(db: sqlite3.Connection, ctx: FactContext, command: ShardWrite) -> Transition:
    """What ``command`` writes, decided on the state ``db`` holds."""
    return _HANDLERS[type(command)](db, ctx, command)


def decision_for(
    db: sqlite3.Connection, ctx: FactContext, command: AdmitAgent | ComposeCandidate
) -> tuple[Admission | CandidateState, Transition]:
    """What ``command`` decided, and what it writes."""
    if isinstance(command, AdmitAgent):
        return _admit_agent(db, ctx, command)
    return _compose_candidate(db, ctx, command)


# -- claims, intents, challenges ---------------------------------------------------------------
@_handles(AcquireClaim)
def _acquire_claim(db: sqlite3.Connection, ctx: FactContext, c: AcquireClaim) -> Transition:
    return resources.acquire_claim(
        state.claim(db, c.resource), ctx, resource=c.resource, agent_id=c.agent_id, ttl=c.ttl
    )


@_handles(ReleaseClaim)
def _release_claim(db: sqlite3.Connection, ctx: FactContext, c: ReleaseClaim) -> Transition:
    return resources.release_claim(
        state.claim(db, c.resource), ctx, resource=c.resource, agent_id=c.agent_id
    )


@_handles(ExpireClaims)
def _expire_claims(db: sqlite3.Connection, ctx: FactContext, c: ExpireClaims) -> Transition:
    return resources.expire_claims(state.claims(db), ctx)


@_handles(DeclareIntent)
def _declare_intent(db: sqlite3.Connection, ctx: FactContext, c: DeclareIntent) -> Transition:
    return resources.declare_intent(
        state.intent(db, c.intent_id),
        ctx,
        intent_id=c.intent_id,
        agent_id=c.agent_id,
        paths=c.paths,
        summary=c.summary,
        change_id=c.change_id,
    )


@_handles(CreateChallenge)
def _create_challenge(db: sqlite3.Connection, ctx: FactContext, c: CreateChallenge) -> Transition:
    return resources.create_challenge(
        state.challenge(db, c.challenge_id),
        ctx,
        challenge_id=c.challenge_id,
        agent_id=c.agent_id,
        resource=c.resource,
        target_agent_id=c.target_agent_id,
        reason=c.reason,
        change_id=c.change_id,
    )


# -- the Change --------------------------------------------------------------------------------
@_handles(AppendChangeEvents)
def _append_change_events(
    db: sqlite3.Connection, ctx: FactContext, c: AppendChangeEvents
) -> Transition:
    return changes.append_change_events(
        state.change(db, c.change_id), ctx, change_id=c.change_id, status=c.status, facts=c.facts
    )


@_handles(CreateChange)
def _create_change(db: sqlite3.Connection, ctx: FactContext, c: CreateChange) -> Transition:
    return changes.create_change(
        state.change(db, c.change_id),
        ctx,
        change_id=c.change_id,
        title=c.title,
        client_request_id=c.client_request_id,
        requested_by=c.requested_by,
        tasks=c.tasks,
    )


@_handles(MoveChange)
def _move_change(db: sqlite3.Connection, ctx: FactContext, c: MoveChange) -> Transition:
    return changes.move_change(
        state.change(db, c.change_id), ctx, to=c.to, reason=c.reason, key=c.key
    )


@_handles(SettleChange)
def _settle_change(db: sqlite3.Connection, ctx: FactContext, c: SettleChange) -> Transition:
    return changes.settle_change(
        state.change(db, c.change_id),
        ctx,
        from_status=c.from_status,
        to=c.to,
        reason=c.reason,
        key=c.key,
    )


# -- Tasks and Agents --------------------------------------------------------------------------
@_handles(RecordTaskStatus)
def _record_task_status(
    db: sqlite3.Connection, ctx: FactContext, c: RecordTaskStatus
) -> Transition:
    return tasks.record_task_status(
        state.task(db, c.task_id),
        ctx,
        change_id=c.change_id,
        task_id=c.task_id,
        status=c.status,
        agent_id=c.agent_id,
        blocked_limit=c.blocked_limit,
        reason=c.reason,
        key=c.key,
    )


@_handles(BlockTaskForDeadLetter)
def _block_task_for_dead_letter(
    db: sqlite3.Connection, ctx: FactContext, c: BlockTaskForDeadLetter
) -> Transition:
    letter = c.command
    return tasks.dead_letter_outcome(
        state.task(db, letter.task_id) if letter.task_id else None,
        state.change(db, letter.change_id or ""),
        ctx,
        command=letter,
        reason=c.reason,
    )


@_handles(RecordAgentWoke)
def _record_agent_woke(db: sqlite3.Connection, ctx: FactContext, c: RecordAgentWoke) -> Transition:
    return agents.record_agent_woke(
        state.change(db, c.change_id),
        ctx,
        change_id=c.change_id,
        task_id=c.task_id,
        agent_id=c.agent_id,
        key=c.key,
        false_wakeup=c.false_wakeup,
    )


@_handles(RecordModelRouted)
def _record_model_routed(
    db: sqlite3.Connection, ctx: FactContext, c: RecordModelRouted
) -> Transition:
    return agents.record_model_routed(
        state.change(db, c.change_id),
        ctx,
        change_id=c.change_id,
        task_id=c.task_id,
        model=c.model,
        purpose=c.purpose,
        key=c.key,
    )


@_handles(StartTask)
def _start_task(db: sqlite3.Connection, ctx: FactContext, c: StartTask) -> Transition:
    return tasks.start_task(state.task(db, c.task_id), ctx, task_id=c.task_id, agent_id=c.agent_id)


@_handles(CompleteTask)
def _complete_task(db: sqlite3.Connection, ctx: FactContext, c: CompleteTask) -> Transition:
    return tasks.complete_task(
        state.tasks(db, c.change_id),
        state.change(db, c.change_id),
        ctx,
        task_id=c.task_id,
        agent_id=c.agent_id,
        changeset_id=c.changeset_id,
    )


@_handles(FailTask)
def _fail_task(db: sqlite3.Connection, ctx: FactContext, c: FailTask) -> Transition:
    return tasks.fail_task(
        state.task(db, c.task_id), ctx, task_id=c.task_id, agent_id=c.agent_id, reason=c.reason
    )


@_handles(RetryBlockedTask)
def _retry_blocked_task(
    db: sqlite3.Connection, ctx: FactContext, c: RetryBlockedTask
) -> Transition:
    return tasks.retry_blocked_task(state.task(db, c.task_id), ctx, attempt=c.attempt)


@_handles(ProposeChangeset)
def _propose_changeset(db: sqlite3.Connection, ctx: FactContext, c: ProposeChangeset) -> Transition:
    return changesets.propose_changeset(
        state.changeset(db, c.changeset_id),
        state.task(db, c.task_id),
        ctx,
        changeset_id=c.changeset_id,
        task_id=c.task_id,
        agent_id=c.agent_id,
        files=c.files,
        base_generation=c.base_generation,
    )


def _admit_agent(
    db: sqlite3.Connection, ctx: FactContext, c: AdmitAgent
) -> tuple[Admission, Transition]:
    task = state.task(db, c.task_id)
    if task is not None and task.change_id != c.change_id:
        task = None  # another Change's Task is no Task of this wake
    return agents.admit_agent(
        task,
        ctx,
        agent_id=c.agent_id,
        active_on_change=state.active_tasks(db, c.change_id),
        limit=c.limit,
    )


# -- Candidates, promotion, releases -----------------------------------------------------------
def _compose_candidate(
    db: sqlite3.Connection, ctx: FactContext, c: ComposeCandidate
) -> tuple[CandidateState, Transition]:
    change = state.change(db, c.change_id)
    composed = [
        cs
        for t in state.tasks(db, c.change_id)
        if t.changeset_id is not None and (cs := state.changeset(db, t.changeset_id))
    ]
    ids = [cs.changeset_id for cs in composed]
    paths = [p for cs in composed for p in cs.paths]
    existing = (
        state.candidate(
            db, candidates.candidate_id_for(candidates.composition_key(c.base_generation, ids))
        )
        if ids
        else None
    )
    return candidates.create_candidate(
        existing,
        change.status if change else None,
        ctx,
        change_id=c.change_id,
        base_generation=c.base_generation,
        changeset_ids=ids,
        paths=paths,
    )


@_handles(DecideCandidate)
def _decide_candidate(db: sqlite3.Connection, ctx: FactContext, c: DecideCandidate) -> Transition:
    candidate = state.candidate(db, c.candidate_id)
    steps = [
        candidates.decide_candidate(
            candidate, ctx, candidate_id=c.candidate_id, to=c.to, reason=c.reason
        )
    ]
    if c.change_to is not None and candidate is not None:
        steps.append(
            changes.move_change(
                state.change(db, candidate.change_id),
                ctx,
                to=c.change_to,
                reason=c.reason,
                key=f"{c.candidate_id}:{c.to}",
            )
        )
    return combine(*steps)


@_handles(RecordPromotion)
def _record_promotion(db: sqlite3.Connection, ctx: FactContext, c: RecordPromotion) -> Transition:
    change = state.change(db, c.change_id)
    if change is not None and change.status != ChangeStatus.AWAITING_APPROVAL.value:
        return Transition()  # moved already (a repeat, or the router's effect)
    requested = _promotion_requested(ctx, c.change_id, c.candidate_id, c.expected_generation)
    moved = changes.move_change(
        change, ctx, to=ChangeStatus.RELEASING, reason="promoted", key=c.candidate_id
    )
    fact = ctx.fact(
        "promotion.completed",
        {
            "candidateId": c.candidate_id,
            "expectedGeneration": c.expected_generation,
            "outcome": "promoted",
        },
        change_id=c.change_id,
        key=c.candidate_id,
    )
    return combine(Transition(facts=(requested,)), moved, Transition(facts=(fact,)))


@_handles(RecordPromotionRefused)
def _record_promotion_refused(
    db: sqlite3.Connection, ctx: FactContext, c: RecordPromotionRefused
) -> Transition:
    requested = _promotion_requested(ctx, c.change_id, c.candidate_id, c.expected_generation)
    fact = ctx.fact(
        "promotion.rejected",
        {
            "candidateId": c.candidate_id,
            "expectedGeneration": c.expected_generation,
            "outcome": "rejected",
            "reason": c.reason[:1000],
        },
        change_id=c.change_id,
        key=f"{c.candidate_id}:{c.expected_generation}",
    )
    return Transition(facts=(requested, fact))


def _promotion_requested(
    ctx: FactContext, change_id: str, candidate_id: str, expected_generation: int
) -> Event:
    """``promotion.requested``: an approval asked for ``candidate_id`` on
    ``expected_generation``. Keyed by both, so the approval that is promoted and the one that
    is refused each record it once, and a repeat (or the router's effect finishing an
    interrupted approval) adds nothing."""
    return ctx.fact(
        "promotion.requested",
        {"candidateId": candidate_id, "expectedGeneration": expected_generation},
        change_id=change_id,
        key=f"{candidate_id}:{expected_generation}",
    )


@_handles(StartRelease)
def _start_release(db: sqlite3.Connection, ctx: FactContext, c: StartRelease) -> Transition:
    return releases.start_release(
        state.release(db, releases.release_id_for(ctx.project_id, c.generation)),
        ctx,
        change_id=c.change_id,
        generation=c.generation,
        candidate_id=c.candidate_id,
        app_name=c.app_name,
    )


@_handles(FinishRelease)
def _finish_release(db: sqlite3.Connection, ctx: FactContext, c: FinishRelease) -> Transition:
    release = state.release(db, c.release_id)
    finished = releases.finish_release(
        release, ctx, release_id=c.release_id, outcome=c.outcome, reason=c.reason
    )
    assert release is not None  # finish_release refused a missing one
    end = (
        ChangeStatus.COMPLETED
        if ReleaseStatus(c.outcome) is ReleaseStatus.COMPLETED
        else ChangeStatus.FAILED
    )
    moved = changes.move_change(
        state.change(db, release.change_id), ctx, to=end, reason=c.reason, key=c.release_id
    )
    return combine(finished, moved)


# -- project administration --------------------------------------------------------------------
@_handles(SetProjectStatus)
def _set_project_status(
    db: sqlite3.Connection, ctx: FactContext, c: SetProjectStatus
) -> Transition:
    return project.set_project_status(
        state.project_status(db, ctx.project_id), ctx, to=c.to, reason=c.reason
    )


@_handles(ProvisionApp)
def _provision_app(db: sqlite3.Connection, ctx: FactContext, c: ProvisionApp) -> Transition:
    return project.provision_app(
        state.app_status(db, c.app_name),
        state.project_status(db, ctx.project_id),
        ctx,
        app_name=c.app_name,
    )


@_handles(RemoveApp)
def _remove_app(db: sqlite3.Connection, ctx: FactContext, c: RemoveApp) -> Transition:
    return project.remove_app(
        state.app_status(db, c.app_name), ctx, app_name=c.app_name, reason=c.reason
    )
