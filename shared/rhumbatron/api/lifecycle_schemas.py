"""The lifecycle API's request and response bodies: frozen pydantic models, camelCase on
the wire, like :mod:`rhumbatron.api.schemas`.

Requests are validated here, at the edge, as far as their own values go: ID alphabets and
lengths, a work graph whose Tasks are unique and depend only on each other, changeset paths
that stay inside the project. What depends on state (a Task's holder, a Change's status) is
the library's to decide, and a refusal there is a 409.

IDs that end up in command IDs (``cmd_<task>_ready``) or file names (an app's directory) use
the command ID's alphabet, so an accepted request never builds an invalid command.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rhumbatron.actors.shard_commands import (
    AcquireClaim,
    CompleteTask,
    CreateChallenge,
    DeclareIntent,
    FailTask,
    ProposeChangeset,
    StartTask,
)
from rhumbatron.agents.registry import AgentKind, AgentRecord
from rhumbatron.core.clock import parse_timestamp
from rhumbatron.domain.candidates import CandidateState, CandidateStatus
from rhumbatron.domain.changes import MAX_TASKS_PER_CHANGE, ChangeState, ChangeStatus, TaskPlan
from rhumbatron.domain.changesets import MAX_CHANGESET_BYTES, Changeset
from rhumbatron.domain.releases import ReleaseState, ReleaseStatus
from rhumbatron.domain.tasks import TaskState, TaskStatus
from rhumbatron.lifecycle.world import LocatedCandidate
from rhumbatron.protocol import values
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN

__all__ = [
    "AGENT_ID",
    "KEY_ID",
    "REQUEST_KEY",
    "RESOURCE",
    "TASK_ID",
    "AcceptedCommandBody",
    "ActiveAgent",
    "AgentBody",
    "CandidateBody",
    "CandidateListBody",
    "ChallengeBody",
    "ChallengeRequest",
    "ChangeBody",
    "ChangeListBody",
    "ChangeSummary",
    "ChangesetBody",
    "ChangesetRequest",
    "ClaimBody",
    "ClaimRequest",
    "CleanupRequest",
    "CompleteTaskRequest",
    "CreateAppRequest",
    "CreateChangeRequest",
    "CreateProjectRequest",
    "FailTaskRequest",
    "FeedBody",
    "FeedEvent",
    "IntentBody",
    "IntentRequest",
    "ProjectBody",
    "ProjectViewBody",
    "ReasonRequest",
    "RegisterAgentRequest",
    "ReleaseBody",
    "StartTaskRequest",
    "TaskBody",
    "TaskListBody",
    "TaskPlanRequest",
    "ViewCandidate",
]

#: Client request, Task, Change, intent, challenge and changeset IDs: the command ID's alphabet.
KEY_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
#: The agent registry's alphabet (``AGENT_ID_PATTERN``), anchored for a JSON schema.
AGENT_ID = values.AGENT_ID
#: A Task ID as planned: the library qualifies it as ``<changeId>.<taskId>``, which must still
#: fit an Event's 128-character task ID.
TASK_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$"
#: A client's key of an app or cleanup request: short enough for the command ID it ends.
REQUEST_KEY = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,47}$"
#: Paths and resources: one line, as long as an Event's ``resource`` may be.
RESOURCE = r"^[^\x00\r\n]{1,1024}$"
_RESOURCE_RE = re.compile(RESOURCE)


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


# -- commands ----------------------------------------------------------------------------------


class AcceptedCommandBody(_Wire):
    """A command queued for the integration module (202). ``duplicate``: the same command
    ID was queued within JetStream's 2-hour window, and this send was dropped."""

    command_id: str
    queue: str
    duplicate: bool


# -- projects ----------------------------------------------------------------------------------


class CreateProjectRequest(_Wire):
    """A project to provision for the caller's tenant."""

    project_id: str = Field(pattern=PROJECT_ID_PATTERN.pattern)
    name: str = Field(min_length=1, max_length=200)


class CleanupRequest(_Wire):
    """Optional: ``clientRequestId`` makes the cleanup command's ID (else the UTC day)."""

    client_request_id: str | None = Field(default=None, pattern=REQUEST_KEY)
    reason: str = Field(default="archived", min_length=1, max_length=500)


