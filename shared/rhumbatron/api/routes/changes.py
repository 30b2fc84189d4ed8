"""``/projects/{projectId}/changes``: request a Change, read and list them, approve, decline
or cancel one; the project's Candidates.

The routes call :class:`~rhumbatron.lifecycle.requests.ChangeRequests` as a person of the
project's tenant (``user:<subject>``); a Change that does not exist is a 404 before any
request is made of it.
"""

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Body, Query, Response

from rhumbatron.api.access import api_caller, project_owner
from rhumbatron.api.dependencies import ChangesReader, ChangesWriter, Runtime
from rhumbatron.api.errors import domain_refusal
from rhumbatron.api.lifecycle_schemas import (
    CandidateBody,
    CandidateListBody,
    ChangeBody,
    ChangeListBody,
    ChangeSummary,
    CreateChangeRequest,
    ReasonRequest,
)
from rhumbatron.api.routes._presets import (
    NO_CHANGE,
    NO_PROJECT,
    ChangeId,
    ProjectId,
    record_errors,
    refusable_errors,
)
from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.errors import ConflictError, DomainError, PromotionConflictError
from rhumbatron.lifecycle.lookups import change_detail, existing_change
from rhumbatron.lifecycle.project_requests import ProjectRequests

if TYPE_CHECKING:
    from collections.abc import Callable

    from rhumbatron.api.auth import Principal
    from rhumbatron.api.ports import ApiRuntime

__all__ = ["router"]

router = APIRouter()


@router.post(
    "/projects/{projectId}/changes",
    response_model=ChangeBody,
    status_code=201,
    summary="Request a Change",
    responses={
        200: {
            "model": ChangeBody,
            "description": "The same clientRequestId was seen in this project: the first "
            "Change, unchanged.",
        },
        **refusable_errors(
            e404=NO_PROJECT,
            e409="The project is not active.",
            e422="The request is invalid (a cycle in the tasks, ...); `field` names the "
            "first bad field.",
        ),
    },
)
async def create_change(
    runtime: Runtime,
    principal: ChangesWriter,
    project_id: ProjectId,
    body: CreateChangeRequest,
    response: Response,
) -> ChangeBody:
    """Creates the Change ``open`` with its work graph (201). The same
    ``clientRequestId`` in the same project answers the first Change (200) and creates
    nothing, whatever else the repeat says."""
    owner = project_owner(runtime, principal, project_id)
    ProjectRequests(runtime).require_active(project_id, "request a change")
    # A Task's agent ID names an Agent of this tenant only (the wake looks it up in the
    # project's tenant): no other tenant's registry is consulted, so none is revealed.
    with domain_refusal(invalid_field="tasks"):
        created = runtime.lifecycle().requests.create_change(
            api_caller(principal, owner, body.client_request_id),
            project_id=project_id,
            client_request_id=body.client_request_id,
            title=body.title,
            tasks=body.plans(),
        )
    response.status_code = 201 if created.created else 200
    return _change_body(runtime, project_id, created.change_id)


@router.get(
    "/projects/{projectId}/changes",
    response_model=ChangeListBody,
    summary="List a project's Changes",
    responses=record_errors(NO_PROJECT),
)
async def list_changes(
    runtime: Runtime,
    principal: ChangesReader,
    project_id: ProjectId,
    status: Annotated[
        list[ChangeStatus] | None, Query(description="Only these states (repeatable).")
    ] = None,
) -> ChangeListBody:
    """Oldest first; every state unless ``status`` names some."""
    project_owner(runtime, principal, project_id)
    wanted = [s.value for s in status] if status else None
    changes = runtime.lifecycle().world.changes(project_id, wanted)
    return ChangeListBody(items=[ChangeSummary.of(project_id, c) for c in changes])


@router.get(
    "/projects/{projectId}/changes/{changeId}",
    response_model=ChangeBody,
    summary="Read a Change",
    responses=record_errors(NO_CHANGE),
)
async def read_change(
    runtime: Runtime, principal: ChangesReader, project_id: ProjectId, change_id: ChangeId
) -> ChangeBody:
    """Its status and reason, title, timestamps, Tasks, Candidates and releases."""
    project_owner(runtime, principal, project_id)
    return _change_body(runtime, project_id, change_id)


