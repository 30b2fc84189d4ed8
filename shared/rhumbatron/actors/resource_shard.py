"""The ResourceShard actor: one of N per project; writes every Event but the three of the root.

Shard mapping: a resource key (``change:<id>``, ``file:src/app.py``) lives in shard
``fnv1a32(key) mod resource_shard_count`` of its project; Change Events go to the shard of
``change:<id>``, and so do the Change's status row and its Tasks, so a Task move and its fact
commit together. The shard count must never change once a project has actors.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from rhumbatron.actors.actor import Actor, ActorKind, ActorRef, TransactResult
from rhumbatron.domain.agents import (
    Admission,
    admit_agent,
    record_agent_woke,
    record_model_routed,
)
from rhumbatron.domain.candidates import (
    CandidateState,
    CandidateStatus,
    candidate_id_for,
    composition_key,
    create_candidate,
    decide_candidate,
)
from rhumbatron.domain.changes import (
    ChangeFact,
    ChangeState,
    ChangeStatus,
    TaskPlan,
    append_change_events,
    create_change,
    move_change,
    settle_change,
)
from rhumbatron.domain.changesets import Changeset, propose_changeset
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import provision_app, remove_app, set_project_status
from rhumbatron.domain.releases import (
    ReleaseState,
    ReleaseStatus,
    finish_release,
    release_id_for,
    start_release,
)
from rhumbatron.domain.resources import (
    Challenge,
    Claim,
    Intent,
    acquire_claim,
    create_challenge,
    declare_intent,
    expire_claims,
    release_claim,
)
from rhumbatron.domain.tasks import (
    TaskState,
    TaskStatus,
    complete_task,
    dead_letter_outcome,
    fail_task,
    record_task_status,
    retry_blocked_task,
    start_task,
)
from rhumbatron.domain.transition import Transition, combine
from rhumbatron.protocol.envelopes import Command, Event
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

    # -- challenges ------------------------------------------------------------------------
    def create_challenge(
        self,
        caller: Caller,
        *,
        agent_id: str,
        resource: str,
        target_agent_id: str | None,
        reason: str,
        challenge_id: str,
        change_id: str | None = None,
    ) -> TransactResult:
        """``challenge.created``, once per ``challenge_id`` (see
        :func:`~rhumbatron.domain.resources.create_challenge`); this shard must own
        ``resource``."""
        return self.transact(
            lambda db: create_challenge(
                _challenge(db, challenge_id),
                self._ctx(caller),
                challenge_id=challenge_id,
                agent_id=agent_id,
                resource=resource,
                target_agent_id=target_agent_id,
                reason=reason,
                change_id=change_id,
            )
        )

    def challenge(self, challenge_id: str) -> Challenge | None:
        return _challenge(self.connection, challenge_id)

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

    def record_agent_woke(
        self,
        caller: Caller,
        *,
        change_id: str,
        task_id: str | None,
        agent_id: str,
        key: str,
        false_wakeup: bool = False,
    ) -> TransactResult:
        """``agent.woke`` (see :func:`~rhumbatron.domain.agents.record_agent_woke`): once
        per ``key``, and only for a Change this shard holds."""
        return self.transact(
            lambda db: record_agent_woke(
                _change(db, change_id),
                self._ctx(caller),
                change_id=change_id,
                task_id=task_id,
                agent_id=agent_id,
                key=key,
                false_wakeup=false_wakeup,
            )
        )

    def record_model_routed(
        self,
        caller: Caller,
        *,
        change_id: str,
        task_id: str | None,
        model: str,
        purpose: str,
        key: str,
    ) -> TransactResult:
        """``model.routed`` (see :func:`~rhumbatron.domain.agents.record_model_routed`):
        once per ``key``, and only for a Change this shard holds."""
        return self.transact(
            lambda db: record_model_routed(
                _change(db, change_id),
                self._ctx(caller),
                change_id=change_id,
                task_id=task_id,
                model=model,
                purpose=purpose,
                key=key,
            )
        )

    def task_state(self, task_id: str) -> TaskState | None:
        return _task(self.connection, task_id)

    def tasks_of_change(self, change_id: str) -> list[TaskState]:
        return _tasks(self.connection, change_id)

    # -- the Change lifecycle ----------------------------------------------------------------
    def create_change(
        self,
        caller: Caller,
        *,
        change_id: str,
        title: str,
        client_request_id: str,
        requested_by: str,
        tasks: Sequence[TaskPlan],
    ) -> TransactResult:
        """The Change ``open`` with its work graph (see
        :func:`~rhumbatron.domain.changes.create_change`)."""
        return self.transact(
            lambda db: create_change(
                _change(db, change_id),
                self._ctx(caller),
                change_id=change_id,
                title=title,
                client_request_id=client_request_id,
                requested_by=requested_by,
                tasks=tasks,
            )
        )

    def move_change(
        self,
        caller: Caller,
        *,
        change_id: str,
        to: ChangeStatus | str,
        reason: str = "",
        key: str | None = None,
    ) -> TransactResult:
        """Move the Change along its state machine, with its fact."""
        return self.transact(
            lambda db: move_change(
                _change(db, change_id), self._ctx(caller), to=to, reason=reason, key=key
            )
        )

    def settle_change(
        self,
        caller: Caller,
        *,
        change_id: str,
        from_status: ChangeStatus | str,
        to: ChangeStatus | str,
        reason: str,
        key: str,
    ) -> TransactResult:
        """A settle pass's decision: ``change.settled`` and, when ``to`` differs, the move,
        in one transaction (see :func:`~rhumbatron.domain.changes.settle_change`)."""
        return self.transact(
            lambda db: settle_change(
                _change(db, change_id),
                self._ctx(caller),
                from_status=from_status,
                to=to,
                reason=reason,
                key=key,
            )
        )

    def start_task(self, caller: Caller, *, task_id: str, agent_id: str) -> TransactResult:
        return self.transact(
            lambda db: start_task(
                _task(db, task_id), self._ctx(caller), task_id=task_id, agent_id=agent_id
            )
        )

    def complete_task(
        self,
        caller: Caller,
        *,
        change_id: str,
        task_id: str,
        agent_id: str,
        changeset_id: str | None,
    ) -> TransactResult:
        """``task.completed``, the newly ready Tasks, and the work graph's completion."""
        return self.transact(
            lambda db: complete_task(
                _tasks(db, change_id),
                _change(db, change_id),
                self._ctx(caller),
                task_id=task_id,
                agent_id=agent_id,
                changeset_id=changeset_id,
            )
        )

    def fail_task(
        self, caller: Caller, *, task_id: str, agent_id: str, reason: str
    ) -> TransactResult:
        return self.transact(
            lambda db: fail_task(
                _task(db, task_id),
                self._ctx(caller),
                task_id=task_id,
                agent_id=agent_id,
                reason=reason,
            )
        )

    def retry_blocked_task(self, caller: Caller, *, task_id: str, attempt: int) -> TransactResult:
        """An operator's Retry: the Task its dead letter blocked is ready again."""
        return self.transact(
            lambda db: retry_blocked_task(_task(db, task_id), self._ctx(caller), attempt=attempt)
        )

    def propose_changeset(
        self,
        caller: Caller,
        *,
        changeset_id: str,
        task_id: str,
        agent_id: str,
        files: Mapping[str, str],
        base_generation: int,
    ) -> TransactResult:
        return self.transact(
            lambda db: propose_changeset(
                _changeset(db, changeset_id),
                _task(db, task_id),
                self._ctx(caller),
                changeset_id=changeset_id,
                task_id=task_id,
                agent_id=agent_id,
                files=files,
                base_generation=base_generation,
            )
        )

    def compose_candidate(
        self, caller: Caller, *, change_id: str, base_generation: int
    ) -> CandidateState:
        """Compose the Change's completed changesets on ``base_generation`` (the same work on
        the same base is the same Candidate)."""
        composed: list[CandidateState] = []

        def decide(db: sqlite3.Connection) -> Transition:
            change = _change(db, change_id)
            changesets = [
                c
                for t in _tasks(db, change_id)
                if t.changeset_id is not None and (c := _changeset(db, t.changeset_id))
            ]
            ids = [c.changeset_id for c in changesets]
            paths = [p for c in changesets for p in c.paths]
            existing = (
                _candidate(db, candidate_id_for(composition_key(base_generation, ids)))
                if ids
                else None
            )
            candidate, transition = create_candidate(
                existing,
                change.status if change else None,
                self._ctx(caller),
                change_id=change_id,
                base_generation=base_generation,
                changeset_ids=ids,
                paths=paths,
            )
            composed.append(candidate)
            return transition

        self.transact(decide)
        return composed[0]

    def decide_candidate(
        self,
        caller: Caller,
        *,
        candidate_id: str,
        to: CandidateStatus | str,
        reason: str = "",
        change_to: ChangeStatus | None = None,
    ) -> TransactResult:
        """Move the Candidate and, in the same transaction, its Change (when ``change_to``
        is given and the Change is not there yet)."""

        def decide(db: sqlite3.Connection) -> Transition:
            candidate = _candidate(db, candidate_id)
            ctx = self._ctx(caller)
            steps = [
                decide_candidate(candidate, ctx, candidate_id=candidate_id, to=to, reason=reason)
            ]
            if change_to is not None and candidate is not None:
                steps.append(
                    move_change(
                        _change(db, candidate.change_id),
                        ctx,
                        to=change_to,
                        reason=reason,
                        key=f"{candidate_id}:{to}",
                    )
                )
            return combine(*steps)

        return self.transact(decide)

    def record_promotion(
        self, caller: Caller, *, change_id: str, candidate_id: str, expected_generation: int
    ) -> TransactResult:
        """The Change's Candidate was promoted: ``promotion.requested``, then
        ``awaiting_approval → releasing`` with ``promotion.completed`` (once per Candidate)."""

        def decide(db: sqlite3.Connection) -> Transition:
            change = _change(db, change_id)
            if change is not None and change.status != ChangeStatus.AWAITING_APPROVAL.value:
                return Transition()  # moved already (a repeat, or the router's effect)
            ctx = self._ctx(caller)
            requested = _promotion_requested(
                ctx,
                change_id=change_id,
                candidate_id=candidate_id,
                expected_generation=expected_generation,
            )
            moved = move_change(
                change, ctx, to=ChangeStatus.RELEASING, reason="promoted", key=candidate_id
            )
            fact = ctx.fact(
                "promotion.completed",
                {
                    "candidateId": candidate_id,
                    "expectedGeneration": expected_generation,
                    "outcome": "promoted",
                },
                change_id=change_id,
                key=candidate_id,
            )
            return combine(Transition(facts=(requested,)), moved, Transition(facts=(fact,)))

        return self.transact(decide)

    def record_promotion_refused(
        self,
        caller: Caller,
        *,
        change_id: str,
        candidate_id: str,
        expected_generation: int,
        reason: str,
    ) -> TransactResult:
        """``decidePromotion`` refused the Candidate (canonical moved past its base):
        ``promotion.requested`` and ``promotion.rejected``, once per Candidate and expected
        generation. The Change does not move: canonical.advanced sends it back to verifying
        and recomposes it."""

        def decide(db: sqlite3.Connection) -> Transition:
            ctx = self._ctx(caller)
            requested = _promotion_requested(
                ctx,
                change_id=change_id,
                candidate_id=candidate_id,
                expected_generation=expected_generation,
            )
            fact = ctx.fact(
                "promotion.rejected",
                {
                    "candidateId": candidate_id,
                    "expectedGeneration": expected_generation,
                    "outcome": "rejected",
                    "reason": reason[:1000],
                },
                change_id=change_id,
                key=f"{candidate_id}:{expected_generation}",
            )
            return Transition(facts=(requested, fact))

        return self.transact(decide)

    def start_release(
        self, caller: Caller, *, change_id: str, generation: int, candidate_id: str, app_name: str
    ) -> TransactResult:
        return self.transact(
            lambda db: start_release(
                _release(db, release_id_for(self.ref.project_id, generation)),
                self._ctx(caller),
                change_id=change_id,
                generation=generation,
                candidate_id=candidate_id,
                app_name=app_name,
            )
        )

    def finish_release(
        self, caller: Caller, *, release_id: str, outcome: ReleaseStatus | str, reason: str = ""
    ) -> TransactResult:
        """``release.completed`` / ``release.failed`` and the Change's end, together."""

        def decide(db: sqlite3.Connection) -> Transition:
            release = _release(db, release_id)
            ctx = self._ctx(caller)
            finished = finish_release(
                release, ctx, release_id=release_id, outcome=outcome, reason=reason
            )
            assert release is not None  # finish_release refused a missing one
            end = (
                ChangeStatus.COMPLETED
                if ReleaseStatus(outcome) is ReleaseStatus.COMPLETED
                else ChangeStatus.FAILED
            )
            moved = move_change(
                _change(db, release.change_id), ctx, to=end, reason=reason, key=release_id
            )
            return combine(finished, moved)

        return self.transact(decide)

    def changes(self, *, statuses: Sequence[str] | None = None) -> list[ChangeState]:
        """This shard's Changes (all, or those in ``statuses``), oldest first."""
        rows = self.connection.execute("SELECT * FROM changes ORDER BY created_at, change_id")
        found = [_change_from(row) for row in rows]
        return [c for c in found if statuses is None or c.status in statuses]

    def changeset(self, changeset_id: str) -> Changeset | None:
        return _changeset(self.connection, changeset_id)

    def changesets_of_candidate(self, candidate: CandidateState) -> list[Changeset]:
        return [
            c for i in candidate.changeset_ids if (c := _changeset(self.connection, i)) is not None
        ]

    def candidate(self, candidate_id: str) -> CandidateState | None:
        return _candidate(self.connection, candidate_id)

    def candidates(self, *, change_id: str | None = None) -> list[CandidateState]:
        rows = self.connection.execute(
            "SELECT * FROM candidates WHERE ? IS NULL OR change_id = ? ORDER BY created_at",
            (change_id, change_id),
        )
        return [_candidate_from(row) for row in rows]

    def release(self, release_id: str) -> ReleaseState | None:
        return _release(self.connection, release_id)

    def releases(self, *, change_id: str | None = None) -> list[ReleaseState]:
        rows = self.connection.execute(
            "SELECT * FROM releases WHERE ? IS NULL OR change_id = ? ORDER BY generation",
            (change_id, change_id),
        )
        return [_release_from(row) for row in rows]

    # -- project administration (the shard of ``project:<id>``) ------------------------------
    def set_project_status(self, caller: Caller, *, to: str, reason: str = "") -> TransactResult:
        return self.transact(
            lambda db: set_project_status(
                _project_status(db, self.ref.project_id), self._ctx(caller), to=to, reason=reason
            )
        )

    def project_status(self) -> str:
        return _project_status(self.connection, self.ref.project_id) or "active"

    def provision_app(self, caller: Caller, *, app_name: str) -> TransactResult:
        return self.transact(
            lambda db: provision_app(
                _app_status(db, app_name),
                _project_status(db, self.ref.project_id),
                self._ctx(caller),
                app_name=app_name,
            )
        )

    def remove_app(self, caller: Caller, *, app_name: str, reason: str = "") -> TransactResult:
        return self.transact(
            lambda db: remove_app(
                _app_status(db, app_name), self._ctx(caller), app_name=app_name, reason=reason
            )
        )

    def live_apps(self) -> list[str]:
        rows = self.connection.execute(
            "SELECT app_name FROM apps WHERE status = 'live' ORDER BY app_name"
        )
        return [str(row[0]) for row in rows]

    def claims(self) -> list[Claim]:
        return _claims(self.connection)

    def _ctx(self, caller: Caller) -> FactContext:
        return FactContext(caller, self.ref.project_id, self.clock.now())


