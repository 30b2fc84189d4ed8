"""The lifecycle API: projects, Changes, agent callbacks, the project view and agents.

:func:`lifecycle_router` builds the routes over a runtime; :func:`~rhumbatron.api.app.create_api`
includes them. Like the operator routes, they only translate HTTP to library calls —
:class:`~rhumbatron.lifecycle.requests.ChangeRequests`, :class:`AgentCallbacks`,
:class:`LifecycleWorld`, the agent registry, the lifecycle sender — and back, and they are
``async def`` with no ``await`` inside an actor or product transaction (see ``app.py``).

Tenancy fails closed: every route under ``/projects/{projectId}`` first finds the project's
owner, and a project that does not exist and a project of another tenant are the same 404.
A platform token (tenant ``*``) may act on every tenant's projects, as the facts' tenant is
always the project's owner; it owns nothing, so it cannot create a project or an agent.
Agent IDs are a tenant's own too: a Change, a callback and a registration consult only the
tenant's agents, so no answer says whether another tenant has an agent of some ID.

Commands go to the integration queue with IDs that are stable per request, so a client
retrying a request within JetStream's 2-hour window is answered ``duplicate: true`` and
nothing runs twice (the project and app handlers are idempotent on state besides):

=================  ===========================================================================
project.provision  ``cmd_provision_<project>`` — a project is provisioned once
app.provision      ``cmd_app_<project>.<app>.provision.<key>``
app.remove         ``cmd_app_<project>.<app>.remove.<key>``
project.cleanup    ``cmd_cleanup_<project>.<key>``
=================  ===========================================================================

``<key>`` is the request's ``clientRequestId`` when it sends one. Without it, an app command's
key is the UTC second (a double click is one command; removing and provisioning again a
minute later is not dropped as a repeat) and a cleanup's the UTC day (cleaning up an archived
project twice a day cleans nothing more). ``.`` is no character of a project ID or an app
name, so no two projects' or apps' command IDs meet.
"""

# No ``from __future__ import annotations`` here, on purpose: the routes are closures over
# the dependencies the factory is given, and FastAPI resolves a string annotation against the
# module's globals only, where those closures are not. Evaluated at definition time, the
# ``Annotated[Principal, Security(...)]`` aliases below are plain objects FastAPI reads.

import asyncio
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request, Response, Security

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.agents.registry import MAX_SECRETS, AgentKind, AgentRegistryError
from rhumbatron.agents.signing import WebhookSecretError
from rhumbatron.agents.url_safety import UnsafeWebhookUrlError, check_webhook_url, display_url
from rhumbatron.api.auth import (
    SCOPE_AGENTS_WRITE,
    SCOPE_CHANGES_READ,
    SCOPE_CHANGES_WRITE,
    SCOPE_PROJECTS_READ,
    SCOPE_PROJECTS_WRITE,
    Principal,
)
from rhumbatron.api.errors import ApiError, InvalidRequestError, error_responses
from rhumbatron.api.lifecycle_schemas import (
    AGENT_ID,
    KEY_ID,
    REQUEST_KEY,
    RESOURCE,
    AcceptedCommandBody,
    AgentBody,
    CandidateBody,
    CandidateListBody,
    ChallengeBody,
    ChallengeRequest,
    ChangeBody,
    ChangeListBody,
    ChangesetBody,
    ChangesetRequest,
    ChangeSummary,
    ClaimBody,
    ClaimRequest,
    CleanupRequest,
    CompleteTaskRequest,
    CreateAppRequest,
    CreateChangeRequest,
    CreateProjectRequest,
    FailTaskRequest,
    FeedBody,
    IntentBody,
    IntentRequest,
    ProjectBody,
    ProjectViewBody,
    ReasonRequest,
    RegisterAgentRequest,
    StartTaskRequest,
    TaskBody,
    TaskListBody,
)
from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.domain.changes import ChangeState, ChangeStatus
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.project import project_admin_key
from rhumbatron.domain.tasks import TaskState
from rhumbatron.errors import DomainError
from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.lifecycle.requests import PromotionConflictError, qualified_task_id
from rhumbatron.operator import ProjectNotFoundError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import EVENT_ID_PATTERN, PROJECT_ID_PATTERN, stream_index
from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = [
    "ConflictError",
    "ForbiddenError",
    "NotFoundError",
    "PrincipalDependency",
    "StreamsReady",
    "lifecycle_router",
    "own_tenant",
]

_log = logging.getLogger(__name__)

#: The API's principal dependency (``app._principal``): used with ``Security(…, scopes=…)``.
PrincipalDependency = Callable[..., Awaitable[Principal]]
#: Creates the streams before a send, after authentication (``app._streams_ready``).
StreamsReady = Callable[[Request], Awaitable[None]]

#: The queue every command of these routes goes to (spec flowchart: API → integration).
_QUEUE = "integration"
#: Latest events a feed answers unless asked, and at most.
_FEED_DEFAULT = 50
_FEED_MAX = 200
#: Latest events the view carries (the dashboard's panel).
_VIEW_LATEST = 20


