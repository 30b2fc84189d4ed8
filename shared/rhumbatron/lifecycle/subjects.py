"""What a lifecycle command refers to, checked before it is sent and when it is handled.

A command names its subject — the project, a Change, a Candidate, a promoted generation, an
app — and the handler of its queue acts on that subject. A subject that does not exist must
never be acted on as if it did: a ``release.start`` of a generation nobody promoted would
start a release of nothing, ``app.provision`` of a project nobody provisioned would record an
app of no project, ``verification.start`` of an unknown Candidate would be recorded as done.

:func:`check_command_subject` raises :class:`~rhumbatron.errors.UnknownSubjectError`, which
names the field at fault as the API's clients spell it. ``POST /commands`` calls it before
sending (422 with that field), and the integration module before it acts (a failure: the
command ends as a dead letter, never as done). The lifecycle's own producers build their
commands from the state they read, so they pass.

Only files that exist are read: a check never creates an actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.errors import UnknownSubjectError

if TYPE_CHECKING:
    from rhumbatron.lifecycle.world import LifecycleWorld
    from rhumbatron.protocol.envelopes import Command

__all__ = ["check_command_subject"]

#: Commands whose project need not exist yet: they create it.
_CREATES_ITS_PROJECT = frozenset({"project.provision"})


def check_command_subject(world: LifecycleWorld, command: Command) -> None:
    """Raise :class:`UnknownSubjectError` when ``command`` refers to a project, Change,
    Candidate, generation or app that does not exist."""
    project_id = command.project_id
    if command.command_type not in _CREATES_ITS_PROJECT and not world.project_exists(project_id):
        raise UnknownSubjectError(
            f"project {project_id!r} does not exist (it was never provisioned): provision it "
            f"with project.provision first",
            field="command.projectId",
        )
    payload = command.payload.model_dump()
    match command.command_type:
        case "verification.start":
            _check_candidate(world, command, payload["candidate_id"])
        case "release.start":
            _check_release(world, command, payload)


def _change_id(command: Command) -> str:
    """The Change the command names; it must name one that exists."""
    if command.change_id is None:
        raise UnknownSubjectError(
            f"{command.command_type} {command.command_id} names no Change: set changeId to "
            "the Change it belongs to",
            field="command.changeId",
        )
    return command.change_id


def _shard(world: LifecycleWorld, project_id: str, change_id: str) -> ResourceShard | None:
    """The shard of the Change, when its file exists."""
    ref = ResourceShard.ref_for(
        project_id, change_resource_key(change_id), world.actors.settings.resource_shard_count
    )
    if not ref.path(world.actors.settings.state_dir).exists():
        return None
    return world.change_shard(project_id, change_id)


def _existing_change(world: LifecycleWorld, command: Command) -> ResourceShard:
    change_id = _change_id(command)
    shard = _shard(world, command.project_id, change_id)
    if shard is None or shard.change_state(change_id) is None:
        raise UnknownSubjectError(
            f"Change {change_id!r} does not exist in project {command.project_id!r}",
            field="command.changeId",
        )
    return shard


def _check_candidate(world: LifecycleWorld, command: Command, candidate_id: str) -> None:
    shard = _existing_change(world, command)
    candidate = shard.candidate(candidate_id)
    if candidate is None or candidate.change_id != command.change_id:
        raise UnknownSubjectError(
            f"Candidate {candidate_id!r} does not exist in Change {command.change_id!r} of "
            f"project {command.project_id!r}",
            field="command.payload.candidateId",
        )


def _check_release(world: LifecycleWorld, command: Command, payload: dict[str, Any]) -> None:
    _existing_change(world, command)
    generation = int(payload["generation"])
    promoted = _promoted(world, command.project_id)
    if generation not in promoted:
        known = ", ".join(str(g) for g in sorted(promoted)) or "none yet"
        raise UnknownSubjectError(
            f"generation {generation} of project {command.project_id!r} was never promoted "
            f"(promoted: {known}); a release deploys a promoted generation",
            field="command.payload.generation",
        )
    candidate_id = payload.get("candidate_id")
    if candidate_id is not None and candidate_id != promoted[generation]:
        raise UnknownSubjectError(
            f"Candidate {candidate_id!r} did not become generation {generation} of project "
            f"{command.project_id!r}; {promoted[generation]!r} did",
            field="command.payload.candidateId",
        )
    app_name = payload.get("app_name")
    if app_name is not None and app_name not in world.admin_shard(command.project_id).live_apps():
        raise UnknownSubjectError(
            f"project {command.project_id!r} has no live app {app_name!r}: provision it with "
            "app.provision first",
            field="command.payload.appName",
        )


def _promoted(world: LifecycleWorld, project_id: str) -> dict[int, str]:
    """Each promoted generation of the project, with the Candidate that became it."""
    root = world.actors.project_root(project_id)
    rows = root.connection.execute("SELECT generation, candidate_id FROM artifacts")
    return {int(row[0]): str(row[1]) for row in rows}
