"""The actor directory: every actor file of a state directory, opened on first use.

One per process (the composition root owns it). It finds an actor by reference, by project
(its root) or by resource (the shard that owns the key), lists the actor files on disk,
answers which tenant owns a project, and closes what it opened. The lower layers take it, or
a Protocol it satisfies, instead of the whole runtime.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rhumbatron.actors.actor import Actor, ActorKind, ActorRef
from rhumbatron.actors.alarms import AlarmSink
from rhumbatron.actors.due_index import DueIndex
from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import ActorError, RhumbatronError

__all__ = ["ActorDirectory"]

_log = logging.getLogger(__name__)


@dataclass
class ActorDirectory:
    """The actors of ``settings.state_dir``, cached once opened."""

    settings: Settings
    clock: Clock
    alarms: AlarmSink
    _actors: dict[ActorRef, Actor] = field(default_factory=dict)

    def actor(self, ref: ActorRef) -> Actor:
        """The (cached) actor for ``ref``."""
        self.check_shard(ref)
        actor = self._actors.get(ref)
        if actor is None:
            cls = ProjectRoot if ref.kind is ActorKind.PROJECT_ROOT else ResourceShard
            actor = cls(ref, self.settings, clock=self.clock, alarms=self.alarms)
            self._actors[ref] = actor
        return actor

    @property
    def due_index(self) -> DueIndex:
        """The index of actors that may hold an alarm (the every-minute scan reads it)."""
        return DueIndex.of_state_dir(self.settings.state_dir)

    def check_shard(self, ref: ActorRef) -> None:
        """Refuse a shard index the project does not have (a stale or mistyped key)."""
        if ref.shard is not None and ref.shard >= self.settings.resource_shard_count:
            raise ActorError(
                f"actor {ref.key} names shard {ref.shard}, but projects have "
                f"{self.settings.resource_shard_count} shards (RHUMBATRON_RESOURCE_SHARD_COUNT)"
            )

    def project_root(self, project_id: str) -> ProjectRoot:
        """The root actor of ``project_id``."""
        actor = self.actor(ProjectRoot.ref_for(project_id))
        assert isinstance(actor, ProjectRoot)
        return actor

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard:
        """The shard of ``project_id`` that owns ``resource_key`` (``change:<id>``, a path …)."""
        ref = ResourceShard.ref_for(project_id, resource_key, self.settings.resource_shard_count)
        actor = self.actor(ref)
        assert isinstance(actor, ResourceShard)
        return actor

    def is_open(self, ref: ActorRef) -> bool:
        """Whether this process holds ``ref``'s file open."""
        return ref in self._actors

    @property
    def open_actor_count(self) -> int:
        """Actor files this process holds open right now."""
        return len(self._actors)

    def actor_refs(self) -> Iterator[ActorRef]:
        """Every actor file under the state directory."""
        projects = self.settings.state_dir / "projects"
        if not projects.is_dir():
            return
        for path in sorted(projects.glob("*/*.sqlite")):
            project_id, name = path.parent.name, path.stem
            try:
                if name == "root":
                    yield ActorRef(ActorKind.PROJECT_ROOT, project_id)
                elif name.startswith("shard-"):
                    yield ActorRef(ActorKind.RESOURCE_SHARD, project_id, int(name[6:]))
            except (ActorError, ValueError):
                continue  # not an actor file of ours

    @contextmanager
    def visiting(self, ref: ActorRef) -> Iterator[Actor]:
        """The actor for one visit: a file opened only for it is closed again after, so a
        warm container visiting every actor does not collect open files."""
        opened_here = ref not in self._actors
        try:
            yield self.actor(ref)
        finally:
            if opened_here and ref in self._actors:
                self._actors.pop(ref).close()

    def project_tenant(self, project_id: str) -> str | None:
        """The tenant owning ``project_id``, from its root actor; None when the project was
        never created. Only an existing file is opened: a mistyped project must not create an
        actor file."""
        ref = ProjectRoot.ref_for(project_id)
        if not ref.path(self.settings.state_dir).exists():
            return None
        # A visit: a root opened only to read its tenant is closed again, so a router that
        # checks the events of thousands of projects does not hold a file open for each.
        with self.visiting(ref) as root:
            assert isinstance(root, ProjectRoot)
            state = root.state()
        return None if state is None else state.tenant_id

    def outbox_backlog(self, *, every_actor: bool) -> dict[str, int]:
        """Open outbox rows by state (pending, retry_wait, failed): the dashboards' backlog.

        Every actor with an open row has a marker in the due-actor index (see
        :mod:`~rhumbatron.actors.due_index`), so only those actors are opened, not every
        actor file; a state directory the index does not cover yet (no full walk so far) is
        walked whole. ``every_actor`` walks every file and adds the published rows the
        outboxes still hold (the local dashboard). An actor that cannot be read is logged
        and left out; files opened for it are closed again.
        """
        states = list(RowState) if every_actor else [s for s in RowState if s.is_open]
        totals = {state.value: 0 for state in states}
        refs = self.actor_refs() if every_actor else self._backlog_refs()
        for ref in refs:
            try:
                with self.visiting(ref) as actor:
                    counts = counts_by_state(actor.connection)
            except (RhumbatronError, sqlite3.Error) as exc:
                _log.error("cannot read the outbox of %s: %s", ref.key, exc)
                continue
            for state in totals:
                totals[state] += counts[state]
        return totals

    def _backlog_refs(self) -> Iterator[ActorRef]:
        index = self.due_index
        if not index.is_complete():
            yield from self.actor_refs()
            return
        yield from self.indexed_refs(index.marked())

    def indexed_refs(self, keys: list[str]) -> list[ActorRef]:
        """The actors behind the due-actor index's ``keys``; a stray name or a marker whose
        actor file is gone is dropped from the index (visiting it would create the file)."""
        index = self.due_index
        state_dir = self.settings.state_dir
        refs: list[ActorRef] = []
        for key in keys:
            try:
                ref = ActorRef.parse(key)
                self.check_shard(ref)
            except ActorError as exc:
                _log.warning("the due-actor index holds %r, which is no actor: %s", key, exc)
                index.forget(key)
                continue
            if not self.is_open(ref) and not ref.path(state_dir).exists():
                index.forget(key)
                continue
            refs.append(ref)
        return refs

    def close(self) -> None:
        """Close every actor file this directory opened."""
        for actor in self._actors.values():
            actor.close()
        self._actors.clear()