@router.post(
    "/projects/{projectId}/changes/{changeId}/approve",
    response_model=CandidateBody,
    summary="Approve a Change: promote its verified Candidate",
    responses=refusable_errors(
        e404=NO_CHANGE,
        e409="The Change is not awaiting approval, or canonical moved past its "
        "Candidate's base (it is recomposed; approve again once it is verified).",
    ),
)
async def approve_change(
    runtime: Runtime, principal: ChangesWriter, project_id: ProjectId, change_id: ChangeId
) -> CandidateBody:
    """Promotes the verified Candidate (canonical advances) and moves the Change to
    ``releasing``; approving a Change already promoted answers its Candidate again."""
    owner = project_owner(runtime, principal, project_id)
    existing_change(runtime, project_id, change_id)
    caller = api_caller(principal, owner, change_id)
    try:
        candidate = runtime.lifecycle().requests.approve(
            caller, project_id=project_id, change_id=change_id
        )
    except PromotionConflictError as exc:
        raise ConflictError(str(exc), code="promotion_conflict") from None
    except DomainError as exc:
        raise ConflictError(str(exc), code="not_awaiting_approval") from None
    return CandidateBody.of(candidate)


@router.post(
    "/projects/{projectId}/changes/{changeId}/decline",
    response_model=ChangeBody,
    summary="Decline a Change awaiting approval",
    responses=refusable_errors(e404=NO_CHANGE, e409="The Change is not awaiting approval."),
)
async def decline_change(
    runtime: Runtime,
    principal: ChangesWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    body: Annotated[ReasonRequest | None, Body()] = None,
) -> ChangeBody:
    """``awaiting_approval → declined``; declining it again is nothing."""
    return _end_change(
        runtime,
        principal,
        project_id,
        change_id,
        body=body,
        end=runtime.lifecycle().requests.decline,
    )


@router.post(
    "/projects/{projectId}/changes/{changeId}/cancel",
    response_model=ChangeBody,
    summary="Cancel a Change",
    responses=refusable_errors(e404=NO_CHANGE, e409="The Change is releasing or has ended."),
)
async def cancel_change(
    runtime: Runtime,
    principal: ChangesWriter,
    project_id: ProjectId,
    change_id: ChangeId,
    body: Annotated[ReasonRequest | None, Body()] = None,
) -> ChangeBody:
    """From open, verifying or awaiting approval to ``cancelled``; again is nothing."""
    return _end_change(
        runtime,
        principal,
        project_id,
        change_id,
        body=body,
        end=runtime.lifecycle().requests.cancel,
    )


@router.get(
    "/projects/{projectId}/candidates",
    response_model=CandidateListBody,
    summary="List a project's Candidates",
    responses=record_errors(NO_PROJECT),
)
async def list_candidates(
    runtime: Runtime, principal: ChangesReader, project_id: ProjectId
) -> CandidateListBody:
    """Every Candidate of the project, each with its Change's status."""
    project_owner(runtime, principal, project_id)
    return CandidateListBody.of(runtime.lifecycle().world.candidates(project_id))


def _end_change(
    runtime: "ApiRuntime",
    principal: "Principal",
    project_id: str,
    change_id: str,
    *,
    body: ReasonRequest | None,
    end: "Callable[..., object]",
) -> ChangeBody:
    """End the Change with ``end`` (a decline or a cancel) in the project owner's tenant:
    the Change must exist (404); a move its status refuses answers 409."""
    owner = project_owner(runtime, principal, project_id)
    existing_change(runtime, project_id, change_id)
    with domain_refusal("illegal_transition"):
        end(
            api_caller(principal, owner, change_id),
            project_id=project_id,
            change_id=change_id,
            reason=body.reason if body else "",
        )
    return _change_body(runtime, project_id, change_id)


def _change_body(runtime: "ApiRuntime", project_id: str, change_id: str) -> ChangeBody:
    detail = change_detail(runtime, project_id, change_id)
    return ChangeBody.of_parts(
        project_id, detail.change, detail.tasks, detail.candidates, detail.releases
    )
