"""The ResourceShard actor: one of N per project; writes every Event but the three of the root.

Shard mapping: a resource key (``change:<id>``, ``file:src/app.py``) lives in shard
``fnv1a32(key) mod resource_shard_count`` of its project; Change Events go to the shard of
``change:<id>``, and so do the Change's status row and its Tasks, so a Task move and its fact
commit together. The shard count must never change once a project has actors.

Every write is a command (:mod:`rhumbatron.actors.shard_commands`) given to
:meth:`ResourceShard.apply`, which runs its handler (:mod:`rhumbatron.actors.shard_handlers`)
in one transaction; the reads are the shard's rows as domain state
(:mod:`rhumbatron.actors.shard_state`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import overload

from rhumbatron.actors import shard_state as state
from rhumbatron.actors.actor import Actor, ActorKind, ActorRef, TransactResult
from rhumbatron.actors.shard_commands import (
    AdmitAgent,
    ComposeCandidate,
    ShardCommand,
    ShardWrite,
)
from rhumbatron.actors.shard_handlers import decision_for, transition_for
from rhumbatron.domain.agents import Admission
from rhumbatron.domain.candidates import CandidateState
from rhumbatron.domain.changes import ChangeState
from rhumbatron.domain.changesets import Changeset
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.releases import ReleaseState
from rhumbatron.domain.resources import Challenge, Claim
from rhumbatron.domain.tasks import TaskState
from rhumbatron.domain.transition import Transition
from rhumbatron.protocol.ids import resource_shard_index

__all__ = ["ResourceShard", "change_resource_key"]


def change_resource_key(change_id: str) -> str:
    """The resource key whose shard owns a Change's Events."""
    return f"change:{change_id}"