def _promotion_requested(
    ctx: FactContext, *, change_id: str, candidate_id: str, expected_generation: int
) -> Event:
    """``promotion.requested``: an approval asked for ``candidate_id`` on
    ``expected_generation``. Keyed by both, so the approval that is promoted and the one that
    is refused each record it once, and a repeat (or the router's effect finishing an
    interrupted approval) adds nothing."""
    return ctx.fact(
        "promotion.requested",
        {"candidateId": candidate_id, "expectedGeneration": expected_generation},
        change_id=change_id,
        key=f"{candidate_id}:{expected_generation}",
    )


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


def _challenge(db: sqlite3.Connection, challenge_id: str) -> Challenge | None:
    row = db.execute("SELECT * FROM challenges WHERE challenge_id = ?", (challenge_id,)).fetchone()
    if row is None:
        return None
    return Challenge(
        challenge_id=row["challenge_id"],
        agent_id=row["agent_id"],
        resource=row["resource"],
        target_agent_id=row["target_agent_id"],
        reason=row["reason"],
        change_id=row["change_id"],
    )


def _change_from(row: sqlite3.Row) -> ChangeState:
    return ChangeState(
        change_id=row["change_id"],
        status=row["status"],
        reason=row["reason"],
        title=row["title"],
        client_request_id=row["client_request_id"],
        requested_by=row["requested_by"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        promoted_at=row["promoted_at"],
    )


def _change(db: sqlite3.Connection, change_id: str) -> ChangeState | None:
    row = db.execute("SELECT * FROM changes WHERE change_id = ?", (change_id,)).fetchone()
    return None if row is None else _change_from(row)


def _task_from(row: sqlite3.Row) -> TaskState:
    return TaskState(
        task_id=row["task_id"],
        change_id=row["change_id"],
        status=TaskStatus(row["status"]),
        agent_id=row["agent_id"],
        blocked_limit=row["blocked_limit"],
        reason=row["reason"],
        title=row["title"],
        planned_agent=row["planned_agent"],
        depends_on=tuple(json.loads(row["depends_on"])),
        script=row["script"],
        changeset_id=row["changeset_id"],
    )


def _tasks(db: sqlite3.Connection, change_id: str) -> list[TaskState]:
    rows = db.execute("SELECT * FROM tasks WHERE change_id = ? ORDER BY task_id", (change_id,))
    return [_task_from(row) for row in rows]


def _changeset_from(row: sqlite3.Row) -> Changeset:
    return Changeset(
        changeset_id=row["changeset_id"],
        change_id=row["change_id"],
        task_id=row["task_id"],
        agent_id=row["agent_id"],
        files=json.loads(row["files"]),
        base_generation=row["base_generation"],
    )


def _changeset(db: sqlite3.Connection, changeset_id: str) -> Changeset | None:
    row = db.execute("SELECT * FROM changesets WHERE changeset_id = ?", (changeset_id,)).fetchone()
    return None if row is None else _changeset_from(row)


def _candidate_from(row: sqlite3.Row) -> CandidateState:
    return CandidateState(
        candidate_id=row["candidate_id"],
        change_id=row["change_id"],
        composition_key=row["composition_key"],
        base_generation=row["base_generation"],
        changeset_ids=tuple(json.loads(row["changeset_ids"])),
        paths=tuple(json.loads(row["paths"])),
        status=CandidateStatus(row["status"]),
        reason=row["reason"],
    )


def _candidate(db: sqlite3.Connection, candidate_id: str) -> CandidateState | None:
    row = db.execute("SELECT * FROM candidates WHERE candidate_id = ?", (candidate_id,)).fetchone()
    return None if row is None else _candidate_from(row)


def _release_from(row: sqlite3.Row) -> ReleaseState:
    return ReleaseState(
        release_id=row["release_id"],
        change_id=row["change_id"],
        generation=row["generation"],
        candidate_id=row["candidate_id"],
        app_name=row["app_name"],
        status=ReleaseStatus(row["status"]),
        reason=row["reason"],
    )


def _release(db: sqlite3.Connection, release_id: str) -> ReleaseState | None:
    row = db.execute("SELECT * FROM releases WHERE release_id = ?", (release_id,)).fetchone()
    return None if row is None else _release_from(row)


def _project_status(db: sqlite3.Connection, project_id: str) -> str | None:
    row = db.execute(
        "SELECT status FROM project_admin WHERE project_id = ?", (project_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def _app_status(db: sqlite3.Connection, app_name: str) -> str | None:
    row = db.execute("SELECT status FROM apps WHERE app_name = ?", (app_name,)).fetchone()
    return None if row is None else str(row[0])


def _task(db: sqlite3.Connection, task_id: str) -> TaskState | None:
    row = db.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    return None if row is None else _task_from(row)