# -- the routes' own answers -------------------------------------------------------------------


class NotFoundError(ApiError):
    """404: no such Change, Task or Agent in this project (projects use the operator's
    :class:`~rhumbatron.operator.ProjectNotFoundError`)."""

    status_code = 404
    default_code = "not_found"


class ConflictError(ApiError):
    """409: the request is well formed, but the state of what it names refuses it."""

    status_code = 409
    default_code = "conflict"


class ForbiddenError(ApiError):
    """403: the caller may not do this whatever its scopes (a platform token creating what
    only a tenant can own)."""

    status_code = 403
    default_code = "forbidden"


# -- OpenAPI -----------------------------------------------------------------------------------


_NO_PROJECT = "No such project for this tenant (another tenant's project is not found either)."
_NO_CHANGE = "No such project, or no such Change in it, for this tenant."
_NO_TASK = "No such project, Change or Task for this tenant."
_ACCEPTED = {
    "description": "Queued on the integration queue; `duplicate` when the same command ID "
    "was queued within 2 hours (nothing more is done)."
}

# Path parameters, as the client names them.
_ProjectId = Annotated[str, Path(alias="projectId", pattern=PROJECT_ID_PATTERN.pattern)]
_EventId = Annotated[str, Path(alias="eventId", pattern=EVENT_ID_PATTERN.pattern)]
_ChangeId = Annotated[str, Path(alias="changeId", pattern=KEY_ID)]
_TaskId = Annotated[str, Path(alias="taskId", pattern=KEY_ID)]
_AppName = Annotated[str, Path(alias="appName", pattern=PROJECT_ID_PATTERN.pattern)]


# -- the router --------------------------------------------------------------------------------


