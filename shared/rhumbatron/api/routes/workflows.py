"""``/workflows``: the workflow engine's instances, read and steered by an operator — list,
the history of steps with their failures and attempts, cancel, terminate and redrive — on
either engine (Step Functions in the cloud, the in-process engine locally).

Platform tokens only (tenant ``*``): an instance is the platform's, not a tenant's record.
Reading needs ``changes:read``, steering ``changes:write``; every call that steers is
audited (``GET /audit``). Each control action is idempotent: it acts on an instance in the
state it applies to and answers ``done: false`` for one already past it.
"""

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from rhumbatron.api.auth import (
    SCOPE_CHANGES_READ,
    SCOPE_CHANGES_WRITE,
    Principal,
    platform_principal,
)
from rhumbatron.api.dependencies import Runtime, get_principal
from rhumbatron.api.errors import error_responses
from rhumbatron.api.lifecycle_schemas import KEY_ID
from rhumbatron.api.workflow_schemas import (
    StopRequest,
    WorkflowBody,
    WorkflowControlBody,
    WorkflowHistoryBody,
    WorkflowListBody,
    WorkflowName,
)
from rhumbatron.errors import WorkflowNotFoundError
from rhumbatron.workflows.engine import INSTANCE_ID_PATTERN, WorkflowControl, WorkflowStatus

__all__ = ["router"]

router = APIRouter()

WorkflowsReader = Annotated[
    Principal,
    Depends(platform_principal(get_principal, scope=SCOPE_CHANGES_READ, doing="the workflows")),
]
WorkflowsWriter = Annotated[
    Principal,
    Depends(
        platform_principal(get_principal, scope=SCOPE_CHANGES_WRITE, doing="steering a workflow")
    ),
]
InstanceId = Annotated[
    str,
    Path(
        alias="instanceId",
        pattern=INSTANCE_ID_PATTERN.pattern,
        description="The Candidate ID (verification) or the release ID (release).",
    ),
]
_E403 = "The token lacks the scope, or is not a platform token (tenant '*')."
_E404 = "No instance of that workflow with that ID."
_E503 = "The workflow engine did not answer, or refused (throttled, denied, not configured)."


def _found(control: WorkflowControl | None, workflow: str, instance_id: str) -> WorkflowControl:
    if control is None:
        raise WorkflowNotFoundError(f"no {workflow} instance {instance_id!r}")
    return control


@router.get(
    "/workflows/{workflow}",
    response_model=WorkflowListBody,
    summary="List a workflow's instances, newest first",
    responses=error_responses(401, 403, 422, 503, e403=_E403, e503=_E503),
)
async def list_workflows(
    *,
    runtime: Runtime,
    principal: WorkflowsReader,
    workflow: WorkflowName,
    status: Annotated[WorkflowStatus | None, Query(description="Only those in it.")] = None,
    change_id: Annotated[
        str | None,
        Query(alias="changeId", pattern=KEY_ID, description="Only the Change's instances."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> WorkflowListBody:
    """Instances of ``workflow`` (``verification``: one per Candidate; ``release``: one per
    promoted generation), each with its status, error, project and Change. Use it to find
    the failed or stuck ones, or a Change's; then read one's history."""
    engine = runtime.lifecycle().engine
    instances = await engine.list_instances(
        workflow, status=status, change_id=change_id, limit=limit
    )
    return WorkflowListBody(items=[WorkflowBody.of(instance) for instance in instances])


@router.get(
    "/workflows/{workflow}/{instanceId}",
    response_model=WorkflowHistoryBody,
    summary="Read a workflow instance with the history of its steps",
    responses=error_responses(401, 403, 404, 422, 503, e403=_E403, e404=_E404, e503=_E503),
)
async def read_workflow(
    runtime: Runtime, principal: WorkflowsReader, workflow: WorkflowName, instance_id: InstanceId
) -> WorkflowHistoryBody:
    """The instance (by Candidate ID or release ID) with every step in order: succeeded,
    failed (each failure an attempt, with its error), the step a running instance waits on,
    and when that step is retried next where the engine says."""
    history = await runtime.lifecycle().engine.history(workflow, instance_id)
    if history is None:
        raise WorkflowNotFoundError(f"no {workflow} instance {instance_id!r}")
    return WorkflowHistoryBody.of(history)


@router.post(
    "/workflows/{workflow}/{instanceId}/cancel",
    response_model=WorkflowControlBody,
    summary="Cancel a running workflow instance for good",
    responses=error_responses(401, 403, 404, 422, 503, e403=_E403, e404=_E404, e503=_E503),
)
async def cancel_workflow(
    runtime: Runtime,
    principal: WorkflowsWriter,
    workflow: WorkflowName,
    instance_id: InstanceId,
    body: StopRequest,
) -> WorkflowControlBody:
    """Stops a running instance before its next step, as ``cancelled`` with ``reason``; it
    is never redriven (its Candidate's verification or its release ends as failed in the
    ledger). Precondition: the instance is running; otherwise nothing changes
    (``done: false``). Idempotent. Audited."""
    engine = runtime.lifecycle().engine
    control = await engine.cancel(workflow, instance_id, body.reason)
    return WorkflowControlBody.of(_found(control, workflow, instance_id))


@router.post(
    "/workflows/{workflow}/{instanceId}/terminate",
    response_model=WorkflowControlBody,
    summary="Terminate a running workflow instance as a failure",
    responses=error_responses(401, 403, 404, 422, 503, e403=_E403, e404=_E404, e503=_E503),
)
async def terminate_workflow(
    runtime: Runtime,
    principal: WorkflowsWriter,
    workflow: WorkflowName,
    instance_id: InstanceId,
    body: StopRequest,
) -> WorkflowControlBody:
    """Stops a running instance now, as ``failed`` with ``reason``: a redrive can run it on
    from the step it stopped at. Precondition: the instance is running; otherwise nothing
    changes (``done: false``). Idempotent. Audited."""
    engine = runtime.lifecycle().engine
    control = await engine.terminate(workflow, instance_id, body.reason)
    return WorkflowControlBody.of(_found(control, workflow, instance_id))


@router.post(
    "/workflows/{workflow}/{instanceId}/redrive",
    response_model=WorkflowControlBody,
    summary="Run a failed workflow instance again from its failed step",
    responses=error_responses(401, 403, 404, 422, 503, e403=_E403, e404=_E404, e503=_E503),
)
async def redrive_workflow(
    runtime: Runtime, principal: WorkflowsWriter, workflow: WorkflowName, instance_id: InstanceId
) -> WorkflowControlBody:
    """Runs a failed (or terminated) instance again from its failed step; its finished
    steps are not run again, so each step's own idempotency key still holds. Precondition:
    the instance failed; a cancelled or succeeded one is left alone (``done: false``), as is
    one Step Functions will not redrive (over 14 days, say), with its reason. Audited."""
    control = await runtime.lifecycle().engine.redrive(workflow, instance_id)
    return WorkflowControlBody.of(_found(control, workflow, instance_id))