class ResourceShard(Actor):
    """One resource shard of a project: claims, intents, challenges, Change status and
    attention reason, the Tasks of its Changes, and its outbox."""

    KIND = ActorKind.RESOURCE_SHARD
    STATE_SCHEMA = """
    CREATE TABLE IF NOT EXISTS claims (
        resource   TEXT PRIMARY KEY,
        claim_id   TEXT NOT NULL,
        agent_id   TEXT NOT NULL,
        mode       TEXT NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS intents (
        intent_id  TEXT PRIMARY KEY,
        agent_id   TEXT NOT NULL,
        paths      TEXT NOT NULL,
        summary    TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS challenges (
        challenge_id    TEXT PRIMARY KEY,
        agent_id        TEXT NOT NULL,
        resource        TEXT NOT NULL,
        target_agent_id TEXT,
        reason          TEXT NOT NULL,
        change_id       TEXT,
        created_at      TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS changes (
        change_id         TEXT PRIMARY KEY,
        status            TEXT NOT NULL,
        reason            TEXT NOT NULL DEFAULT '',
        title             TEXT NOT NULL DEFAULT '',
        client_request_id TEXT NOT NULL DEFAULT '',
        requested_by      TEXT NOT NULL DEFAULT '',
        created_at        TEXT NOT NULL DEFAULT '',
        promoted_at       TEXT,
        updated_at        TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS tasks (
        task_id       TEXT PRIMARY KEY,
        change_id     TEXT NOT NULL,
        status        TEXT NOT NULL CHECK (status IN ('planned', 'ready', 'assigned',
                          'running', 'completed', 'failed', 'blocked')),
        agent_id      TEXT,
        blocked_limit TEXT,
        reason        TEXT NOT NULL DEFAULT '',
        title         TEXT NOT NULL DEFAULT '',
        planned_agent TEXT,
        depends_on    TEXT NOT NULL DEFAULT '[]',
        script        TEXT,
        changeset_id  TEXT,
        updated_at    TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS tasks_of_change ON tasks (change_id, status);
    CREATE TABLE IF NOT EXISTS changesets (
        changeset_id    TEXT PRIMARY KEY,
        change_id       TEXT NOT NULL,
        task_id         TEXT NOT NULL,
        agent_id        TEXT NOT NULL,
        files           TEXT NOT NULL,
        base_generation INTEGER NOT NULL,
        created_at      TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS candidates (
        candidate_id    TEXT PRIMARY KEY,
        change_id       TEXT NOT NULL,
        composition_key TEXT NOT NULL UNIQUE,
        base_generation INTEGER NOT NULL,
        changeset_ids   TEXT NOT NULL,
        paths           TEXT NOT NULL,
        status          TEXT NOT NULL CHECK (status IN ('created', 'verified', 'rejected',
                            'stale', 'promoted')),
        reason          TEXT NOT NULL DEFAULT '',
        created_at      TEXT NOT NULL,
        updated_at      TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS candidates_of_change ON candidates (change_id, status);
    CREATE TABLE IF NOT EXISTS releases (
        release_id   TEXT PRIMARY KEY,
        change_id    TEXT NOT NULL,
        generation   INTEGER NOT NULL,
        candidate_id TEXT NOT NULL,
        app_name     TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status IN ('started', 'completed', 'failed')),
        reason       TEXT NOT NULL DEFAULT '',
        updated_at   TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS project_admin (
        project_id TEXT PRIMARY KEY,
        status     TEXT NOT NULL CHECK (status IN ('active', 'archived', 'deleted')),
        updated_at TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS apps (
        app_name   TEXT PRIMARY KEY,
        status     TEXT NOT NULL CHECK (status IN ('live', 'removed')),
        updated_at TEXT NOT NULL
    );
    """
    STATE_TABLES = frozenset(
        {
            "claims",
            "intents",
            "challenges",
            "changes",
            "tasks",
            "changesets",
            "candidates",
            "releases",
            "project_admin",
            "apps",
        }
    )

    @staticmethod
    def ref_for(project_id: str, resource_key: str, shard_count: int) -> ActorRef:
        """The shard of ``project_id`` that owns ``resource_key``."""
        return ActorRef(
            ActorKind.RESOURCE_SHARD, project_id, resource_shard_index(resource_key, shard_count)
        )

    # -- writes ------------------------------------------------------------------------------
    @overload
    def apply(self, caller: Caller, command: AdmitAgent) -> Admission: ...
    @overload
    def apply(self, caller: Caller, command: ComposeCandidate) -> CandidateState: ...
    @overload
    def apply(self, caller: Caller, command: ShardWrite) -> TransactResult: ...

    def apply(
        self, caller: Caller, command: ShardCommand
    ) -> TransactResult | Admission | CandidateState:
        """Apply ``command`` for ``caller``: its handler decides on the current state, and
        the patch and facts it returns are written in the same transaction; a handler that
        raises writes nothing. A write answers what the transaction wrote;
        :class:`AdmitAgent` answers its :class:`Admission` and :class:`ComposeCandidate` its
        Candidate."""
        if isinstance(command, AdmitAgent | ComposeCandidate):
            # The answer leaves the transaction through this list: transact() returns only
            # what was written, and the answer is decided on the state inside it.
            decided: list[Admission | CandidateState] = []

            def decide(db: sqlite3.Connection) -> Transition:
                answer, transition = decision_for(db, self._ctx(caller), command)
                decided.append(answer)
                return transition

            self.transact(decide)
            return decided[0]
        return self.transact(lambda db: transition_for(db, self._ctx(caller), command))

    def _ctx(self, caller: Caller) -> FactContext:
        return FactContext(caller, self.ref.project_id, self.clock.now())

    # -- claims, intents, challenges ---------------------------------------------------------
    def claims(self) -> list[Claim]:
        return state.claims(self.connection)

    def challenge(self, challenge_id: str) -> Challenge | None:
        return state.challenge(self.connection, challenge_id)

    # -- Changes and their Tasks -------------------------------------------------------------
    def change_state(self, change_id: str) -> ChangeState | None:
        return state.change(self.connection, change_id)

    def change_reason(self, change_id: str) -> str | None:
        """The Change's attention reason ('' when none), or None for an unknown Change."""
        row = self.connection.execute(
            "SELECT reason FROM changes WHERE change_id = ?", (change_id,)
        ).fetchone()
        return None if row is None else str(row["reason"])

    def changes(self, *, statuses: Sequence[str] | None = None) -> list[ChangeState]:
        """This shard's Changes (all, or those in ``statuses``), oldest first."""
        found = state.changes(self.connection)
        return [c for c in found if statuses is None or c.status in statuses]

    def task_state(self, task_id: str) -> TaskState | None:
        return state.task(self.connection, task_id)

    def tasks_of_change(self, change_id: str) -> list[TaskState]:
        return state.tasks(self.connection, change_id)

    # -- changesets, Candidates, releases ----------------------------------------------------
    def changeset(self, changeset_id: str) -> Changeset | None:
        return state.changeset(self.connection, changeset_id)

    def changesets_of_candidate(self, candidate: CandidateState) -> list[Changeset]:
        return [
            c
            for i in candidate.changeset_ids
            if (c := state.changeset(self.connection, i)) is not None
        ]

    def candidate(self, candidate_id: str) -> CandidateState | None:
        return state.candidate(self.connection, candidate_id)

    def candidates(self, *, change_id: str | None = None) -> list[CandidateState]:
        return state.candidates(self.connection, change_id)

    def release(self, release_id: str) -> ReleaseState | None:
        return state.release(self.connection, release_id)

    def releases(self, *, change_id: str | None = None) -> list[ReleaseState]:
        return state.releases(self.connection, change_id)

    # -- project administration (the shard of ``project:<id>``) ------------------------------
    def project_status(self) -> str:
        return state.project_status(self.connection, self.ref.project_id) or "active"

    def live_apps(self) -> list[str]:
        rows = self.connection.execute(
            "SELECT app_name FROM apps WHERE status = 'live' ORDER BY app_name"
        )
        return [str(row[0]) for row in rows]
