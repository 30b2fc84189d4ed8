"""The lifecycle's reads across a project's actor files.

A Change, its Tasks, changesets, Candidates and release live in the shard of ``change:<id>``;
a project's administration (archived or deleted, its apps) in the shard of ``project:<id>``;
its canonical generation in its root. Questions that span Changes — every open Candidate of a
project, every Change still releasing — visit the project's shard files. Only files that exist
are opened: a read never creates an actor.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from rhumbatron.actors.actor import ActorKind, ActorRef
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.core.clock import parse_timestamp
from rhumbatron.domain.candidates import CandidateState, CandidateStatus
from rhumbatron.domain.changes import ChangeState, ChangeStatus
from rhumbatron.domain.project import project_admin_key
from rhumbatron.domain.releases import ReleaseStatus, release_id_for
from rhumbatron.lifecycle.housekeeping import QuietChange, ReleasingChange

if TYPE_CHECKING:
    from rhumbatron.actors.directory import ActorDirectory
    from rhumbatron.indexing import CanonicalSnapshot, Indexer
    from rhumbatron.lifecycle.forks import ForkStore

__all__ = ["LifecycleWorld", "LocatedCandidate"]

#: States a quiet Change may be settled in: work that should be moving by itself.
_SETTLEABLE = (ChangeStatus.OPEN.value, ChangeStatus.VERIFYING.value)


@dataclass(frozen=True, slots=True)
class LocatedCandidate:
    """A Candidate and the Change it composes."""

    candidate: CandidateState
    change: ChangeState


@dataclass
class LifecycleWorld:
    """Reads over the actors of every project under the state directory."""

    actors: ActorDirectory
    #: The indexer's ``project_indexes``, for the index questions of housekeeping.
    indexer: Indexer | None = None
    #: The Candidates' fork files, for what an archived project still has to clean up.
    forks: ForkStore | None = None

    # -- where things live -----------------------------------------------------------------
    def change_shard(self, project_id: str, change_id: str) -> ResourceShard:
        return self.actors.resource_shard(project_id, change_resource_key(change_id))

    def admin_shard(self, project_id: str) -> ResourceShard:
        return self.actors.resource_shard(project_id, project_admin_key(project_id))

    def project_exists(self, project_id: str) -> bool:
        return ProjectRoot.ref_for(project_id).path(self.actors.settings.state_dir).exists()

    def project_ids(self) -> list[str]:
        """Every project with a root actor, sorted."""
        return sorted(
            {
                ref.project_id
                for ref in self.actors.actor_refs()
                if ref.kind is ActorKind.PROJECT_ROOT
            }
        )

    def _shard_refs(self, project_id: str) -> Iterator[ActorRef]:
        """The project's shard files that exist, from one listing of its directory (the
        release sweep asks this of every project every five minutes)."""
        project_dir = ProjectRoot.ref_for(project_id).path(self.actors.settings.state_dir).parent
        try:
            names = {entry.name for entry in os.scandir(project_dir)}
        except FileNotFoundError:
            return
        for index in range(self.actors.settings.resource_shard_count):
            ref = ActorRef(ActorKind.RESOURCE_SHARD, project_id, index)
            if ref.file_name in names:
                yield ref

    def shards(self, project_id: str) -> Iterator[ResourceShard]:
        """The project's shard files that exist."""
        for ref in self._shard_refs(project_id):
            actor = self.actors.actor(ref)
            assert isinstance(actor, ResourceShard)
            yield actor

    def visited_shards(self, project_id: str) -> Iterator[ResourceShard]:
        """The project's shard files that exist, each closed again once the loop moves on if
        it was opened for the visit: the release sweep reads every shard of every project,
        and a warm sweep must not keep a file open for each."""
        for ref in self._shard_refs(project_id):
            with self.actors.visiting(ref) as actor:
                assert isinstance(actor, ResourceShard)
                yield actor

    def project_status(self, project_id: str) -> str:
        """``active``, ``archived`` or ``deleted``; a project never administered is active."""
        ref = ResourceShard.ref_for(
            project_id, project_admin_key(project_id), self.actors.settings.resource_shard_count
        )
        if not ref.path(self.actors.settings.state_dir).exists():
            return "active"
        # A visit: the release sweep asks this of every project every five minutes.
        with self.actors.visiting(ref) as shard:
            assert isinstance(shard, ResourceShard)
            return shard.project_status()

    def canonical_generation(self, project_id: str) -> int:
        if not self.project_exists(project_id):
            return 0
        state = self.actors.project_root(project_id).state()
        return 0 if state is None else state.canonical_generation

    # -- Changes and Candidates --------------------------------------------------------------
    def changes(self, project_id: str, statuses: Sequence[str] | None = None) -> list[ChangeState]:
        found = [c for shard in self.shards(project_id) for c in shard.changes(statuses=statuses)]
        return sorted(found, key=lambda c: (c.created_at, c.change_id))

    def candidates(self, project_id: str) -> list[LocatedCandidate]:
        """Every Candidate of the project with its Change."""
        located: list[LocatedCandidate] = []
        for shard in self.shards(project_id):
            for candidate in shard.candidates():
                change = shard.change_state(candidate.change_id)
                if change is not None:
                    located.append(LocatedCandidate(candidate, change))
        return located

    def open_candidates(self, project_id: str) -> list[LocatedCandidate]:
        return [c for c in self.candidates(project_id) if c.candidate.open]

    def promoted_candidate(
        self, project_id: str, change_id: str
    ) -> tuple[CandidateState, int] | None:
        """The Change's Candidate that canonical took, with the generation it became (the
        newest, should there be several); None when none of its Candidates was promoted."""
        if not self.project_exists(project_id):
            return None
        root = self.actors.project_root(project_id)
        generations = {
            str(row[0]): int(row[1])
            for row in root.connection.execute("SELECT candidate_id, generation FROM artifacts")
        }
        shard = self.change_shard(project_id, change_id)
        promoted = [
            (c, generations[c.candidate_id])
            for c in shard.candidates(change_id=change_id)
            if c.candidate_id in generations
        ]
        return max(promoted, key=lambda p: p[1]) if promoted else None

    def find_candidate(self, project_id: str, candidate_id: str) -> LocatedCandidate | None:
        for shard in self.shards(project_id):
            candidate = shard.candidate(candidate_id)
            if candidate is not None:
                change = shard.change_state(candidate.change_id)
                if change is not None:
                    return LocatedCandidate(candidate, change)
        return None

    # -- the indexer's source ----------------------------------------------------------------
    def canonical_snapshot(self, project_id: str) -> CanonicalSnapshot | None:
        """The canonical files: every promoted Candidate's changesets applied in generation
        order (a later generation's file replaces an earlier one's)."""
        # Imported here: the indexing package brings the queue consumer runtime, which the
        # operator API's cold start does not need.
        from rhumbatron.indexing import CanonicalSnapshot, Document

        if not self.project_exists(project_id):
            return None
        root = self.actors.project_root(project_id)
        state = root.state()
        if state is None or state.canonical_generation == 0:
            return None
        files: dict[str, str] = {}
        for candidate_id in root.promoted_candidate_ids():
            located = self.find_candidate(project_id, candidate_id)
            if located is None:
                continue  # its shard was lost; index what remains
            shard = self.change_shard(project_id, located.change.change_id)
            for changeset in shard.changesets_of_candidate(located.candidate):
                files.update(changeset.files)
        documents = tuple(Document(path, content) for path, content in sorted(files.items()))
        return CanonicalSnapshot(state.canonical_generation, documents)

    # -- housekeeping (the sweep's questions) ------------------------------------------------
    def _projects_with_status(self, status: str) -> list[str]:
        return [p for p in self.project_ids() if self.project_status(p) == status]

    def archived_projects(self, limit: int) -> list[str]:
        """Archived Projects with something left to clean up: a live app, an index not purged
        yet, or a fork file. A cleaned one is not queued again every day — it would hold one
        of the ``limit`` places forever and starve the archived Projects after it."""
        archived = self._projects_with_status("archived")
        indexed = set(self.indexer.projects_with_index_rows(archived)) if self.indexer else set()
        return [
            p
            for p in archived
            if p in indexed
            or self.admin_shard(p).live_apps()
            or (self.forks is not None and self.forks.has_forks(p))
        ][:limit]

    def active_projects_without_ready_index(self, limit: int) -> list[str]:
        indexer = self.indexer
        if indexer is None:
            return []
        found = []
        for project_id in self._projects_with_status("active"):
            generation = self.canonical_generation(project_id)
            ready = indexer.ready_generation(project_id)
            if generation > 0 and (ready is None or ready < generation):
                found.append(project_id)
            if len(found) >= limit:
                break
        return found

    def deleted_projects_with_index_rows(self, limit: int) -> list[str]:
        if self.indexer is None:
            return []
        deleted = self._projects_with_status("deleted")
        return self.indexer.projects_with_index_rows(deleted)[:limit]

    def releasing_changes(self, promoted_before: datetime, limit: int) -> list[ReleasingChange]:
        found: list[ReleasingChange] = []
        for project_id in self.project_ids():
            for shard in self.visited_shards(project_id):
                for change in shard.changes(statuses=(ChangeStatus.RELEASING.value,)):
                    promoted = parse_timestamp(change.promoted_at)
                    if promoted is None or promoted > promoted_before:
                        continue
                    releases = [
                        r
                        for r in shard.releases(change_id=change.change_id)
                        if r.status is not ReleaseStatus.COMPLETED
                    ]
                    release_id = (
                        releases[-1].release_id
                        if releases
                        else self._release_to_start(project_id, change.change_id)
                    )
                    found.append(
                        ReleasingChange(project_id, change.change_id, release_id, promoted)
                    )
        found.sort(key=lambda r: r.promoted_at)
        return found[:limit]

    def _release_to_start(self, project_id: str, change_id: str) -> str:
        """The ID of the release a releasing Change never started: ``rel_<project>_<gen>`` of
        its promoted generation. ``release.recover`` needs a non-empty ID, and each Change a
        distinct one (its command ID is keyed on it). A Change with no promoted Candidate has
        no release to name: its own ID stands in (no release has it), and the recover
        handler completes it with nothing to release."""
        promoted = self.promoted_candidate(project_id, change_id)
        return change_id if promoted is None else release_id_for(project_id, promoted[1])

    def quiet_changes(
        self, updated_after: datetime, updated_before: datetime, limit: int
    ) -> list[QuietChange]:
        """Open or verifying Changes last moved inside the window that cannot move on their
        own: no Agent holds one of their Tasks and no Candidate of theirs is being verified.
        A Change moves when it or one of its Tasks does: the Change row changes only with
        its status, so a Change open for hours whose Task failed just now is not quiet."""
        found: list[QuietChange] = []
        for project_id in self.project_ids():
            for shard in self.visited_shards(project_id):
                for change in shard.changes(statuses=_SETTLEABLE):
                    updated = _last_moved(shard, change)
                    if updated is None or not updated_after <= updated <= updated_before:
                        continue
                    if any(t.active for t in shard.tasks_of_change(change.change_id)):
                        continue
                    verifying = any(
                        c.status is CandidateStatus.CREATED
                        for c in shard.candidates(change_id=change.change_id)
                    )
                    if verifying:
                        continue
                    found.append(QuietChange(project_id, change.change_id, change.status, updated))
        found.sort(key=lambda q: q.updated_at)
        return found[:limit]


def _last_moved(shard: ResourceShard, change: ChangeState) -> datetime | None:
    """When the Change or one of its Tasks last moved."""
    rows = shard.connection.execute(
        "SELECT updated_at FROM tasks WHERE change_id = ?", (change.change_id,)
    )
    moments = [parse_timestamp(change.updated_at), *(parse_timestamp(row[0]) for row in rows)]
    known = [m for m in moments if m is not None]
    return max(known) if known else None
