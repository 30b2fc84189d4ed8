"""``/projects``: provision a project, read it, archive and clean it up, provision and remove
its apps; its view, feed and events.

Provisioning, cleanup and the apps are commands on the integration queue, planned by
:class:`~rhumbatron.lifecycle.project_requests.ProjectRequests` with IDs stable per request
(its docstring lists them), so a client retrying a request is answered ``duplicate: true``.
Every route under ``/projects/{projectId}`` first finds the project's owner
(:func:`~rhumbatron.api.access.project_owner`): another tenant's project is not found.
"""

import logging
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Query

from rhumbatron.api.access import api_caller, own_tenant, project_owner
from rhumbatron.api.dependencies import (
    ProjectsReader,
    ProjectsWriter,
    Runtime,
    Streams,
    StreamsGate,
)
from rhumbatron.api.errors import domain_refusal, error_responses
from rhumbatron.api.lifecycle_schemas import (
    REQUEST_KEY,
    AcceptedCommandBody,
    CleanupRequest,
    CreateAppRequest,
    CreateProjectRequest,
    FeedBody,
    ProjectBody,
    ProjectViewBody,
    ReasonRequest,
)
from rhumbatron.api.routes._presets import (
    NO_PROJECT,
    AppName,
    EventId,
    ProjectId,
    accepted,
    record_errors,
    refusable_errors,
)
from rhumbatron.lifecycle.lookups import find_event
from rhumbatron.lifecycle.project_requests import PlannedCommand, ProjectRequests

if TYPE_CHECKING:
    from rhumbatron.api.ports import ApiRuntime

__all__ = ["router"]

_log = logging.getLogger(__name__)

#: The queue every command of these routes goes to (spec flowchart: API → integration).
_QUEUE = "integration"
#: Latest events a feed answers unless asked, and at most.
_FEED_DEFAULT = 50
_FEED_MAX = 200
#: Latest events the view carries (the dashboard's panel).
_VIEW_LATEST = 20

router = APIRouter()


@router.post(
    "/projects",
    response_model=AcceptedCommandBody,
    status_code=202,
    summary="Provision a project",
    responses=accepted(
        error_responses(
            401,
            403,
            409,
            422,
            503,
            e403="The token lacks projects:write, or is a platform token (owns no project).",
            e409="The project ID is taken, or the project exists under another name.",
        )
    ),
)
async def provision_project(
    runtime: Runtime, streams: Streams, principal: ProjectsWriter, body: CreateProjectRequest
) -> AcceptedCommandBody:
    """Queues ``project.provision`` (``cmd_provision_<projectId>``) for the caller's
    tenant. Provisioning the same project again with the same name is harmless."""
    tenant = own_tenant(principal, "create a project")
    planned = ProjectRequests(runtime).provision(tenant, body.project_id, body.name)
    return await _send(runtime, streams, planned)


@router.get(
    "/projects/{projectId}",
    response_model=ProjectBody,
    summary="Read a project",
    responses=record_errors(NO_PROJECT),
)
async def read_project(
    runtime: Runtime, principal: ProjectsReader, project_id: ProjectId
) -> ProjectBody:
    """Its name, owner, status (active, archived, deleted), canonical generation and
    live apps."""
    project_owner(runtime, principal, project_id)
    return _project_body(runtime, project_id)


@router.post(
    "/projects/{projectId}/cleanup",
    response_model=AcceptedCommandBody,
    status_code=202,
    summary="Clean up an archived project",
    responses=accepted(
        refusable_errors(e404=NO_PROJECT, e409="The project is active: archive it first.")
    ),
)
async def clean_up_project(
    runtime: Runtime,
    streams: Streams,
    principal: ProjectsWriter,
    project_id: ProjectId,
    body: Annotated[CleanupRequest | None, Body()] = None,
) -> AcceptedCommandBody:
    """Queues ``project.cleanup``: the apps of an archived or deleted project are
    removed and its forks deleted."""
    project_owner(runtime, principal, project_id)
    wanted = body or CleanupRequest()
    planned = ProjectRequests(runtime).cleanup(
        project_id, client_request_id=wanted.client_request_id, reason=wanted.reason
    )
    return await _send(runtime, streams, planned)


@router.post(
    "/projects/{projectId}/archive",
    response_model=ProjectBody,
    summary="Archive a project",
    responses=refusable_errors(
        e404=NO_PROJECT, e409="The project is deleted; it cannot be archived."
    ),
)
async def archive_project(
    runtime: Runtime,
    principal: ProjectsWriter,
    project_id: ProjectId,
    body: Annotated[ReasonRequest | None, Body()] = None,
) -> ProjectBody:
    """Archives the project at once (``project.archived``); archiving it again is
    nothing. No Change can be requested on it afterwards; the daily cleanup (or
    ``/cleanup``) removes its apps."""
    owner = project_owner(runtime, principal, project_id)
    caller = api_caller(principal, owner, f"archive_{project_id}")
    with domain_refusal("project_not_archivable"):
        ProjectRequests(runtime).archive(caller, project_id, reason=body.reason if body else "")
    return _project_body(runtime, project_id)