def lifecycle_router(
    app: Rhumbatron, principal: PrincipalDependency, streams_ready: StreamsReady
) -> APIRouter:
    """The lifecycle routes over ``app``.

    ``principal`` is the API's dependency that authenticates the bearer token and checks the
    operation's scopes (401 / 403); ``streams_ready`` creates the streams once before the
    first send. Both come from :mod:`rhumbatron.api.app`, so every route authenticates and
    answers errors exactly like the operator routes.
    """
    ProjectsReader = Annotated[Principal, Security(principal, scopes=[SCOPE_PROJECTS_READ])]
    ProjectsWriter = Annotated[Principal, Security(principal, scopes=[SCOPE_PROJECTS_WRITE])]
    ChangesReader = Annotated[Principal, Security(principal, scopes=[SCOPE_CHANGES_READ])]
    ChangesWriter = Annotated[Principal, Security(principal, scopes=[SCOPE_CHANGES_WRITE])]
    AgentsWriter = Annotated[Principal, Security(principal, scopes=[SCOPE_AGENTS_WRITE])]

    router = APIRouter()

    async def send(
        request: Request, command_type: str, command_id: str, project_id: str, **payload: Any
    ) -> AcceptedCommandBody:
        await streams_ready(request)
        command = lifecycle_command(
            command_type, command_id, project_id=project_id, now=app.clock.now(), payload=payload
        )
        sent = await app.lifecycle().sender.send(command)
        _log.info("api: %s %s: %s", command_type, command_id, sent.outcome)
        return AcceptedCommandBody(
            command_id=command_id, queue=_QUEUE, duplicate=sent.outcome == "duplicate"
        )

    # -- projects --------------------------------------------------------------------------

    @router.post(
        "/projects",
        response_model=AcceptedCommandBody,
        status_code=202,
        summary="Provision a project",
        responses={
            202: _ACCEPTED,
            **error_responses(
                401,
                403,
                409,
                422,
                503,
                e403="The token lacks projects:write, or is a platform token (owns no project).",
                e409="The project ID is taken, or the project exists under another name.",
            ),
        },
    )
    async def provision_project(
        request: Request, principal: ProjectsWriter, body: CreateProjectRequest
    ) -> AcceptedCommandBody:
        """Queues ``project.provision`` (``cmd_provision_<projectId>``) for the caller's
        tenant. Provisioning the same project again with the same name is harmless."""
        tenant = own_tenant(principal, "create a project")
        owner = app.project_tenant(body.project_id)
        if owner is not None and owner != tenant:
            raise ConflictError(
                f"project ID {body.project_id!r} is not available; choose another project ID",
                code="project_id_unavailable",
                field="projectId",
            )
        state = app.project_root(body.project_id).state() if owner is not None else None
        if state is not None and state.name != body.name:
            raise ConflictError(
                f"project {body.project_id!r} already exists named {state.name!r}, not "
                f"{body.name!r}",
                code="project_exists",
                field="name",
            )
        return await send(
            request,
            "project.provision",
            f"cmd_provision_{body.project_id}",
            body.project_id,
            name=body.name,
            tenantId=tenant,
        )

    @router.get(
        "/projects/{projectId}",
        response_model=ProjectBody,
        summary="Read a project",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NO_PROJECT),
    )
    async def read_project(principal: ProjectsReader, project_id: _ProjectId) -> ProjectBody:
        """Its name, owner, status (active, archived, deleted), canonical generation and
        live apps."""
        _owner(app, principal, project_id)
        return _project_body(app, project_id)

    @router.post(
        "/projects/{projectId}/cleanup",
        response_model=AcceptedCommandBody,
        status_code=202,
        summary="Clean up an archived project",
        responses={
            202: _ACCEPTED,
            **error_responses(
                401,
                403,
                404,
                409,
                422,
                503,
                e404=_NO_PROJECT,
                e409="The project is active: archive it first.",
            ),
        },
    )
    async def clean_up_project(
        request: Request,
        principal: ProjectsWriter,
        project_id: _ProjectId,
        body: Annotated[CleanupRequest | None, Body()] = None,
    ) -> AcceptedCommandBody:
        """Queues ``project.cleanup``: the apps of an archived or deleted project are
        removed and its forks deleted."""
        _owner(app, principal, project_id)
        status = app.lifecycle().world.project_status(project_id)
        if status == "active":
            raise ConflictError(
                f"project {project_id!r} is active; archive it before cleaning it up",
                code="project_active",
            )
        wanted = body or CleanupRequest()
        key = wanted.client_request_id or app.clock.now().strftime("%Y-%m-%d")
        return await send(
            request,
            "project.cleanup",
            f"cmd_cleanup_{project_id}.{key}",
            project_id,
            reason=wanted.reason,
        )

    @router.post(
        "/projects/{projectId}/archive",
        response_model=ProjectBody,
        summary="Archive a project",
        responses=error_responses(
            401,
            403,
            404,
            409,
            422,
            503,
            e404=_NO_PROJECT,
            e409="The project is deleted; it cannot be archived.",
        ),
    )
    async def archive_project(
        principal: ProjectsWriter,
        project_id: _ProjectId,
        body: Annotated[ReasonRequest | None, Body()] = None,
    ) -> ProjectBody:
        """Archives the project at once (``project.archived``); archiving it again is
        nothing. No Change can be requested on it afterwards; the daily cleanup (or
        ``/cleanup``) removes its apps."""
        owner = _owner(app, principal, project_id)
        caller = _caller(principal, owner, f"archive_{project_id}")
        with _refused("project_not_archivable"):
            app.lifecycle().world.admin_shard(project_id).set_project_status(
                caller, to="archived", reason=(body.reason if body else "") or "archived"
            )
        return _project_body(app, project_id)

    @router.post(
        "/projects/{projectId}/apps",
        response_model=AcceptedCommandBody,
        status_code=202,
        summary="Provision an app of the project",
        responses={
            202: _ACCEPTED,
            **error_responses(
                401,
                403,
                404,
                409,
                422,
                503,
                e404=_NO_PROJECT,
                e409="The project is not active.",
            ),
        },
    )
    async def provision_app(
        request: Request, principal: ProjectsWriter, project_id: _ProjectId, body: CreateAppRequest
    ) -> AcceptedCommandBody:
        """Queues ``app.provision``; the released generations are deployed to it."""
        _owner(app, principal, project_id)
        _active(app, project_id, "provision an app")
        key = body.client_request_id or _second(app.clock.now())
        return await send(
            request,
            "app.provision",
            f"cmd_app_{project_id}.{body.app_name}.provision.{key}",
            project_id,
            appName=body.app_name,
        )

    @router.delete(
        "/projects/{projectId}/apps/{appName}",
        response_model=AcceptedCommandBody,
        status_code=202,
        summary="Remove an app of the project",
        responses={202: _ACCEPTED, **error_responses(401, 403, 404, 422, 503, e404=_NO_PROJECT)},
    )
    async def remove_app(
        request: Request,
        principal: ProjectsWriter,
        project_id: _ProjectId,
        app_name: _AppName,
        client_request_id: Annotated[
            str | None, Query(alias="clientRequestId", pattern=REQUEST_KEY)
        ] = None,
    ) -> AcceptedCommandBody:
        """Queues ``app.remove``; removing an app that is not live is nothing."""
        _owner(app, principal, project_id)
        key = client_request_id or _second(app.clock.now())
        return await send(
            request,
            "app.remove",
            f"cmd_app_{project_id}.{app_name}.remove.{key}",
            project_id,
            appName=app_name,
        )

    # -- the project view and feed ---------------------------------------------------------

    @router.get(
        "/projects/{projectId}/view",
        response_model=ProjectViewBody,
        summary="The dashboard's view of a project",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NO_PROJECT),
    )
    async def project_view(principal: ProjectsReader, project_id: _ProjectId) -> ProjectViewBody:
        """Changes and Tasks by state, active Agents, Candidates and the latest events, as
        the project-view projector built them from the events (it lags the actors by the
        time the router takes)."""
        _owner(app, principal, project_id)
        view = app.router().projector.view(project_id)
        return ProjectViewBody.of(view.snapshot(latest=_VIEW_LATEST))

    @router.get(
        "/projects/{projectId}/feed",
        response_model=FeedBody,
        summary="A project's latest events",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NO_PROJECT),
    )
    async def project_feed(
        principal: ProjectsReader,
        project_id: _ProjectId,
        limit: Annotated[int, Query(ge=1, le=_FEED_MAX)] = _FEED_DEFAULT,
    ) -> FeedBody:
        """The newest ``limit`` events the projector applied, newest first."""
        _owner(app, principal, project_id)
        view = app.router().projector.view(project_id)
        latest = view.snapshot(latest=limit)["latestEvents"]
        return FeedBody.model_validate({"projectId": project_id, "items": latest})

    @router.get(
        "/projects/{projectId}/events/{eventId}",
        response_model=dict[str, Any],
        summary="One event of a project, whole",
        responses=error_responses(
            401,
            403,
            404,
            422,
            503,
            e404="No such project for this tenant, or no such event on its stream: not "
            "applied by the project view yet (retry shortly), or past the stream's max age "
            "(the S3 archive keeps events 365 days).",
        ),
    )
    async def read_event(
        principal: ProjectsReader, project_id: _ProjectId, event_id: _EventId
    ) -> dict[str, Any]:
        """The event as it is on the log (its wire form): what a webhook reaction's pointer
        body links to. Found through the project view, which knows each applied event's
        stream sequence, and read from the project's event stream."""
        _owner(app, principal, project_id)
        view = app.router().projector.view(project_id)
        seq = await asyncio.to_thread(view.stream_seq_of, event_id)
        log = await app.router().event_log()
        raw = None if seq is None else await log.read_at(stream_index(project_id), seq)
        if raw is None:
            raise NotFoundError(
                f"no event {event_id!r} of project {project_id!r} on its stream: the project "
                "view has not applied it yet (retry shortly), or it is past the stream's max "
                "age (`rhumbatron replay --source archive` reads the S3 archive)"
            )
        event = Event.parse(raw)
        if event.event_id != event_id:  # the sequence was reused after a purge
            raise NotFoundError(
                f"event {event_id!r} is no longer on project {project_id!r}'s stream"
            )
        return event.to_wire()

    # -- Changes ---------------------------------------------------------------------------

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
            **error_responses(
                401,
                403,
                404,
                409,
                422,
                503,
                e404=_NO_PROJECT,
                e409="The project is not active.",
                e422="The request is invalid (a cycle in the tasks, ...); `field` names the "
                "first bad field.",
            ),
        },
    )
    async def create_change(
        principal: ChangesWriter,
        project_id: _ProjectId,
        body: CreateChangeRequest,
        response: Response,
    ) -> ChangeBody:
        """Creates the Change ``open`` with its work graph (201). The same
        ``clientRequestId`` in the same project answers the first Change (200) and creates
        nothing, whatever else the repeat says."""
        owner = _owner(app, principal, project_id)
        _active(app, project_id, "request a change")
        # A Task's agent ID names an Agent of this tenant only (the wake looks it up in the
        # project's tenant): no other tenant's registry is consulted, so none is revealed.
        lifecycle = app.lifecycle()
        with _refused(invalid_field="tasks"):
            created = lifecycle.requests.create_change(
                _caller(principal, owner, body.client_request_id),
                project_id=project_id,
                client_request_id=body.client_request_id,
                title=body.title,
                tasks=body.plans(),
            )
        response.status_code = 201 if created.created else 200
        return _change_body(app, project_id, created.change_id)

    @router.get(
        "/projects/{projectId}/changes",
        response_model=ChangeListBody,
        summary="List a project's Changes",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NO_PROJECT),
    )
    async def list_changes(
        principal: ChangesReader,
        project_id: _ProjectId,
        status: Annotated[
            list[ChangeStatus] | None, Query(description="Only these states (repeatable).")
        ] = None,
    ) -> ChangeListBody:
        """Oldest first; every state unless ``status`` names some."""
        _owner(app, principal, project_id)
        wanted = [s.value for s in status] if status else None
        changes = app.lifecycle().world.changes(project_id, wanted)
        return ChangeListBody(items=[ChangeSummary.of(project_id, c) for c in changes])

    @router.get(
        "/projects/{projectId}/changes/{changeId}",
        response_model=ChangeBody,
        summary="Read a Change",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NO_CHANGE),
    )
    async def read_change(
        principal: ChangesReader, project_id: _ProjectId, change_id: _ChangeId
    ) -> ChangeBody:
        """Its status and reason, title, timestamps, Tasks, Candidates and releases."""
        _owner(app, principal, project_id)
        return _change_body(app, project_id, change_id)

    @router.get(
        "/projects/{projectId}/changes/{changeId}/tasks",
        response_model=TaskListBody,
        summary="List a Change's Tasks",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NO_CHANGE),
    )
    async def list_tasks(
        principal: ChangesReader, project_id: _ProjectId, change_id: _ChangeId
    ) -> TaskListBody:
        _owner(app, principal, project_id)
        shard, _ = _change(app, project_id, change_id)
        return TaskListBody(items=[TaskBody.of(t) for t in shard.tasks_of_change(change_id)])

    @router.post(
        "/projects/{projectId}/changes/{changeId}/approve",
        response_model=CandidateBody,
        summary="Approve a Change: promote its verified Candidate",
        responses=error_responses(
            401,
            403,
            404,
            409,
            422,
            503,
            e404=_NO_CHANGE,
            e409="The Change is not awaiting approval, or canonical moved past its "
            "Candidate's base (it is recomposed; approve again once it is verified).",
        ),
    )
    async def approve_change(
        principal: ChangesWriter, project_id: _ProjectId, change_id: _ChangeId
    ) -> CandidateBody:
        """Promotes the verified Candidate (canonical advances) and moves the Change to
        ``releasing``; approving a Change already promoted answers its Candidate again."""
        owner = _owner(app, principal, project_id)
        _change(app, project_id, change_id)
        caller = _caller(principal, owner, change_id)
        try:
            candidate = app.lifecycle().requests.approve(
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
        responses=error_responses(
            401,
            403,
            404,
            409,
            422,
            503,
            e404=_NO_CHANGE,
            e409="The Change is not awaiting approval.",
        ),
    )
    async def decline_change(
        principal: ChangesWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        body: Annotated[ReasonRequest | None, Body()] = None,
    ) -> ChangeBody:
        """``awaiting_approval → declined``; declining it again is nothing."""
        owner = _owner(app, principal, project_id)
        _change(app, project_id, change_id)
        with _refused("illegal_transition"):
            app.lifecycle().requests.decline(
                _caller(principal, owner, change_id),
                project_id=project_id,
                change_id=change_id,
                reason=body.reason if body else "",
            )
        return _change_body(app, project_id, change_id)

    @router.post(
        "/projects/{projectId}/changes/{changeId}/cancel",
        response_model=ChangeBody,
        summary="Cancel a Change",
        responses=error_responses(
            401,
            403,
            404,
            409,
            422,
            503,
            e404=_NO_CHANGE,
            e409="The Change is releasing or has ended.",
        ),
    )
    async def cancel_change(
        principal: ChangesWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        body: Annotated[ReasonRequest | None, Body()] = None,
    ) -> ChangeBody:
        """From open, verifying or awaiting approval to ``cancelled``; again is nothing."""
        owner = _owner(app, principal, project_id)
        _change(app, project_id, change_id)
        with _refused("illegal_transition"):
            app.lifecycle().requests.cancel(
                _caller(principal, owner, change_id),
                project_id=project_id,
                change_id=change_id,
                reason=body.reason if body else "",
            )
        return _change_body(app, project_id, change_id)

    @router.get(
        "/projects/{projectId}/candidates",
        response_model=CandidateListBody,
        summary="List a project's Candidates",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NO_PROJECT),
    )
    async def list_candidates(
        principal: ChangesReader, project_id: _ProjectId
    ) -> CandidateListBody:
        """Every Candidate of the project, each with its Change's status."""
        _owner(app, principal, project_id)
        return CandidateListBody.of(app.lifecycle().world.candidates(project_id))

    # -- agent callbacks -------------------------------------------------------------------
    # An external (webhook) Agent reports on the Task it was woken for. Each call is one
    # library callback, idempotent on its natural key; the facts' actor is agent:<agentId>.

    task_path = "/projects/{projectId}/changes/{changeId}/tasks/{taskId}"
    refusal = (
        "The Agent does not hold the Task, or the state refuses the report (another Agent's "
        "claim, a changeset or challenge ID reused for something else, an ended Change)."
    )
    agent_errors = error_responses(
        401,
        403,
        404,
        409,
        422,
        503,
        e403="The token lacks agents:write.",
        e404=_NO_TASK,
        e409=refusal,
    )

    def reporting(
        principal: Principal, project_id: str, change_id: str, task_id: str, agent_id: str
    ) -> tuple[str, TaskState]:
        """The project's owner and the Task (named as planned, ``t1``, or as its wake names
        it, ``<changeId>.t1``), once the caller may report on it as ``agent_id``. The
        agent ID is the project's tenant's: another tenant's agent of that ID is never
        consulted, so a caller learns nothing of it (the Task's holder is checked later)."""
        owner = _owner(app, principal, project_id)
        shard, _ = _change(app, project_id, change_id)
        task = shard.task_state(qualified_task_id(change_id, task_id))
        if task is None or task.change_id != change_id:
            raise NotFoundError(f"no task {task_id!r} in change {change_id!r}")
        return owner, task

    def holding(task: TaskState, agent_id: str) -> None:
        """Intents and claims are the shard's own facts, not the Task's: the library does
        not ask who holds the Task, so the route does (only its Agent reports on it)."""
        if task.agent_id != agent_id or not task.active:
            raise ConflictError(
                f"agent {agent_id!r} does not hold task {task.task_id!r} (it is "
                f"{task.status}); only the admitted agent reports on a task",
                code="not_holder",
            )

    def task_body(project_id: str, change_id: str, task_id: str) -> TaskBody:
        shard = app.lifecycle().world.change_shard(project_id, change_id)
        task = shard.task_state(task_id)
        assert task is not None  # it was found before the call, and tasks are never deleted
        return TaskBody.of(task)

    @router.post(
        f"{task_path}/start",
        response_model=TaskBody,
        summary="Agent: start the Task",
        responses=agent_errors,
    )
    async def start_task(
        principal: AgentsWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        task_id: _TaskId,
        body: StartTaskRequest,
    ) -> TaskBody:
        """``assigned → running`` (``task.started``); starting it again is nothing."""
        owner, task = reporting(principal, project_id, change_id, task_id, body.agent_id)
        with _refused("not_holder"):
            app.lifecycle().callbacks.start(
                owner,
                project_id=project_id,
                change_id=change_id,
                task_id=task.task_id,
                agent_id=body.agent_id,
            )
        return task_body(project_id, change_id, task.task_id)

    @router.post(
        f"{task_path}/intents",
        response_model=IntentBody,
        summary="Agent: declare an intent",
        responses=agent_errors,
    )
    async def declare_intent(
        principal: AgentsWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        task_id: _TaskId,
        body: IntentRequest,
    ) -> IntentBody:
        """``intent.declared``, or ``intent.changed`` when the same intent ID names other
        paths; the same again is nothing. Agents whose work overlaps the paths are woken."""
        owner, task = reporting(principal, project_id, change_id, task_id, body.agent_id)
        holding(task, body.agent_id)
        with _refused("intent_refused"):
            app.lifecycle().callbacks.declare_intent(
                owner,
                project_id=project_id,
                change_id=change_id,
                agent_id=body.agent_id,
                intent_id=body.intent_id,
                paths=body.paths,
                summary=body.summary,
            )
        return IntentBody(
            intent_id=body.intent_id,
            agent_id=body.agent_id,
            task_id=task.task_id,
            paths=body.paths,
            summary=body.summary,
        )

    @router.post(
        f"{task_path}/claims",
        response_model=ClaimBody,
        summary="Agent: claim a resource",
        responses=agent_errors,
    )
    async def acquire_claim(
        principal: AgentsWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        task_id: _TaskId,
        body: ClaimRequest,
    ) -> ClaimBody:
        """An exclusive claim for the claim TTL; its holder claiming again renews it. A
        resource another Agent holds is 409 until it is released or expires."""
        owner, task = reporting(principal, project_id, change_id, task_id, body.agent_id)
        holding(task, body.agent_id)
        with _refused("claimed_by_another"):
            app.lifecycle().callbacks.acquire_claim(
                owner, project_id=project_id, agent_id=body.agent_id, resource=body.resource
            )
        return _claim_body(app, project_id, body.resource, body.agent_id)

    @router.delete(
        f"{task_path}/claims",
        response_model=ClaimBody,
        summary="Agent: release a claim",
        responses=agent_errors,
    )
    async def release_claim(
        *,
        principal: AgentsWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        task_id: _TaskId,
        agent_id: Annotated[str, Query(alias="agentId", pattern=AGENT_ID)],
        resource: Annotated[str, Query(pattern=RESOURCE)],
    ) -> ClaimBody:
        """``claim.released``; releasing a resource nobody holds is nothing. Only its
        holder releases it (409 otherwise). The Task need not be held any more: an Agent
        cleans up after completing."""
        owner, _ = reporting(principal, project_id, change_id, task_id, agent_id)
        with _refused("claimed_by_another"):
            app.lifecycle().callbacks.release_claim(
                owner, project_id=project_id, agent_id=agent_id, resource=resource
            )
        return _claim_body(app, project_id, resource, agent_id)

    @router.post(
        f"{task_path}/challenges",
        response_model=ChallengeBody,
        summary="Agent: challenge another agent's claim or intent",
        responses=agent_errors,
    )
    async def create_challenge(
        principal: AgentsWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        task_id: _TaskId,
        body: ChallengeRequest,
    ) -> ChallengeBody:
        """``challenge.created`` on the resource: the Agents whose work overlaps it are
        woken (never the challenger). The same challenge ID again is nothing; reused for
        another challenge, 409."""
        owner, task = reporting(principal, project_id, change_id, task_id, body.agent_id)
        holding(task, body.agent_id)
        with _refused("challenge_refused"):
            app.lifecycle().callbacks.create_challenge(
                owner,
                project_id=project_id,
                change_id=change_id,
                agent_id=body.agent_id,
                challenge_id=body.challenge_id,
                resource=body.resource,
                target_agent_id=body.target_agent_id,
                reason=body.reason,
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
        f"{task_path}/changesets",
        response_model=ChangesetBody,
        summary="Agent: propose a changeset",
        responses=agent_errors,
    )
    async def propose_changeset(
        principal: AgentsWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        task_id: _TaskId,
        body: ChangesetRequest,
    ) -> ChangesetBody:
        """``changeset.proposed`` on the current canonical generation; the same ID with the
        same files again is nothing, with other files 409."""
        owner, task = reporting(principal, project_id, change_id, task_id, body.agent_id)
        with _refused("changeset_refused"):
            app.lifecycle().callbacks.propose_changeset(
                owner,
                project_id=project_id,
                change_id=change_id,
                task_id=task.task_id,
                agent_id=body.agent_id,
                changeset_id=body.changeset_id,
                files=body.files,
            )
        shard = app.lifecycle().world.change_shard(project_id, change_id)
        changeset = shard.changeset(body.changeset_id)
        assert changeset is not None  # the call above recorded it, or had it already
        return ChangesetBody.of(changeset)

    @router.post(
        f"{task_path}/complete",
        response_model=TaskBody,
        summary="Agent: complete the Task",
        responses=agent_errors,
    )
    async def complete_task(
        principal: AgentsWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        task_id: _TaskId,
        body: CompleteTaskRequest,
    ) -> TaskBody:
        """``task.completed`` (its dependents become ready; the last Task moves the Change
        to verifying); the same report again is nothing."""
        owner, task = reporting(principal, project_id, change_id, task_id, body.agent_id)
        with _refused("not_holder"):
            app.lifecycle().callbacks.complete(
                owner,
                project_id=project_id,
                change_id=change_id,
                task_id=task.task_id,
                agent_id=body.agent_id,
                changeset_id=body.changeset_id,
            )
        return task_body(project_id, change_id, task.task_id)

    @router.post(
        f"{task_path}/fail",
        response_model=TaskBody,
        summary="Agent: fail the Task",
        responses=agent_errors,
    )
    async def fail_task(
        principal: AgentsWriter,
        project_id: _ProjectId,
        change_id: _ChangeId,
        task_id: _TaskId,
        body: FailTaskRequest,
    ) -> TaskBody:
        """``task.failed`` with the reason (the Change is settled); again is nothing."""
        owner, task = reporting(principal, project_id, change_id, task_id, body.agent_id)
        with _refused("not_holder"):
            app.lifecycle().callbacks.fail(
                owner,
                project_id=project_id,
                change_id=change_id,
                task_id=task.task_id,
                agent_id=body.agent_id,
                reason=body.reason,
            )
        return task_body(project_id, change_id, task.task_id)

    # -- agents ----------------------------------------------------------------------------

    @router.post(
        "/agents",
        response_model=AgentBody,
        status_code=201,
        summary="Register an agent",
        responses={
            200: {"model": AgentBody, "description": "The agent was registered already."},
            **error_responses(
                401,
                403,
                422,
                503,
                e403="The token lacks agents:write, or is a platform token (owns no agent).",
                e422="The request is invalid (an unsafe URL, a malformed secret, ...); "
                "`field` names the first bad field.",
            ),
        },
    )
    async def register_agent(
        principal: AgentsWriter, body: RegisterAgentRequest, response: Response
    ) -> AgentBody:
        """Registers (201) or updates (200) an agent of the caller's tenant. Agent IDs are
        the tenant's own: another tenant's agent of the same ID is neither seen nor changed.
        The answer shows no secret, except one this registration generated: it is shown
        once."""
        tenant = own_tenant(principal, "register an agent")
        registry = app.lifecycle().registry
        before = registry.get(tenant, body.agent_id)
        generated = False
        if body.kind is AgentKind.WEBHOOK:
            assert body.url is not None  # the request model requires it
            _check_secrets(body.secrets)
            allowed = app.settings.webhook_allowed_hosts
            with _invalid(field="url"):
                # Resolving a name may take seconds: first off the event loop, so that an
                # unresolvable or unsafe URL never blocks it. The registry resolves it again
                # on the loop (usually from the resolver's cache: it was just asked).
                await asyncio.to_thread(check_webhook_url, body.url, allowed)
            with _invalid(field="agentId"):
                record = registry.register_webhook(tenant, body.agent_id, body.url, body.secrets)
            generated = body.secrets is None and (
                before is None or before.kind is not AgentKind.WEBHOOK
            )
        else:
            with _invalid(field="agentId"):
                record = registry.register_scripted(tenant, body.agent_id)
        response.status_code = 201 if before is None else 200
        return AgentBody.of(
            record,
            url=display_url(record.url) if record.url else None,
            generated_secret=record.secrets[0] if generated else None,
        )

    return router


