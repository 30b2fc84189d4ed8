"""The ProjectRoot actor: one per project; writes project.created, artifact.promoted and
canonical.advanced, and nothing else."""

from __future__ import annotations

import sqlite3

from rhumbatron.actors.actor import Actor, ActorKind, ActorRef, TransactResult
from rhumbatron.actors.rows import row_to
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import ProjectState, create_project, promote_candidate

__all__ = ["ProjectRoot"]


class ProjectRoot(Actor):
    """A project's root actor file: the project row, its artifacts, and its outbox."""

    KIND = ActorKind.PROJECT_ROOT
    STATE_SCHEMA = """
    CREATE TABLE IF NOT EXISTS project (
        project_id             TEXT PRIMARY KEY,
        tenant_id              TEXT NOT NULL,
        name                   TEXT NOT NULL,
        status                 TEXT NOT NULL,
        canonical_generation   INTEGER NOT NULL DEFAULT 0,
        canonical_candidate_id TEXT,
        created_at             TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS artifacts (
        artifact_id  TEXT PRIMARY KEY,
        candidate_id TEXT NOT NULL,
        generation   INTEGER NOT NULL UNIQUE,
        promoted_at  TEXT NOT NULL
    );
    """
    STATE_TABLES = frozenset({"project", "artifacts"})

    @classmethod
    def ref_for(cls, project_id: str) -> ActorRef:
        return ActorRef(ActorKind.PROJECT_ROOT, project_id)

    def state(self) -> ProjectState | None:
        """The project row, or None before it is created."""
        return _load(self.connection, self.ref.project_id)

    def create_project(self, caller: Caller, *, name: str) -> TransactResult:
        """Create the project (project.created); a repeat with the same name is a no-op."""
        return self.transact(
            lambda db: create_project(_load(db, self.ref.project_id), self._ctx(caller), name=name)
        )

    def promote(
        self,
        caller: Caller,
        *,
        candidate_id: str,
        artifact_id: str,
        expected_generation: int,
        change_ids: tuple[str, ...] = (),
    ) -> TransactResult:
        """Promote a candidate: artifact.promoted + canonical.advanced, or already promoted."""
        return self.transact(
            lambda db: promote_candidate(
                _load(db, self.ref.project_id),
                self._ctx(caller),
                candidate_id=candidate_id,
                artifact_id=artifact_id,
                expected_generation=expected_generation,
                change_ids=change_ids,
            )
        )

    def promoted_candidate_ids(self) -> list[str]:
        """The promoted Candidates, oldest generation first (the canonical history)."""
        rows = self.connection.execute("SELECT candidate_id FROM artifacts ORDER BY generation")
        return [str(row[0]) for row in rows]

    def _ctx(self, caller: Caller) -> FactContext:
        return FactContext(caller, self.ref.project_id, self.clock.now())


def _load(db: sqlite3.Connection, project_id: str) -> ProjectState | None:
    row = db.execute("SELECT * FROM project WHERE project_id = ?", (project_id,)).fetchone()
    return None if row is None else row_to(ProjectState, row)
