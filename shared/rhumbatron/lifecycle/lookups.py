"""Finding what a request names — a Change, one of its Tasks, a claim, an event — without
creating anything.

A read never creates an actor: a request that names a Change nobody created finds no shard
file and leaves none behind. What is not found is an error of its own (the API answers each
with a 404), never a :class:`~rhumbatron.errors.DomainError`, so a refusal of the state and
an unknown name stay apart.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.errors import (
    ChangeNotFoundError,
    EventNotFoundError,
    TaskNotFoundError,
)
from rhumbatron.lifecycle.requests import qualified_task_id
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import stream_index

if TYPE_CHECKING:
    from rhumbatron.core.settings import Settings
    from rhumbatron.domain.candidates import CandidateState
    from rhumbatron.domain.changes import ChangeState
    from rhumbatron.domain.releases import ReleaseState
    from rhumbatron.domain.resources import Claim
    from rhumbatron.domain.tasks import TaskState
    from rhumbatron.lifecycle.context import LookupContext

__all__ = [
    "ChangeDetail",
    "change_detail",
    "existing_change",
    "find_event",
    "live_claim",
    "reported_task",
    "shard_exists",
    "task_state",
]


@dataclass(frozen=True, slots=True)
class ChangeDetail:
    """A Change with its Tasks, Candidates and releases."""

    change: ChangeState
    tasks: list[TaskState]
    candidates: list[CandidateState]
    releases: list[ReleaseState]


def shard_exists(settings: Settings, project_id: str, resource_key: str) -> bool:
    """Whether the shard file owning ``resource_key`` exists: a read never creates one."""
    ref = ResourceShard.ref_for(project_id, resource_key, settings.resource_shard_count)
    return ref.path(settings.state_dir).exists()


def existing_change(
    app: LookupContext, project_id: str, change_id: str
) -> tuple[ResourceShard, ChangeState]:
    """The Change and its shard; :class:`ChangeNotFoundError` when there is none."""
    if shard_exists(app.settings, project_id, change_resource_key(change_id)):
        shard = app.lifecycle().world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is not None:
            return shard, change
    raise ChangeNotFoundError(f"no change {change_id!r} in project {project_id!r}")


def change_detail(app: LookupContext, project_id: str, change_id: str) -> ChangeDetail:
    """The Change with its Tasks, Candidates and releases (:class:`ChangeNotFoundError`)."""
    shard, change = existing_change(app, project_id, change_id)
    return ChangeDetail(
        change=change,
        tasks=shard.tasks_of_change(change_id),
        candidates=shard.candidates(change_id=change_id),
        releases=shard.releases(change_id=change_id),
    )


def reported_task(app: LookupContext, project_id: str, change_id: str, task_id: str) -> TaskState:
    """The Task an Agent reports on, named as planned (``t1``) or as its wake names it
    (``<changeId>.t1``); :class:`ChangeNotFoundError` or :class:`TaskNotFoundError`."""
    shard, _ = existing_change(app, project_id, change_id)
    task = shard.task_state(qualified_task_id(change_id, task_id))
    if task is None or task.change_id != change_id:
        raise TaskNotFoundError(f"no task {task_id!r} in change {change_id!r}")
    return task


def task_state(app: LookupContext, project_id: str, change_id: str, task_id: str) -> TaskState:
    """The Task (by its qualified ID) as it is now, after a report on it."""
    task = app.lifecycle().world.change_shard(project_id, change_id).task_state(task_id)
    assert task is not None  # it was found before the report, and tasks are never deleted
    return task


def live_claim(app: LookupContext, project_id: str, resource: str, agent_id: str) -> Claim | None:
    """``agent_id``'s claim on ``resource`` when it is live now; None otherwise."""
    now = app.clock.now()
    for claim in app.resource_shard(project_id, resource).claims():
        if claim.resource == resource and claim.agent_id == agent_id and claim.live_at(now):
            return claim
    return None


async def find_event(app: LookupContext, project_id: str, event_id: str) -> Event:
    """The event as it is on the project's stream, found through the project view (which
    knows each applied event's stream sequence); :class:`EventNotFoundError` otherwise."""
    view = app.router().projector.view(project_id)
    seq = await asyncio.to_thread(view.stream_seq_of, event_id)
    log = await app.router().event_log()
    raw = None if seq is None else await log.read_at(stream_index(project_id), seq)
    if raw is None:
        raise EventNotFoundError(
            f"no event {event_id!r} of project {project_id!r} on its stream: the project "
            "view has not applied it yet (retry shortly), or it is past the stream's max "
            "age (`rhumbatron replay --source archive` reads the S3 archive)"
        )
    event = Event.parse(raw)
    if event.event_id != event_id:  # the sequence was reused after a purge
        raise EventNotFoundError(
            f"event {event_id!r} is no longer on project {project_id!r}'s stream"
        )
    return event