# -- helpers -----------------------------------------------------------------------------------


def own_tenant(principal: Principal, doing: str) -> str:
    """The caller's tenant, which will own what it creates; a platform token owns nothing."""
    if principal.tenant_id == ANY_TENANT:
        raise ForbiddenError(
            f"a platform token (tenant {ANY_TENANT!r}) acts for every tenant and owns nothing; "
            f"use a tenant's token to {doing}",
            code="tenant_required",
        )
    return principal.tenant_id


def _owner(app: Rhumbatron, principal: Principal, project_id: str) -> str:
    """The project's tenant, when the caller may see the project; 404 otherwise — the same
    answer for a project that does not exist and one of another tenant."""
    owner = app.project_tenant(project_id)
    if owner is None or principal.tenant_id not in (ANY_TENANT, owner):
        raise ProjectNotFoundError(f"no project {project_id!r}; check the project ID")
    return owner


def _active(app: Rhumbatron, project_id: str, doing: str) -> None:
    status = app.lifecycle().world.project_status(project_id)
    if status != "active":
        raise ConflictError(
            f"project {project_id!r} is {status}; only an active project can {doing}",
            code="project_not_active",
        )


_SPACE = re.compile(r"\s+")


def _caller(principal: Principal, tenant: str, correlation_id: str) -> Caller:
    """A person calling through the API: ``user:<subject>``, never another kind of actor
    (a token whose subject says ``agent:x`` must not pass for that Agent's own writes)."""
    subject = _SPACE.sub("_", principal.subject)[:200] or "unknown"
    return Caller(tenant, f"user:{subject}", correlation_id or f"api_{uuid.uuid4().hex}")