@router.post(
    "/projects/{projectId}/apps",
    response_model=AcceptedCommandBody,
    status_code=202,
    summary="Provision an app of the project",
    responses=accepted(refusable_errors(e404=NO_PROJECT, e409="The project is not active.")),
)
async def provision_app(
    runtime: Runtime,
    streams: Streams,
    principal: ProjectsWriter,
    project_id: ProjectId,
    body: CreateAppRequest,
) -> AcceptedCommandBody:
    """Queues ``app.provision``; the released generations are deployed to it."""
    project_owner(runtime, principal, project_id)
    planned = ProjectRequests(runtime).provision_app(
        project_id, body.app_name, client_request_id=body.client_request_id
    )
    return await _send(runtime, streams, planned)


@router.delete(
    "/projects/{projectId}/apps/{appName}",
    response_model=AcceptedCommandBody,
    status_code=202,
    summary="Remove an app of the project",
    responses=accepted(record_errors(NO_PROJECT)),
)
async def remove_app(
    *,
    runtime: Runtime,
    streams: Streams,
    principal: ProjectsWriter,
    project_id: ProjectId,
    app_name: AppName,
    client_request_id: Annotated[
        str | None, Query(alias="clientRequestId", pattern=REQUEST_KEY)
    ] = None,
) -> AcceptedCommandBody:
    """Queues ``app.remove``; removing an app that is not live is nothing."""
    project_owner(runtime, principal, project_id)
    planned = ProjectRequests(runtime).remove_app(
        project_id, app_name, client_request_id=client_request_id
    )
    return await _send(runtime, streams, planned)


# -- the project view and feed -----------------------------------------------------------------


@router.get(
    "/projects/{projectId}/view",
    response_model=ProjectViewBody,
    summary="The dashboard's view of a project",
    responses=record_errors(NO_PROJECT),
)
async def project_view(
    runtime: Runtime, principal: ProjectsReader, project_id: ProjectId
) -> ProjectViewBody:
    """Changes and Tasks by state, active Agents, Candidates and the latest events, as
    the project-view projector built them from the events (it lags the actors by the
    time the router takes)."""
    project_owner(runtime, principal, project_id)
    view = runtime.router().projector.view(project_id)
    return ProjectViewBody.of(view.snapshot(latest=_VIEW_LATEST))


@router.get(
    "/projects/{projectId}/feed",
    response_model=FeedBody,
    summary="A project's latest events",
    responses=record_errors(NO_PROJECT),
)
async def project_feed(
    runtime: Runtime,
    principal: ProjectsReader,
    project_id: ProjectId,
    limit: Annotated[int, Query(ge=1, le=_FEED_MAX)] = _FEED_DEFAULT,
) -> FeedBody:
    """The newest ``limit`` events the projector applied, newest first."""
    project_owner(runtime, principal, project_id)
    view = runtime.router().projector.view(project_id)
    latest = view.snapshot(latest=limit)["latestEvents"]
    return FeedBody.model_validate({"projectId": project_id, "items": latest})


@router.get(
    "/projects/{projectId}/events/{eventId}",
    response_model=dict[str, Any],
    summary="One event of a project, whole",
    responses=record_errors(
        "No such project for this tenant, or no such event on its stream: not applied by the "
        "project view yet (retry shortly), or past the stream's max age (the S3 archive keeps "
        "events 365 days)."
    ),
)
async def read_event(
    runtime: Runtime, principal: ProjectsReader, project_id: ProjectId, event_id: EventId
) -> dict[str, Any]:
    """The event as it is on the log (its wire form): what a webhook reaction's pointer
    body links to. Found through the project view, which knows each applied event's
    stream sequence, and read from the project's event stream."""
    project_owner(runtime, principal, project_id)
    event = await find_event(runtime, project_id, event_id)
    return event.to_wire()


# -- helpers -----------------------------------------------------------------------------------


async def _send(
    runtime: "ApiRuntime", streams: StreamsGate, planned: PlannedCommand
) -> AcceptedCommandBody:
    """Send ``planned`` (the streams created first) and answer what became of it."""
    await streams.ready()
    sent = await runtime.lifecycle().sender.send(planned.at(runtime.clock.now()))
    _log.info("api: %s %s: %s", planned.command_type, planned.command_id, sent.outcome)
    return AcceptedCommandBody(
        command_id=planned.command_id, queue=_QUEUE, duplicate=sent.outcome == "duplicate"
    )


def _project_body(runtime: "ApiRuntime", project_id: str) -> ProjectBody:
    overview = ProjectRequests(runtime).overview(project_id)
    return ProjectBody(
        project_id=project_id,
        name=overview.state.name,
        tenant_id=overview.state.tenant_id,
        status=overview.status,
        canonical_generation=overview.state.canonical_generation,
        live_apps=overview.live_apps,
    )