class CreateAppRequest(_Wire):
    """An app of the project to provision; its name names a directory, like a project ID.
    ``clientRequestId`` makes the command's ID (else the UTC second)."""

    app_name: str = Field(pattern=PROJECT_ID_PATTERN.pattern)
    client_request_id: str | None = Field(default=None, pattern=REQUEST_KEY)


class ProjectBody(_Wire):
    """A project: its owner, administrative status, canonical generation and live apps."""

    project_id: str
    name: str
    tenant_id: str
    status: Literal["active", "archived", "deleted"]
    canonical_generation: int
    live_apps: list[str]


# -- Changes -----------------------------------------------------------------------------------


class TaskPlanRequest(_Wire):
    """One Task of a requested work graph."""

    task_id: str = Field(pattern=TASK_ID)
    title: str = Field(min_length=1, max_length=500)
    agent_id: str = Field(pattern=AGENT_ID, description="The Agent the dispatcher wakes.")
    depends_on: list[Annotated[str, Field(pattern=TASK_ID)]] = Field(
        default_factory=list, max_length=MAX_TASKS_PER_CHANGE
    )
    script: str | None = Field(
        default=None, min_length=1, max_length=200, description="A scripted agent's script."
    )

    def plan(self) -> TaskPlan:
        return TaskPlan(
            task_id=self.task_id,
            title=self.title,
            agent_id=self.agent_id,
            depends_on=tuple(self.depends_on),
            script=self.script,
        )


class CreateChangeRequest(_Wire):
    """A Change with its work graph. ``clientRequestId`` is the idempotency key: the same
    key in the same project answers the first Change."""

    client_request_id: str = Field(pattern=KEY_ID)
    title: str = Field(min_length=1, max_length=500)
    tasks: list[TaskPlanRequest] = Field(min_length=1, max_length=MAX_TASKS_PER_CHANGE)

    @field_validator("tasks")
    @classmethod
    def _one_graph(cls, value: list[TaskPlanRequest]) -> list[TaskPlanRequest]:
        """Each Task once; dependencies only on Tasks of this graph, never on itself. (A
        cycle is the library's to find: it orders the graph.)"""
        ids = [t.task_id for t in value]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"the tasks {twice} are named twice; give each task one ID")
        known = set(ids)
        for task in value:
            unknown = sorted(set(task.depends_on) - known)
            if unknown:
                raise ValueError(
                    f"task {task.task_id!r} depends on {unknown}, which are not tasks of this "
                    "change"
                )
            if task.task_id in task.depends_on:
                raise ValueError(f"task {task.task_id!r} depends on itself")
        return value

    def plans(self) -> list[TaskPlan]:
        return [t.plan() for t in self.tasks]


class ReasonRequest(_Wire):
    """Why a Change is declined or cancelled (kept on the Change)."""

    reason: str = Field(default="", max_length=1000)


class TaskBody(_Wire):
    """One Task: its status, holder, plan and outcome. Its ID (and those it depends on) is
    qualified by its Change, ``<changeId>.<taskId>``, as in its events and its wakes."""

    task_id: str
    change_id: str
    status: TaskStatus
    title: str
    agent_id: str | None = Field(default=None, description="The Agent holding it, if any.")
    planned_agent: str | None = Field(default=None, description="The Agent the plan names.")
    depends_on: list[str]
    script: str | None = None
    changeset_id: str | None = None
    reason: str = ""
    blocked_limit: str | None = None

    @classmethod
    def of(cls, task: TaskState) -> TaskBody:
        return cls(
            task_id=task.task_id,
            change_id=task.change_id,
            status=task.status,
            title=task.title,
            agent_id=task.agent_id,
            planned_agent=task.planned_agent,
            depends_on=list(task.depends_on),
            script=task.script,
            changeset_id=task.changeset_id,
            reason=task.reason,
            blocked_limit=task.blocked_limit,
        )