def _shard_exists(app: Rhumbatron, project_id: str, resource_key: str) -> bool:
    """Whether the shard file owning ``resource_key`` exists: a read never creates one."""
    ref = ResourceShard.ref_for(project_id, resource_key, app.settings.resource_shard_count)
    return ref.path(app.settings.state_dir).exists()


def _change(app: Rhumbatron, project_id: str, change_id: str) -> tuple[ResourceShard, ChangeState]:
    if _shard_exists(app, project_id, change_resource_key(change_id)):
        shard = app.lifecycle().world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is not None:
            return shard, change
    raise NotFoundError(f"no change {change_id!r} in project {project_id!r}")


def _change_body(app: Rhumbatron, project_id: str, change_id: str) -> ChangeBody:
    shard, change = _change(app, project_id, change_id)
    return ChangeBody.of_parts(
        project_id,
        change,
        shard.tasks_of_change(change_id),
        shard.candidates(change_id=change_id),
        shard.releases(change_id=change_id),
    )


def _project_body(app: Rhumbatron, project_id: str) -> ProjectBody:
    state = app.project_root(project_id).state()
    assert state is not None  # the caller found its owner
    world = app.lifecycle().world
    live = (
        world.admin_shard(project_id).live_apps()
        if _shard_exists(app, project_id, project_admin_key(project_id))
        else []
    )
    return ProjectBody(
        project_id=project_id,
        name=state.name,
        tenant_id=state.tenant_id,
        status=world.project_status(project_id),
        canonical_generation=state.canonical_generation,
        live_apps=live,
    )


