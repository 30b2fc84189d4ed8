"""A Change's Tasks: the list, and the callbacks an external (webhook) Agent reports with on
the Task it was woken for — start, intents, claims, challenges, changesets, complete, fail.

Each callback is one :meth:`~rhumbatron.lifecycle.requests.AgentCallbacks.report`, idempotent
on its natural key; the facts' actor is ``agent:<agentId>``. The Task is found first (named
as planned, ``t1``, or as its wake names it, ``<changeId>.t1``); the agent ID is the project's
tenant's, so another tenant's agent of that ID is never consulted and a caller learns nothing
of it. Intents, claims and challenges then ask whether the Agent holds the Task
(:func:`~rhumbatron.lifecycle.requests.require_holder`); the other callbacks check it
themselves.
"""

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Query

from rhumbatron.actors.shard_commands import ReleaseClaim
from rhumbatron.api.access import project_owner
from rhumbatron.api.dependencies import AgentsWriter, ChangesReader, Runtime
from rhumbatron.api.errors import domain_refusal, error_responses
from rhumbatron.api.lifecycle_schemas import (
    AGENT_ID,
    RESOURCE,
    ChallengeBody,
    ChallengeRequest,
    ChangesetBody,
    ChangesetRequest,
    ClaimBody,
    ClaimRequest,
    CompleteTaskRequest,
    FailTaskRequest,
    IntentBody,
    IntentRequest,
    StartTaskRequest,
    TaskBody,
    TaskListBody,
)
from rhumbatron.api.routes._presets import (
    NO_CHANGE,
    NO_TASK,
    ChangeId,
    ProjectId,
    Responses,
    TaskId,
    record_errors,
)
from rhumbatron.lifecycle.lookups import existing_change, live_claim, reported_task, task_state
from rhumbatron.lifecycle.requests import require_holder

if TYPE_CHECKING:
    from collections.abc import Callable

    from rhumbatron.actors.shard_commands import AgentReport
    from rhumbatron.api.auth import Principal
    from rhumbatron.api.ports import ApiRuntime
    from rhumbatron.domain.tasks import TaskState

__all__ = ["router"]

_TASK_PATH = "/projects/{projectId}/changes/{changeId}/tasks/{taskId}"

router = APIRouter()


def _report_errors() -> Responses:
    return error_responses(
        401,
        403,
        404,
        409,
        422,
        503,
        e403="The token lacks agents:write.",
        e404=NO_TASK,
        e409="The Agent does not hold the Task, or the state refuses the report (another "
        "Agent's claim, a changeset or challenge ID reused for something else, an ended "
        "Change).",
    )


@router.get(
    "/projects/{projectId}/changes/{changeId}/tasks",
    response_model=TaskListBody,
    summary="List a Change's Tasks",
    responses=record_errors(NO_CHANGE),
)
async def list_tasks(
    runtime: Runtime, principal: ChangesReader, project_id: ProjectId, change_id: ChangeId
) -> TaskListBody:
    # No docstring, as before the routes moved here: FastAPI would publish one as the
    # operation's description, and the OpenAPI document stays as it was. The Change's
    # Tasks, in the order the shard keeps them.
    project_owner(runtime, principal, project_id)
    shard, _ = existing_change(runtime, project_id, change_id)
    return TaskListBody(items=[TaskBody.of(t) for t in shard.tasks_of_change(change_id)])


@router.post(
    f"{_TASK_PATH}/start",
    response_model=TaskBody,
    summary="Agent: start the Task",
    responses=_report_errors(),
)
async def start_task(
    *,
    runtime: Runtime,
    principal: AgentsWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    task_id: TaskId,
    body: StartTaskRequest,
) -> TaskBody:
    """``assigned → running`` (``task.started``); starting it again is nothing."""
    task = _report(
        runtime,
        principal,
        project_id,
        change_id,
        task_id,
        refusal="not_holder",
        command=lambda task: body.command(task.task_id),
    )
    return _task_body(runtime, project_id, change_id, task.task_id)


@router.post(
    f"{_TASK_PATH}/intents",
    response_model=IntentBody,
    summary="Agent: declare an intent",
    responses=_report_errors(),
)
async def declare_intent(
    *,
    runtime: Runtime,
    principal: AgentsWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    task_id: TaskId,
    body: IntentRequest,
) -> IntentBody:
    """``intent.declared``, or ``intent.changed`` when the same intent ID names other
    paths; the same again is nothing. Agents whose work overlaps the paths are woken."""
    task = _report(
        runtime,
        principal,
        project_id,
        change_id,
        task_id,
        refusal="intent_refused",
        command=lambda _: body.command(change_id),
        holder=body.agent_id,
    )
    return IntentBody(
        intent_id=body.intent_id,
        agent_id=body.agent_id,
        task_id=task.task_id,
        paths=body.paths,
        summary=body.summary,
    )


@router.post(
    f"{_TASK_PATH}/claims",
    response_model=ClaimBody,
    summary="Agent: claim a resource",
    responses=_report_errors(),
)
async def acquire_claim(
    *,
    runtime: Runtime,
    principal: AgentsWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    task_id: TaskId,
    body: ClaimRequest,
) -> ClaimBody:
    """An exclusive claim for the claim TTL; its holder claiming again renews it. A
    resource another Agent holds is 409 until it is released or expires."""
    _report(
        runtime,
        principal,
        project_id,
        change_id,
        task_id,
        refusal="claimed_by_another",
        command=lambda _: body.command(),
        holder=body.agent_id,
    )
    return _claim_body(runtime, project_id, body.resource, body.agent_id)