class CandidateBody(_Wire):
    """A Candidate: the Change's changesets composed on a canonical generation."""

    candidate_id: str
    change_id: str
    status: CandidateStatus
    base_generation: int
    changeset_ids: list[str]
    paths: list[str]
    reason: str = ""
    change_status: ChangeStatus | None = Field(
        default=None, description="The Change's status (in a project's list of Candidates)."
    )

    @classmethod
    def of(cls, candidate: CandidateState, change: ChangeState | None = None) -> CandidateBody:
        return cls(
            candidate_id=candidate.candidate_id,
            change_id=candidate.change_id,
            status=candidate.status,
            base_generation=candidate.base_generation,
            changeset_ids=list(candidate.changeset_ids),
            paths=list(candidate.paths),
            reason=candidate.reason,
            change_status=ChangeStatus(change.status) if change is not None else None,
        )


class ReleaseBody(_Wire):
    """A release of a promoted generation to the project's app."""

    release_id: str
    change_id: str
    generation: int
    candidate_id: str
    app_name: str
    status: ReleaseStatus
    reason: str = ""

    @classmethod
    def of(cls, release: ReleaseState) -> ReleaseBody:
        return cls(
            release_id=release.release_id,
            change_id=release.change_id,
            generation=release.generation,
            candidate_id=release.candidate_id,
            app_name=release.app_name,
            status=release.status,
            reason=release.reason,
        )


class ChangeSummary(_Wire):
    """A Change as a list shows it."""

    change_id: str
    project_id: str
    status: ChangeStatus
    reason: str = Field(default="", description="Why it moved last, or what needs attention.")
    title: str
    client_request_id: str
    requested_by: str
    created_at: datetime | None = None
    updated_at: datetime | None = None
    promoted_at: datetime | None = None

    @classmethod
    def of(cls, project_id: str, change: ChangeState) -> ChangeSummary:
        return cls(**_change_fields(project_id, change))


def _change_fields(project_id: str, change: ChangeState) -> dict[str, Any]:
    return {
        "change_id": change.change_id,
        "project_id": project_id,
        "status": ChangeStatus(change.status),
        "reason": change.reason,
        "title": change.title,
        "client_request_id": change.client_request_id,
        "requested_by": change.requested_by,
        "created_at": parse_timestamp(change.created_at),
        "updated_at": parse_timestamp(change.updated_at),
        "promoted_at": parse_timestamp(change.promoted_at),
    }


class ChangeBody(ChangeSummary):
    """A Change with its Tasks, Candidates and releases."""

    tasks: list[TaskBody]
    candidates: list[CandidateBody]
    releases: list[ReleaseBody]

    @classmethod
    def of_parts(
        cls,
        project_id: str,
        change: ChangeState,
        tasks: Sequence[TaskState],
        candidates: Sequence[CandidateState],
        releases: Sequence[ReleaseState],
    ) -> ChangeBody:
        return cls(
            **_change_fields(project_id, change),
            tasks=[TaskBody.of(t) for t in tasks],
            candidates=[CandidateBody.of(c) for c in candidates],
            releases=[ReleaseBody.of(r) for r in releases],
        )


class ChangeListBody(_Wire):
    """A project's Changes, oldest first."""

    items: list[ChangeSummary]


class TaskListBody(_Wire):
    """A Change's Tasks."""

    items: list[TaskBody]


class CandidateListBody(_Wire):
    """A project's Candidates, each with its Change's status."""

    items: list[CandidateBody]

    @classmethod
    def of(cls, located: Sequence[LocatedCandidate]) -> CandidateListBody:
        return cls(items=[CandidateBody.of(x.candidate, x.change) for x in located])


# -- agent callbacks ---------------------------------------------------------------------------


class StartTaskRequest(_Wire):
    """The admitted Agent starts the Task (assigned → running)."""

    agent_id: str = Field(pattern=AGENT_ID)

    def command(self, task_id: str) -> StartTask:
        return StartTask(task_id=task_id, agent_id=self.agent_id)


class IntentRequest(_Wire):
    """What the Agent means to change; declaring the same ID again with other paths changes
    the intent."""

    agent_id: str = Field(pattern=AGENT_ID)
    intent_id: str = Field(pattern=KEY_ID)
    paths: list[Annotated[str, Field(pattern=RESOURCE)]] = Field(min_length=1, max_length=100)
    summary: str = Field(default="", max_length=1000)

    def command(self, change_id: str) -> DeclareIntent:
        return DeclareIntent(
            intent_id=self.intent_id,
            agent_id=self.agent_id,
            paths=tuple(self.paths),
            summary=self.summary,
            change_id=change_id,
        )


