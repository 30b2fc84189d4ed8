"""What people and agents ask of the lifecycle: create a Change, approve or decline it, and
the agent callbacks (intent, claims, challenge, changeset, started, completed, failed).

The API's routes and the scripted agent both call these, so an external agent reporting
through HTTP and a local one playing a sample script take the same path. Each call is one
actor transaction whose facts commit with it; each is idempotent on its natural key.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import (
    AcquireClaim,
    AgentReport,
    CompleteTask,
    CreateChallenge,
    CreateChange,
    DeclareIntent,
    FailTask,
    MoveChange,
    ProposeChangeset,
    RecordPromotion,
    RecordPromotionRefused,
    ReleaseClaim,
    StartTask,
)
from rhumbatron.domain.candidates import CandidateState, CandidateStatus
from rhumbatron.domain.changes import ChangeState, ChangeStatus, TaskPlan, check_work_graph
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import DomainError, NotHolderError, PromotionConflictError

if TYPE_CHECKING:
    from rhumbatron.domain.tasks import TaskState
    from rhumbatron.lifecycle.context import LifecycleContext
    from rhumbatron.lifecycle.world import LifecycleWorld

__all__ = [
    "AgentCallbacks",
    "ChangeRequests",
    "CreatedChange",
    "qualified_task_id",
    "require_holder",
]


def qualified_task_id(change_id: str, task_id: str) -> str:
    """``<change>.<task>``: the Task's ID in the shard, in its Events and in its commands."""
    return task_id if task_id.startswith(f"{change_id}.") else f"{change_id}.{task_id}"


def require_holder(task: TaskState, agent_id: str) -> None:
    """Only the admitted Agent reports on a Task. Intents, claims and challenges are the
    shard's own facts, not the Task's: their callbacks do not ask who holds the Task, so
    a caller reporting them on a Task asks this first."""
    if task.agent_id != agent_id or not task.active:
        raise NotHolderError(
            f"agent {agent_id!r} does not hold task {task.task_id!r} (it is "
            f"{task.status}); only the admitted agent reports on a task"
        )


def _qualified_plans(change_id: str, tasks: Sequence[TaskPlan]) -> list[TaskPlan]:
    """The plan's Tasks with their IDs (and dependencies) qualified by their Change."""
    # Task IDs are qualified by their Change: a shard holds the Tasks of many Changes,
    # and two requests may both name a task "build".
    return [
        TaskPlan(
            task_id=qualified_task_id(change_id, t.task_id),
            title=t.title,
            agent_id=t.agent_id,
            depends_on=tuple(qualified_task_id(change_id, d) for d in t.depends_on),
            script=t.script,
        )
        for t in tasks
    ]


@dataclass(frozen=True, slots=True)
class CreatedChange:
    change_id: str
    created: bool  # False: the same client request was seen before (the first Change)


