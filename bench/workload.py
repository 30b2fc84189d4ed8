"""The benchmark's events: real Event envelopes written by real actor transactions.

Several projects (one per event stream where possible), each with two ResourceShard actors,
each actor's outbox pre-filled with ``task.ready`` facts by ``AppendChangeEvents`` (one
fact per transaction, as a workflow step writes them). The filled state directory is a
*template*: every ``publish_due`` run drains a fresh copy of it, and the raw-publish runs send
exactly the envelope bytes and Event IDs stored in it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rhumbatron.actors.actor import Actor, ActorRef
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.protocol.ids import (
    EVENT_STREAM_COUNT,
    event_stream_subject,
    resource_shard_index,
    stream_index,
)
from rhumbatron.runtime.bootstrap import bootstrap

__all__ = ["RawMessage", "Workload", "build_workload", "copy_state"]


@dataclass(frozen=True, slots=True)
class RawMessage:
    """One stored outbox row as a raw publish sends it: subject, ``Nats-Msg-Id``, bytes."""

    subject: str
    message_id: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Workload:
    """A filled template state directory and the messages its outboxes hold, in outbox order."""

    template_dir: Path
    projects: tuple[str, ...]
    actors: tuple[ActorRef, ...]
    messages: tuple[RawMessage, ...]

    @property
    def events(self) -> int:
        """How many events (outbox rows) the template holds."""
        return len(self.messages)

    @property
    def mean_envelope_bytes(self) -> float:
        """The mean size of a stored envelope, in bytes."""
        return sum(len(m.data) for m in self.messages) / max(len(self.messages), 1)

    def describe(self) -> dict[str, object]:
        """The workload's shape, for ``results.json`` and the docs."""
        return {
            "projects": len(self.projects),
            "actors": len(self.actors),
            "events": self.events,
            "events_per_actor": self.events // max(len(self.actors), 1),
            "streams": sorted({stream_index(p) for p in self.projects}),
            "event_type": "task.ready",
            "mean_envelope_bytes": round(self.mean_envelope_bytes, 1),
        }


def _project_ids(count: int, prefix: str) -> list[str]:
    """``count`` project IDs, spread over distinct event streams while streams remain."""
    chosen: list[str] = []
    used: set[int] = set()
    candidate = 0
    while len(chosen) < count:
        project = f"{prefix}-{candidate:03d}"
        candidate += 1
        index = stream_index(project)
        if index in used and len(used) < min(count, EVENT_STREAM_COUNT):
            continue
        chosen.append(project)
        used.add(index)
    return chosen


def _changes_by_shard(
    project: str, shards: int, changes_per_actor: int, shard_count: int
) -> dict[int, list[str]]:
    """Change IDs of ``project`` grouped by owning shard: ``shards`` shards, each with enough."""
    found: dict[int, list[str]] = {}
    number = 0
    while True:
        full = [s for s, ids in found.items() if len(ids) >= changes_per_actor]
        if len(full) >= shards:
            return {s: found[s][:changes_per_actor] for s in sorted(full)[:shards]}
        change_id = f"chg-{project}-{number:05d}"
        number += 1
        shard = resource_shard_index(change_resource_key(change_id), shard_count)
        found.setdefault(shard, []).append(change_id)


def _fill_actor(shard: ResourceShard, caller: Caller, change_ids: list[str], events: int) -> None:
    """``events`` transactions, each appending one ``task.ready`` fact to one of the changes."""
    for number in range(events):
        change_id = change_ids[number % len(change_ids)]
        shard.apply(
            caller,
            AppendChangeEvents(
                change_id=change_id,
                status="running",
                facts=(
                    ChangeFact(
                        "task.ready", {"agent_role": "builder"}, task_id=f"task-{number:06d}"
                    ),
                ),
            ),
        )


def _fill_settings(state_dir: Path) -> Settings:
    # Filling is not measured: synchronous=NORMAL keeps it quick. Runs use the defaults.
    return load_settings(
        state_dir=state_dir,
        journal_mode="WAL",
        sqlite_synchronous="NORMAL",
        network_filesystem=False,
    )


def build_workload(
    template_dir: Path,
    *,
    projects: int,
    actors_per_project: int,
    events_per_actor: int,
    prefix: str = "bench",
    changes_per_actor: int = 8,
) -> Workload:
    """Fill ``template_dir`` through real actor transactions and read the outboxes back."""
    settings = _fill_settings(template_dir)
    app = bootstrap(settings)
    project_ids = _project_ids(projects, prefix)
    try:
        for project in project_ids:
            caller = Caller("tenant-bench", "system:bench", f"corr-{project}")
            groups = _changes_by_shard(
                project, actors_per_project, changes_per_actor, settings.resource_shard_count
            )
            for change_ids in groups.values():
                shard = app.resource_shard(project, change_resource_key(change_ids[0]))
                _fill_actor(shard, caller, change_ids, events_per_actor)
        refs = tuple(app.actor_refs())
        messages = tuple(_read_outboxes(app.actor(ref) for ref in refs))
    finally:
        for ref in app.actor_refs():
            app.actor(ref).close()  # the last connection to close checkpoints the WAL
    return Workload(template_dir, tuple(project_ids), refs, messages)


def _read_outboxes(actors: Iterable[Actor]) -> Iterator[RawMessage]:
    """Every outbox row of ``actors``, actor by actor, each in outbox order."""
    for actor in actors:
        for event_id, index, envelope in actor.connection.execute(
            "SELECT event_id, stream_index, envelope FROM outbox ORDER BY seq"
        ):
            yield RawMessage(event_stream_subject(index), event_id, bytes(envelope))


def copy_state(workload: Workload, destination: Path) -> Path:
    """A fresh copy of the filled template: every outbox row ``pending`` again."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(workload.template_dir, destination)
    return destination