@router.delete(
    f"{_TASK_PATH}/claims",
    response_model=ClaimBody,
    summary="Agent: release a claim",
    responses=_report_errors(),
)
async def release_claim(
    *,
    runtime: Runtime,
    principal: AgentsWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    task_id: TaskId,
    agent_id: Annotated[str, Query(alias="agentId", pattern=AGENT_ID)],
    resource: Annotated[str, Query(pattern=RESOURCE)],
) -> ClaimBody:
    """``claim.released``; releasing a resource nobody holds is nothing. Only its
    holder releases it (409 otherwise). The Task need not be held any more: an Agent
    cleans up after completing."""
    _report(
        runtime,
        principal,
        project_id,
        change_id,
        task_id,
        refusal="claimed_by_another",
        command=lambda _: ReleaseClaim(resource=resource, agent_id=agent_id),
    )
    return _claim_body(runtime, project_id, resource, agent_id)


@router.post(
    f"{_TASK_PATH}/challenges",
    response_model=ChallengeBody,
    summary="Agent: challenge another agent's claim or intent",
    responses=_report_errors(),
)
async def create_challenge(
    *,
    runtime: Runtime,
    principal: AgentsWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    task_id: TaskId,
    body: ChallengeRequest,
) -> ChallengeBody:
    """``challenge.created`` on the resource: the Agents whose work overlaps it are
    woken (never the challenger). The same challenge ID again is nothing; reused for
    another challenge, 409."""
    task = _report(
        runtime,
        principal,
        project_id,
        change_id,
        task_id,
        refusal="challenge_refused",
        command=lambda _: body.command(change_id),
        holder=body.agent_id,
    )
    return ChallengeBody(
        challenge_id=body.challenge_id,
        agent_id=body.agent_id,
        task_id=task.task_id,
        resource=body.resource,
        target_agent_id=body.target_agent_id,
        reason=body.reason.strip(),
    )


@router.post(
    f"{_TASK_PATH}/changesets",
    response_model=ChangesetBody,
    summary="Agent: propose a changeset",
    responses=_report_errors(),
)
async def propose_changeset(
    *,
    runtime: Runtime,
    principal: AgentsWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    task_id: TaskId,
    body: ChangesetRequest,
) -> ChangesetBody:
    """``changeset.proposed`` on the current canonical generation; the same ID with the
    same files again is nothing, with other files 409."""
    world = runtime.lifecycle().world
    _report(
        runtime,
        principal,
        project_id,
        change_id,
        task_id,
        refusal="changeset_refused",
        # The platform, not the Agent, says which base: canonical's generation now.
        command=lambda task: body.command(task.task_id, world.canonical_generation(project_id)),
    )
    shard = world.change_shard(project_id, change_id)
    changeset = shard.changeset(body.changeset_id)
    assert changeset is not None  # the call above recorded it, or had it already
    return ChangesetBody.of(changeset)


@router.post(
    f"{_TASK_PATH}/complete",
    response_model=TaskBody,
    summary="Agent: complete the Task",
    responses=_report_errors(),
)
async def complete_task(
    *,
    runtime: Runtime,
    principal: AgentsWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    task_id: TaskId,
    body: CompleteTaskRequest,
) -> TaskBody:
    """``task.completed`` (its dependents become ready; the last Task moves the Change
    to verifying); the same report again is nothing."""
    task = _report(
        runtime,
        principal,
        project_id,
        change_id,
        task_id,
        refusal="not_holder",
        command=lambda task: body.command(change_id, task.task_id),
    )
    return _task_body(runtime, project_id, change_id, task.task_id)


@router.post(
    f"{_TASK_PATH}/fail",
    response_model=TaskBody,
    summary="Agent: fail the Task",
    responses=_report_errors(),
)
async def fail_task(
    *,
    runtime: Runtime,
    principal: AgentsWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    task_id: TaskId,
    body: FailTaskRequest,
) -> TaskBody:
    """``task.failed`` with the reason (the Change is settled); again is nothing."""
    task = _report(
        runtime,
        principal,
        project_id,
        change_id,
        task_id,
        refusal="not_holder",
        command=lambda task: body.command(task.task_id),
    )
    return _task_body(runtime, project_id, change_id, task.task_id)


def _report(
    runtime: "ApiRuntime",
    principal: "Principal",
    project_id: str,
    change_id: str,
    task_id: str,
    *,
    refusal: str,
    command: "Callable[[TaskState], AgentReport]",
    holder: str | None = None,
) -> "TaskState":
    """Report on the Task as its Agent, in the project owner's tenant: the Task must exist
    (404); ``holder``, when given, must hold it (409 ``not_holder``); the report's own
    refusal answers 409 with the code ``refusal``. Returns the Task as it was found."""
    owner = project_owner(runtime, principal, project_id)
    task = reported_task(runtime, project_id, change_id, task_id)
    if holder is not None:
        require_holder(task, holder)
    with domain_refusal(refusal):
        runtime.lifecycle().callbacks.report(
            owner, project_id=project_id, change_id=change_id, command=command(task)
        )
    return task


def _task_body(runtime: "ApiRuntime", project_id: str, change_id: str, task_id: str) -> TaskBody:
    return TaskBody.of(task_state(runtime, project_id, change_id, task_id))


def _claim_body(runtime: "ApiRuntime", project_id: str, resource: str, agent_id: str) -> ClaimBody:
    claim = live_claim(runtime, project_id, resource, agent_id)
    if claim is None:
        return ClaimBody(resource=resource, agent_id=agent_id, held=False)
    return ClaimBody(resource=resource, agent_id=agent_id, held=True, expires_at=claim.expires_at)
