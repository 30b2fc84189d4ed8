"""What a person asks of a project: provision it, clean it up, provision or remove an app,
archive it — and what a read of the project shows.

The API's project routes call these; each checks the project's state first and refuses with
an error of its own (the API answers each with its 409). Provisioning, cleanup and the apps
are commands on the integration queue, planned here with IDs that are stable per request, so
a client retrying a request within JetStream's 2-hour window is answered ``duplicate: true``
and nothing runs twice (the project and app handlers are idempotent on state besides):

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

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rhumbatron.actors.shard_commands import SetProjectStatus
from rhumbatron.domain.project import ProjectState, project_admin_key
from rhumbatron.errors import (
    ProjectActiveError,
    ProjectExistsError,
    ProjectIdUnavailableError,
    ProjectNotActiveError,
)
from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.lifecycle.lookups import shard_exists

if TYPE_CHECKING:
    from rhumbatron.domain.facts import Caller
    from rhumbatron.lifecycle.context import LifecycleWithWorld
    from rhumbatron.lifecycle.world import LifecycleWorld
    from rhumbatron.protocol.envelopes import Command

__all__ = [
    "PlannedCommand",
    "ProjectOverview",
    "ProjectRequests",
]


@dataclass(frozen=True, slots=True)
class PlannedCommand:
    """A lifecycle command to send: its type, stable ID, project and payload. It is built
    (:meth:`at`) when it is sent, so its time is the send's."""

    command_type: str
    command_id: str
    project_id: str
    payload: dict[str, Any]

    def at(self, now: datetime) -> Command:
        """The command, created at ``now``."""
        return lifecycle_command(
            self.command_type,
            self.command_id,
            project_id=self.project_id,
            now=now,
            payload=self.payload,
        )


@dataclass(frozen=True, slots=True)
class ProjectOverview:
    """A project as a read shows it: its root's state, administrative status and live apps."""

    state: ProjectState
    status: str
    live_apps: list[str]


@dataclass
class ProjectRequests:
    """A project's requests over ``app``; cheap to build (it holds only the runtime)."""

    app: LifecycleWithWorld

    @property
    def _world(self) -> LifecycleWorld:
        return self.app.lifecycle().world

    def provision(self, tenant_id: str, project_id: str, name: str) -> PlannedCommand:
        """``project.provision`` of ``project_id`` for ``tenant_id``. Refused when the ID is
        another tenant's project, or the project exists under another name; provisioning
        the same project again with the same name is harmless."""
        owner = self.app.project_tenant(project_id)
        if owner is not None and owner != tenant_id:
            raise ProjectIdUnavailableError(
                f"project ID {project_id!r} is not available; choose another project ID"
            )
        # Only a project that has an owner has a root to read: a read never creates one.
        state = self.app.project_root(project_id).state() if owner is not None else None
        if state is not None and state.name != name:
            raise ProjectExistsError(
                f"project {project_id!r} already exists named {state.name!r}, not {name!r}"
            )
        return PlannedCommand(
            "project.provision",
            f"cmd_provision_{project_id}",
            project_id,
            {"name": name, "tenantId": tenant_id},
        )

    def cleanup(
        self, project_id: str, *, client_request_id: str | None, reason: str
    ) -> PlannedCommand:
        """``project.cleanup`` of an archived or deleted project (its apps removed, its forks
        deleted); an active project is refused: archive it first."""
        if self._world.project_status(project_id) == "active":
            raise ProjectActiveError(
                f"project {project_id!r} is active; archive it before cleaning it up"
            )
        key = client_request_id or self.app.clock.now().strftime("%Y-%m-%d")
        return PlannedCommand(
            "project.cleanup", f"cmd_cleanup_{project_id}.{key}", project_id, {"reason": reason}
        )

    def provision_app(
        self, project_id: str, app_name: str, *, client_request_id: str | None
    ) -> PlannedCommand:
        """``app.provision`` of an app of an active project."""
        self.require_active(project_id, "provision an app")
        key = client_request_id or _second(self.app.clock.now())
        return PlannedCommand(
            "app.provision",
            f"cmd_app_{project_id}.{app_name}.provision.{key}",
            project_id,
            {"appName": app_name},
        )

    def remove_app(
        self, project_id: str, app_name: str, *, client_request_id: str | None
    ) -> PlannedCommand:
        """``app.remove``; removing an app that is not live is nothing."""
        key = client_request_id or _second(self.app.clock.now())
        return PlannedCommand(
            "app.remove",
            f"cmd_app_{project_id}.{app_name}.remove.{key}",
            project_id,
            {"appName": app_name},
        )

    def archive(self, caller: Caller, project_id: str, *, reason: str) -> None:
        """Archive the project at once (``project.archived``); archiving it again is nothing.
        A deleted project is refused (the shard's :class:`DomainError`)."""
        self._world.admin_shard(project_id).apply(
            caller, SetProjectStatus(to="archived", reason=reason or "archived")
        )

    def require_active(self, project_id: str, doing: str) -> None:
        """Refuse ``doing`` (``"request a change"``) unless the project is active."""
        status = self._world.project_status(project_id)
        if status != "active":
            raise ProjectNotActiveError(
                f"project {project_id!r} is {status}; only an active project can {doing}"
            )

    def overview(self, project_id: str) -> ProjectOverview:
        """The project of an owner the caller found: its state, status and live apps."""
        state = self.app.project_root(project_id).state()
        assert state is not None  # the caller found its owner
        world = self._world
        live = (
            world.admin_shard(project_id).live_apps()
            if shard_exists(self.app.settings, project_id, project_admin_key(project_id))
            else []
        )
        return ProjectOverview(state=state, status=world.project_status(project_id), live_apps=live)


def _second(moment: datetime) -> str:
    return moment.strftime("%Y%m%dT%H%M%SZ")