def _claim_body(app: Rhumbatron, project_id: str, resource: str, agent_id: str) -> ClaimBody:
    now = app.clock.now()
    for claim in app.resource_shard(project_id, resource).claims():
        if claim.resource == resource and claim.agent_id == agent_id and claim.live_at(now):
            return ClaimBody(
                resource=resource, agent_id=agent_id, held=True, expires_at=claim.expires_at
            )
    return ClaimBody(resource=resource, agent_id=agent_id, held=False)


@contextmanager
def _invalid(*, field: str) -> Iterator[None]:
    """The registry's refusals: an unsafe URL, a bad secret or agent ID is the request's
    fault (422)."""
    try:
        yield
    except WebhookSecretError as exc:
        raise InvalidRequestError(str(exc), field="secrets") from None
    except UnsafeWebhookUrlError as exc:
        raise InvalidRequestError(str(exc), field="url") from None
    except AgentRegistryError as exc:
        raise InvalidRequestError(str(exc), field=field) from None


def _check_secrets(secrets: list[str] | None) -> None:
    """How many secrets, and none twice, in a message that quotes none of them."""
    if secrets is None:
        return
    if not 1 <= len(secrets) <= MAX_SECRETS:
        raise InvalidRequestError(
            f"give 1 or {MAX_SECRETS} secrets (newest first), not {len(secrets)}; or none to "
            "keep the registered ones (or have one generated)",
            field="secrets",
        )
    if len(set(secrets)) != len(secrets):
        raise InvalidRequestError("the same secret is given twice", field="secrets")


def _second(moment: datetime) -> str:
    return moment.strftime("%Y%m%dT%H%M%SZ")


@contextmanager
def _refused(code: str = "conflict", *, invalid_field: str | None = None) -> Iterator[None]:
    """A :class:`DomainError` of the library as an answer: 409 with ``code`` (the state
    refuses it), or 422 on ``invalid_field`` (the request's own values are at fault)."""
    try:
        yield
    except DomainError as exc:
        if invalid_field is not None:
            raise InvalidRequestError(str(exc), field=invalid_field) from None
        raise ConflictError(str(exc), code=code) from None
