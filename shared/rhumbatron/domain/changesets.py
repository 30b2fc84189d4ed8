"""Changesets: what an Agent proposes for its Task (the files it would change).

A changeset lives in the shard of its Change, next to the Task it belongs to, so the
Candidate composed later reads it in that shard. ``changeset.proposed`` is a resource Event:
its ``resource`` is the deepest directory every path shares (or the one path), so the causal
router can wake the Agents working near it.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.tasks import TaskState, TaskStatus
from rhumbatron.domain.transition import Insert, Transition
from rhumbatron.errors import DomainError

__all__ = ["MAX_CHANGESET_BYTES", "Changeset", "propose_changeset", "shared_resource"]

_CHANGESET_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}\Z")
#: A changeset's files are kept in the actor file; keep one proposal small.
MAX_CHANGESET_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Changeset:
    changeset_id: str
    change_id: str
    task_id: str
    agent_id: str
    files: Mapping[str, str]
    base_generation: int

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted(self.files))


def shared_resource(paths: tuple[str, ...]) -> str:
    """The one path, or the deepest directory (ending in ``/``) all ``paths`` share. Paths
    that share none name their first path: a resource Event carries one resource, and the
    full list is in the payload."""
    if len(paths) == 1:
        return paths[0]
    common = posixpath.commonpath(paths)
    return f"{common}/" if common else sorted(paths)[0]


def _check_path(path: str) -> None:
    if not path or path.startswith("/") or ".." in path.split("/") or "\\" in path:
        raise DomainError(
            f"changeset path {path!r} must be relative, use '/', and not climb with '..'"
        )


def _checked_body(changeset_id: str, files: Mapping[str, str]) -> str:
    """The proposal's files as the stored JSON, after checking its ID, its paths and its
    size."""
    if not _CHANGESET_ID.match(changeset_id):
        raise DomainError(
            f"changeset ID {changeset_id!r} must be 1-128 letters, digits, '.', '_', ':' or '-'"
        )
    if not files:
        raise DomainError(f"changeset {changeset_id!r} has no files")
    for path in files:
        _check_path(path)
    body = json.dumps(dict(sorted(files.items())))
    if len(body.encode()) > MAX_CHANGESET_BYTES:
        raise DomainError(
            f"changeset {changeset_id!r} is {len(body.encode())} bytes; at most "
            f"{MAX_CHANGESET_BYTES} — keep large content in the artifact store"
        )
    return body


def propose_changeset(
    existing: Changeset | None,
    task: TaskState | None,
    ctx: FactContext,
    *,
    changeset_id: str,
    task_id: str,
    agent_id: str,
    files: Mapping[str, str],
    base_generation: int,
) -> Transition:
    """Record the proposal (``changeset.proposed``); proposing the same ID again is nothing.
    Only the Agent holding the Task proposes for it."""
    if existing is not None:
        if existing.task_id != task_id or dict(existing.files) != dict(files):
            raise DomainError(
                f"changeset {changeset_id!r} was already proposed with other content; "
                "propose a new changeset ID"
            )
        return Transition()
    if (
        task is None
        or task.agent_id != agent_id
        or task.status not in (TaskStatus.ASSIGNED, TaskStatus.RUNNING)
    ):
        raise DomainError(
            f"agent {agent_id!r} does not hold task {task_id!r}; only its agent proposes for it"
        )
    body = _checked_body(changeset_id, files)
    paths = tuple(sorted(files))
    row = {
        "changeset_id": changeset_id,
        "change_id": task.change_id,
        "task_id": task_id,
        "agent_id": agent_id,
        "files": body,
        "base_generation": base_generation,
        "created_at": ctx.now.isoformat(),
    }
    fact = ctx.fact(
        "changeset.proposed",
        {
            "changesetId": changeset_id,
            "agentId": agent_id,
            "paths": list(paths),
            "baseGeneration": base_generation,
        },
        change_id=task.change_id,
        task_id=task_id,
        resource=shared_resource(paths),
    )
    return Transition(patch=(Insert("changesets", row),), facts=(fact,))