@dataclass
class ChangeRequests:
    """Creating and deciding Changes."""

    app: LifecycleContext
    world: LifecycleWorld

    def create_change(
        self,
        caller: Caller,
        *,
        project_id: str,
        client_request_id: str,
        title: str,
        tasks: Sequence[TaskPlan],
    ) -> CreatedChange:
        """Create the Change once per ``(project_id, client_request_id)``: the product
        database's unique key (``INSERT … ON CONFLICT DO NOTHING``) picks the Change ID, and a
        repeat returns the first Change. The shard write is idempotent too, so a repeat after
        a crash between the two finishes the first creation."""
        if not self.world.project_exists(project_id):
            raise DomainError(f"project {project_id!r} does not exist; provision it first")
        status = self.world.project_status(project_id)
        if status != "active":
            raise DomainError(f"project {project_id!r} is {status}; changes need an active one")
        # The graph is checked before the request key is taken: a refused graph must not
        # leave the client's key pointing at a Change that was never created.
        check_work_graph(client_request_id, tasks)
        change_id, inserted = self._claim_request(caller, project_id, client_request_id)
        shard = self.world.change_shard(project_id, change_id)
        shard.apply(
            Caller(caller.tenant_id, caller.actor, change_id, caller.caused_by),
            CreateChange(
                change_id=change_id,
                title=title,
                client_request_id=client_request_id,
                requested_by=caller.actor,
                tasks=tuple(_qualified_plans(change_id, tasks)),
            ),
        )
        return CreatedChange(change_id, created=inserted)

    def _claim_request(
        self, caller: Caller, project_id: str, client_request_id: str
    ) -> tuple[str, bool]:
        """The Change ID of ``(project_id, client_request_id)``, and whether this call
        inserted it (a new ID) rather than finding the first request's."""
        candidate_id = f"chg_{uuid.uuid4().hex[:20]}"
        with self.app.product().transaction() as db:
            inserted = db.execute(
                "INSERT INTO change_requests (project_id, client_request_id, change_id, "
                "tenant_id, created_at_s) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (project_id, client_request_id) DO NOTHING",
                (
                    project_id,
                    client_request_id,
                    candidate_id,
                    caller.tenant_id,
                    self.app.clock.now().timestamp(),
                ),
            ).rowcount
            change_id = str(
                db.execute(
                    "SELECT change_id FROM change_requests WHERE project_id = ? AND "
                    "client_request_id = ?",
                    (project_id, client_request_id),
                ).fetchone()[0]
            )
        return change_id, inserted == 1

    def change(self, project_id: str, change_id: str) -> ChangeState | None:
        return self.world.change_shard(project_id, change_id).change_state(change_id)

    def _awaiting(self, project_id: str, change_id: str) -> tuple[ResourceShard, ChangeState]:
        shard = self.world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is None:
            raise DomainError(f"no change {change_id!r} in project {project_id!r}")
        return shard, change

    def approve(self, caller: Caller, *, project_id: str, change_id: str) -> CandidateState:
        """Promote the Change's verified Candidate (``decidePromotion`` on the project root:
        candidate + expected generation, ``already_promoted`` on a repeat) and move the
        Change to ``releasing``. The router's ``canonical.advanced`` rule does the rest."""
        shard, change = self._awaiting(project_id, change_id)
        if change.status in (ChangeStatus.RELEASING.value, ChangeStatus.COMPLETED.value):
            # An approval repeated after the promotion: the answer is the promoted Candidate
            # (still ``verified`` until the router's canonical.advanced effect marks it).
            chosen = [
                c
                for c in shard.candidates(change_id=change_id)
                if c.status in (CandidateStatus.PROMOTED, CandidateStatus.VERIFIED)
            ]
            if chosen:
                return chosen[-1]
        if change.status != ChangeStatus.AWAITING_APPROVAL.value:
            raise DomainError(
                f"change {change_id!r} is {change.status}; only a change awaiting approval "
                "can be approved"
            )
        verified = [
            c for c in shard.candidates(change_id=change_id) if c.status is CandidateStatus.VERIFIED
        ]
        if not verified:
            raise DomainError(f"change {change_id!r} has no verified candidate to promote")
        candidate = verified[-1]
        try:
            self.app.project_root(project_id).promote(
                caller,
                candidate_id=candidate.candidate_id,
                artifact_id=f"art_{candidate.candidate_id.removeprefix('cand_')}",
                expected_generation=candidate.base_generation,
                change_ids=(change_id,),
            )
        except DomainError as exc:
            shard.apply(
                caller,
                RecordPromotionRefused(
                    change_id=change_id,
                    candidate_id=candidate.candidate_id,
                    expected_generation=candidate.base_generation,
                    reason=str(exc),
                ),
            )
            raise PromotionConflictError(str(exc)) from exc
        shard.apply(
            caller,
            RecordPromotion(
                change_id=change_id,
                candidate_id=candidate.candidate_id,
                expected_generation=candidate.base_generation,
            ),
        )
        return candidate

    def decline(self, caller: Caller, *, project_id: str, change_id: str, reason: str) -> None:
        shard, _ = self._awaiting(project_id, change_id)
        shard.apply(
            caller,
            MoveChange(change_id=change_id, to=ChangeStatus.DECLINED, reason=reason or "declined"),
        )

    def cancel(self, caller: Caller, *, project_id: str, change_id: str, reason: str) -> None:
        shard, _ = self._awaiting(project_id, change_id)
        shard.apply(
            caller,
            MoveChange(
                change_id=change_id, to=ChangeStatus.CANCELLED, reason=reason or "cancelled"
            ),
        )


@dataclass
class AgentCallbacks:
    """What an Agent reports while it works on a Task. ``agent:<id>`` is the actor of every
    fact, so the router never wakes an Agent for its own writes."""

    app: LifecycleContext
    world: LifecycleWorld

    def report(
        self, tenant_id: str, *, project_id: str, change_id: str, command: AgentReport
    ) -> None:
        """Apply an Agent's report on a Task of ``change_id`` in the shard that owns what it
        names: a Task's report in its Change's shard, an intent in the shard of its first
        path, a claim or a challenge in the shard of its resource.

        An intent is ``intent.declared`` (first time) or ``intent.changed`` (new paths). A
        challenge is ``agent_id``'s objection to ``target_agent_id``'s claim or intent on
        its resource (None: whoever holds or means to touch it); the router wakes the active
        Agents whose resources overlap it. The same challenge again is nothing; its ID reused
        for another challenge is refused."""
        resource, correlation_id = _addressed(command, change_id)
        self.app.resource_shard(project_id, resource).apply(
            Caller(tenant_id, f"agent:{command.agent_id}", correlation_id), command
        )


def _addressed(command: AgentReport, change_id: str) -> tuple[str, str]:
    """The resource key whose shard applies an Agent's report, and the report's correlation
    ID (what it is about: its Task, intent, resource, challenge or changeset)."""
    match command:
        case DeclareIntent(intent_id=intent_id, paths=paths):
            if not paths:
                raise DomainError(f"intent {intent_id!r} names no paths")
            return paths[0], intent_id
        case AcquireClaim(resource=resource) | ReleaseClaim(resource=resource):
            return resource, resource
        case CreateChallenge(resource=resource, challenge_id=challenge_id):
            return resource, challenge_id
        case ProposeChangeset(changeset_id=changeset_id):
            return change_resource_key(change_id), changeset_id
        case StartTask(task_id=task_id) | CompleteTask(task_id=task_id) | FailTask(task_id=task_id):
            return change_resource_key(change_id), task_id