class IntentBody(_Wire):
    """The intent as declared."""

    intent_id: str
    agent_id: str
    task_id: str
    paths: list[str]
    summary: str


class ClaimRequest(_Wire):
    """A resource (a path, or a directory ending in ``/``) the Agent claims for itself."""

    agent_id: str = Field(pattern=AGENT_ID)
    resource: str = Field(pattern=RESOURCE)

    def command(self) -> AcquireClaim:
        """The claim for the platform's claim TTL (the Agent does not choose it)."""
        return AcquireClaim(resource=self.resource, agent_id=self.agent_id)


class ClaimBody(_Wire):
    """A claim after the call: ``held`` with its expiry, or released."""

    resource: str
    agent_id: str
    held: bool
    expires_at: datetime | None = None


class ChallengeRequest(_Wire):
    """The Agent objects to another Agent's claim or intent on a resource (``targetAgentId``
    omitted: whoever holds it or means to touch it), and why."""

    agent_id: str = Field(pattern=AGENT_ID)
    challenge_id: str = Field(pattern=KEY_ID)
    resource: str = Field(pattern=RESOURCE)
    target_agent_id: str | None = Field(default=None, pattern=AGENT_ID)
    reason: str = Field(min_length=1, max_length=1000)

    @field_validator("target_agent_id")
    @classmethod
    def _not_itself(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and value == info.data.get("agent_id"):
            raise ValueError("an agent cannot challenge itself; name another agent or none")
        return value

    @field_validator("reason")
    @classmethod
    def _said(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a challenge needs a reason that says something")
        return value

    def command(self, change_id: str) -> CreateChallenge:
        return CreateChallenge(
            challenge_id=self.challenge_id,
            agent_id=self.agent_id,
            resource=self.resource,
            target_agent_id=self.target_agent_id,
            reason=self.reason,
            change_id=change_id,
        )


class ChallengeBody(_Wire):
    """The challenge as created."""

    challenge_id: str
    agent_id: str
    task_id: str
    resource: str
    target_agent_id: str | None
    reason: str


class ChangesetRequest(_Wire):
    """The Agent's proposed files for its Task: relative paths to their full content."""

    agent_id: str = Field(pattern=AGENT_ID)
    changeset_id: str = Field(pattern=KEY_ID)
    files: dict[str, str] = Field(min_length=1, max_length=1000)

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        for path in value:
            _check_file_path(path)
        size = len(json.dumps(dict(sorted(value.items()))).encode())
        if size > MAX_CHANGESET_BYTES:
            raise ValueError(
                f"the changeset is {size} bytes; at most {MAX_CHANGESET_BYTES} — keep large "
                "content in the artifact store"
            )
        return value

    def command(self, task_id: str, base_generation: int) -> ProposeChangeset:
        return ProposeChangeset(
            changeset_id=self.changeset_id,
            task_id=task_id,
            agent_id=self.agent_id,
            files=self.files,
            base_generation=base_generation,
        )


class ChangesetBody(_Wire):
    """A proposed changeset: its paths (not their content) and the generation it is on."""

    changeset_id: str
    change_id: str
    task_id: str
    agent_id: str
    paths: list[str]
    base_generation: int

    @classmethod
    def of(cls, changeset: Changeset) -> ChangesetBody:
        return cls(
            changeset_id=changeset.changeset_id,
            change_id=changeset.change_id,
            task_id=changeset.task_id,
            agent_id=changeset.agent_id,
            paths=list(changeset.paths),
            base_generation=changeset.base_generation,
        )


class CompleteTaskRequest(_Wire):
    """The Agent finished its Task, with the changeset it proposed (if any)."""

    agent_id: str = Field(pattern=AGENT_ID)
    changeset_id: str | None = Field(default=None, pattern=KEY_ID)

    def command(self, change_id: str, task_id: str) -> CompleteTask:
        return CompleteTask(
            change_id=change_id,
            task_id=task_id,
            agent_id=self.agent_id,
            changeset_id=self.changeset_id,
        )


class FailTaskRequest(_Wire):
    """The Agent gave up on its Task, and why."""

    agent_id: str = Field(pattern=AGENT_ID)
    reason: str = Field(min_length=1, max_length=1000)

    @field_validator("reason")
    @classmethod
    def _said(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a failure needs a reason that says something")
        return value

    def command(self, task_id: str) -> FailTask:
        return FailTask(task_id=task_id, agent_id=self.agent_id, reason=self.reason)


def _check_file_path(path: str) -> None:
    """The changeset rule: relative, ``/``-separated, never climbing out with ``..``."""
    if not _RESOURCE_RE.fullmatch(path):
        raise ValueError(f"file path {path[:80]!r} must be one line of 1 to 1024 characters")
    if path.startswith("/") or ".." in path.split("/") or "\\" in path:
        raise ValueError(f"file path {path[:80]!r} must be relative, use '/', and not climb '..'")


# -- the project view and feed -----------------------------------------------------------------


class _View(BaseModel):
    # The view's snapshot is plain data written elsewhere: a key added there must not make
    # this API fail, so unknown keys are dropped instead of refused.
    model_config = ConfigDict(
        frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True
    )


class FeedEvent(_View):
    """One event of a project's feed, as the projector applied it."""

    stream_seq: int
    event_type: str
    event_id: str
    occurred_at: datetime


class ActiveAgent(_View):
    agent_id: str
    change_id: str | None = None
    task_id: str | None = None


class ViewCandidate(_View):
    candidate_id: str
    change_id: str | None = None
    status: str


class ProjectViewBody(_View):
    """The dashboard's summary of a project, built from its events (it may lag them)."""

    project_id: str
    name: str | None = None
    status: str | None = None
    canonical_generation: int = 0
    events_applied: int = 0
    changes_by_state: dict[str, int] = Field(default_factory=dict)
    tasks_by_state: dict[str, int] = Field(default_factory=dict)
    active_agents: list[ActiveAgent] = Field(default_factory=list)
    candidates: list[ViewCandidate] = Field(default_factory=list)
    latest_events: list[FeedEvent] = Field(default_factory=list)

    @classmethod
    def of(cls, snapshot: Mapping[str, Any]) -> ProjectViewBody:
        return cls.model_validate(dict(snapshot))


class FeedBody(_View):
    """A project's latest events, newest first."""

    project_id: str
    items: list[FeedEvent]


# -- agents ------------------------------------------------------------------------------------


class RegisterAgentRequest(_Wire):
    """An Agent of the caller's tenant. A ``webhook`` Agent is woken by a signed POST to
    ``url``; without ``secrets`` it keeps its secrets, or a new one is generated and shown
    once. A ``scripted`` Agent plays sample scripts in process and takes neither."""

    agent_id: str = Field(pattern=AGENT_ID)
    kind: AgentKind
    url: str | None = Field(default=None, min_length=1, max_length=2048)
    # No length bounds here: a refused value is quoted in a 422, and a secret must never be
    # (the route checks how many, and the registry their form, without quoting them).
    secrets: list[str] | None = Field(
        default=None, description="1 or 2 (during a rotation), newest first: whsec_..."
    )

    @model_validator(mode="after")
    def _fits_the_kind(self) -> RegisterAgentRequest:
        if self.kind is AgentKind.WEBHOOK and self.url is None:
            raise ValueError("a webhook agent needs the url it is woken at")
        if self.kind is AgentKind.SCRIPTED and (self.url is not None or self.secrets is not None):
            raise ValueError("a scripted agent takes no url and no secrets")
        return self


class AgentBody(_Wire):
    """A registered Agent. Secrets are never shown, except ``secret``: one generated by this
    very registration, shown once — give it to the Agent to verify its wakes."""

    agent_id: str
    tenant_id: str
    kind: AgentKind
    url: str | None = None
    secret_count: int = Field(description="How many secrets sign its wakes (2 in a rotation).")
    secret: str | None = None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(
        cls, record: AgentRecord, *, url: str | None, generated_secret: str | None = None
    ) -> AgentBody:
        """``url`` as it may be shown (without user info or query, which may hold
        credentials)."""
        return cls(
            agent_id=record.agent_id,
            tenant_id=record.tenant_id,
            kind=record.kind,
            url=url,
            secret_count=len(record.secrets),
            secret=generated_secret,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )
