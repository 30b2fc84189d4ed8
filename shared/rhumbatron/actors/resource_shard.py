"""The ResourceShard actor: one of N per project; writes every Event but the three of the root.

Shard mapping: a resource key (``change:<id>``, ``file:src/app.py``) lives in shard
``fnv1a32(key) mod resource_shard_count`` of its project; Change Events go to the shard of
``change:<id>``, and so do the Change's status row and its Tasks, so a Task move and its fact
commit together. The shard count must never change once a project has actors.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta

from rhumbatron.actors.actor import Actor, ActorKind, ActorRef, TransactResult
from rhumbatron.domain.agents import Admission, admit_agent
from rhumbatron.domain.changes import ChangeFact, ChangeState, append_change_events
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.resources import (
    Claim,
    Intent,
    acquire_claim,
    declare_intent,
    expire_claims,
    release_claim,
)
from rhumbatron.domain.tasks import (
    TaskState,
    TaskStatus,
    dead_letter_outcome,
    record_task_status,
)
from rhumbatron.domain.transition import Transition
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.ids import resource_shard_index

__all__ = ["ResourceShard", "change_resource_key"]


def change_resource_key(change_id: str) -> str:
    """The resource key whose shard owns a Change's Events."""
    return f"change:{change_id}"


class ResourceShard(Actor):
    """One resource shard of a project: claims, intents, Change status and attention reason,
    the Tasks of its Changes, and its outbox."""

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
    CREATE TABLE IF NOT EXISTS changes (
        change_id  TEXT PRIMARY KEY,
        status     TEXT NOT NULL,
        reason     TEXT NOT NULL DEFAULT '',
        updated_at TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS tasks (
        task_id       TEXT PRIMARY KEY,
        change_id     TEXT NOT NULL,
        status        TEXT NOT NULL CHECK (status IN ('planned', 'ready', 'assigned',
                          'running', 'completed', 'failed', 'blocked')),
        agent_id      TEXT,
        blocked_limit TEXT,
        reason        TEXT NOT NULL DEFAULT '',
        updated_at    TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS tasks_of_change ON tasks (change_id, status);
    """
    STATE_TABLES = frozenset({"claims", "intents", "changes", "tasks"})

    @staticmethod
    def ref_for(project_id: str, resource_key: str, shard_count: int) -> ActorRef:
        """The shard of ``project_id`` that owns ``resource_key``."""
        return ActorRef(
            ActorKind.RESOURCE_SHARD, project_id, resource_shard_index(resource_key, shard_count)
        )

    # -- claims ----------------------------------------------------------------------------
    def acquire_claim(
        self, caller: Caller, *, resource: str, agent_id: str, ttl: timedelta
    ) -> TransactResult:
        return self.transact(
            lambda db: acquire_claim(
                _claim(db, resource),
                self._ctx(caller),
                resource=resource,
                agent_id=agent_id,
                ttl=ttl,
            )
        )

    def release_claim(self, caller: Caller, *, resource: str, agent_id: str) -> TransactResult:
        return self.transact(
            lambda db: release_claim(
                _claim(db, resource), self._ctx(caller), resource=resource, agent_id=agent_id
            )
        )

    def expire_claims(self, caller: Caller) -> TransactResult:
        return self.transact(lambda db: expire_claims(_claims(db), self._ctx(caller)))

    # -- intents ---------------------------------------------------------------------------
    def declare_intent(
        self,
        caller: Caller,
        *,
        intent_id: str,
        agent_id: str,
        paths: tuple[str, ...],
        summary: str = "",
        change_id: str | None = None,
    ) -> TransactResult:
        return self.transact(
            lambda db: declare_intent(
                _intent(db, intent_id),
                self._ctx(caller),
                intent_id=intent_id,
                agent_id=agent_id,
                paths=paths,
                summary=summary,
                change_id=change_id,
            )
        )

    # -- changes ---------------------------------------------------------------------------
    def append_change_events(
        self, caller: Caller, *, change_id: str, status: str, facts: tuple[ChangeFact, ...]
    ) -> TransactResult:
        """appendChangeEvents: move the Change and append its facts (stable IDs)."""
        return self.transact(
            lambda db: append_change_events(
                _change(db, change_id),
                self._ctx(caller),
                change_id=change_id,
                status=status,
                facts=facts,
            )
        )

    def change_state(self, change_id: str) -> ChangeState | None:
        return _change(self.connection, change_id)

    def change_reason(self, change_id: str) -> str | None:
        """The Change's attention reason ('' when none), or None for an unknown Change."""
        row = self.connection.execute(
            "SELECT reason FROM changes WHERE change_id = ?", (change_id,)
        ).fetchone()
        return None if row is None else str(row["reason"])

    # -- tasks -----------------------------------------------------------------------------
    def record_task_status(
        self,
        caller: Caller,
        *,
        change_id: str,
        task_id: str,
        status: TaskStatus | str,
        agent_id: str | None = None,
        blocked_limit: str | None = None,
        reason: str = "",
        key: str | None = None,
    ) -> TransactResult:
        """Create the Task or move it (task.ready / task.assigned where it applies); see
        :func:`~rhumbatron.domain.tasks.record_task_status`."""
        return self.transact(
            lambda db: record_task_status(
                _task(db, task_id),
                self._ctx(caller),
                change_id=change_id,
                task_id=task_id,
                status=status,
                agent_id=agent_id,
                blocked_limit=blocked_limit,
                reason=reason,
                key=key,
            )
        )

    def block_task_for_dead_letter(
        self, caller: Caller, *, command: Command, reason: str
    ) -> TransactResult:
        """Apply a dead-lettered command to its Task or its Change in one transaction: a
        ready or assigned Task is blocked (``dead_letter``) with ``task.failed``; otherwise
        the reason goes on the Change. See
        :func:`~rhumbatron.domain.tasks.dead_letter_outcome`."""
        change_id = command.change_id or ""
        return self.transact(
            lambda db: dead_letter_outcome(
                _task(db, command.task_id) if command.task_id else None,
                _change(db, change_id),
                self._ctx(caller),
                command=command,
                reason=reason,
            )
        )

    def admit_agent(
        self, caller: Caller, *, change_id: str, task_id: str, agent_id: str, limit: int = 8
    ) -> Admission:
        """``admitAgent``: assign ``task_id`` to ``agent_id`` once (see
        :func:`~rhumbatron.domain.agents.admit_agent`); the decision and its write are one
        transaction."""
        decided: list[Admission] = []

        def decide(db: sqlite3.Connection) -> Transition:
            task = _task(db, task_id)
            if task is not None and task.change_id != change_id:
                task = None  # another Change's Task is no Task of this wake
            active = db.execute(
                "SELECT COUNT(*) FROM tasks WHERE change_id = ? AND status IN "
                "('assigned', 'running')",
                (change_id,),
            ).fetchone()[0]
            admission, transition = admit_agent(
                task, self._ctx(caller), agent_id=agent_id, active_on_change=active, limit=limit
            )
            decided.append(admission)
            return transition

        self.transact(decide)
        return decided[0]

    def task_state(self, task_id: str) -> TaskState | None:
        return _task(self.connection, task_id)

    def tasks_of_change(self, change_id: str) -> list[TaskState]:
        rows = self.connection.execute(
            "SELECT * FROM tasks WHERE change_id = ? ORDER BY task_id", (change_id,)
        )
        return [_task_from(row) for row in rows]

    def claims(self) -> list[Claim]:
        return _claims(self.connection)

    def _ctx(self, caller: Caller) -> FactContext:
        return FactContext(caller, self.ref.project_id, self.clock.now())


def _claim_from(row: sqlite3.Row) -> Claim:
    return Claim(
        resource=row["resource"],
        claim_id=row["claim_id"],
        agent_id=row["agent_id"],
        mode=row["mode"],
        expires_at=datetime.fromtimestamp(row["expires_at"], UTC),
    )


def _claim(db: sqlite3.Connection, resource: str) -> Claim | None:
    row = db.execute("SELECT * FROM claims WHERE resource = ?", (resource,)).fetchone()
    return None if row is None else _claim_from(row)


def _claims(db: sqlite3.Connection) -> list[Claim]:
    return [_claim_from(r) for r in db.execute("SELECT * FROM claims ORDER BY resource")]


def _intent(db: sqlite3.Connection, intent_id: str) -> Intent | None:
    row = db.execute("SELECT * FROM intents WHERE intent_id = ?", (intent_id,)).fetchone()
    if row is None:
        return None
    return Intent(
        row["intent_id"], row["agent_id"], tuple(json.loads(row["paths"])), row["summary"]
    )


def _change(db: sqlite3.Connection, change_id: str) -> ChangeState | None:
    row = db.execute("SELECT * FROM changes WHERE change_id = ?", (change_id,)).fetchone()
    return None if row is None else ChangeState(row["change_id"], row["status"])


def _task_from(row: sqlite3.Row) -> TaskState:
    return TaskState(
        task_id=row["task_id"],
        change_id=row["change_id"],
        status=TaskStatus(row["status"]),
        agent_id=row["agent_id"],
        blocked_limit=row["blocked_limit"],
        reason=row["reason"],
    )


def _task(db: sqlite3.Connection, task_id: str) -> TaskState | None:
    row = db.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    return None if row is None else _task_from(row)
