"""The local workflow engine: steps run in this process, progress persists in SQLite.

An instance is one row of ``workflow_instances`` (the instance ID is its primary key) and
each finished step one row of ``workflow_steps``. ``start`` inserts the instance with
``INSERT OR IGNORE``: a second start of the same ID finds the row and runs nothing (the
same answer Step Functions gives to a repeated execution name). A step's finish and the
state it returned are written in one transaction, so a process killed mid-run resumes from
the first unfinished step and never runs a finished step twice.

Steps run in the process that started the instance. Only one process is expected to own a
file: two processes resuming the same running instance at once could both run its next step.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import DomainError, WorkflowEngineError
from rhumbatron.workflows.engine import (
    WorkflowControl,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowStart,
    WorkflowStatus,
    WorkflowStepRecord,
    check_instance_id,
    ledger_ids,
    step_span,
)

__all__ = ["InProcessEngine", "StepFunction", "WorkflowDefinition", "WorkflowStep"]

#: A step: ``(input, state) -> mapping merged into the state, or None``. ``state`` is a fresh
#: copy: only what the step returns is kept (and persisted).
StepFunction = Callable[[Mapping[str, Any], dict[str, Any]], Awaitable[Mapping[str, Any] | None]]

#: A named step; names are unique within a workflow (they key the finished-steps table).
WorkflowStep = tuple[str, StepFunction]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workflow_instances (
    workflow    TEXT NOT NULL,
    instance_id TEXT PRIMARY KEY,
    status      TEXT NOT NULL,
    input       TEXT NOT NULL,
    state       TEXT NOT NULL,
    error       TEXT,
    started_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS workflow_instances_status ON workflow_instances (status);
CREATE TABLE IF NOT EXISTS workflow_steps (
    instance_id TEXT NOT NULL,
    step        TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    PRIMARY KEY (instance_id, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS workflow_step_failures (
    instance_id TEXT NOT NULL,
    step        TEXT NOT NULL,
    failed_at   TEXT NOT NULL,
    error       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS workflow_step_failures_instance
    ON workflow_step_failures (instance_id, step);
"""


@dataclass(frozen=True)
class WorkflowDefinition:
    """A workflow: its name and its steps, run in order."""

    name: str
    steps: tuple[WorkflowStep, ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.steps]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise DomainError(
                f"workflow {self.name!r} names steps {', '.join(repeated)} more than once; "
                "give every step a unique name (finished steps are recorded by name)"
            )


class InProcessEngine:
    """The :class:`~rhumbatron.workflows.engine.WorkflowEngine` for local runs.

    ``start`` runs a new instance's steps before it returns; a failing step marks the
    instance failed (an outcome, so ``start`` still answers ``started=True``).
    """

    def __init__(
        self,
        store_path: Path,
        settings: Settings,
        clock: Clock,
        definitions: Mapping[str, WorkflowDefinition],
    ) -> None:
        for key, definition in definitions.items():
            if key != definition.name:
                raise DomainError(
                    f"workflow definition {definition.name!r} is registered as {key!r}; "
                    "register each definition under its own name"
                )
        self._store = SqliteStore(store_path, settings, _SCHEMA)
        self._clock = clock
        self._definitions = dict(definitions)
        # One lock per instance ID while anyone uses it: two starts of one ID in this
        # process must not both see an unfinished step and run it.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def start(
        self, workflow: str, instance_id: str, input: Mapping[str, Any]
    ) -> WorkflowStart:
        """Insert the instance and run its steps; an existing ID is a repeat (nothing runs)."""
        definition = self._definition(workflow)
        check_instance_id(instance_id)
        try:
            input_json = json.dumps(dict(input), sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise WorkflowEngineError(
                f"input of workflow {workflow!r} instance {instance_id!r} is not JSON ({exc}); "
                "pass only JSON values"
            ) from None
        async with self._lock(instance_id):
            now = self._clock.now().isoformat()
            existing: sqlite3.Row | None = None
            with self._store.transaction() as db:
                inserted = db.execute(
                    "INSERT OR IGNORE INTO workflow_instances (workflow, instance_id, status, "
                    "input, state, error, started_at, updated_at) "
                    "VALUES (?, ?, ?, ?, '{}', NULL, ?, ?)",
                    (workflow, instance_id, WorkflowStatus.running, input_json, now, now),
                ).rowcount
                if not inserted:
                    existing = _row(db, instance_id)
            if not inserted:
                if existing is not None and existing["workflow"] != workflow:
                    raise DomainError(
                        f"instance ID {instance_id!r} already belongs to workflow "
                        f"{existing['workflow']!r}, not {workflow!r}; instance IDs are unique "
                        "across workflows"
                    )
                return WorkflowStart(workflow=workflow, instance_id=instance_id, started=False)
            await self._run(definition, instance_id)
        return WorkflowStart(workflow=workflow, instance_id=instance_id, started=True)

    async def describe(self, workflow: str, instance_id: str) -> WorkflowInstance | None:
        """The instance, or None if this workflow never started one with that ID."""
        row = _row(self._store.connection, instance_id)
        if row is None or row["workflow"] != workflow:
            return None
        status = WorkflowStatus(row["status"])
        project_id, change_id = ledger_ids(json.loads(row["input"]))
        return WorkflowInstance(
            workflow=workflow,
            instance_id=instance_id,
            status=status,
            output=json.loads(row["state"]) if status is WorkflowStatus.succeeded else None,
            error=row["error"],
            project_id=project_id,
            change_id=change_id,
        )

    async def resume(self, instance_id: str) -> WorkflowInstance | None:
        """Continue a ``running`` instance from its first unfinished step.

        An instance that finished (or does not exist) is left alone; the answer is the
        instance as it stands afterwards, or None if there is none.
        """
        async with self._lock(instance_id):
            row = _row(self._store.connection, instance_id)
            if row is None:
                return None
            if row["status"] == WorkflowStatus.running:
                await self._run(self._definition(row["workflow"]), instance_id)
            workflow = str(row["workflow"])
        return await self.describe(workflow, instance_id)

    async def resume_running(self) -> list[str]:
        """Resume every ``running`` instance (the local sweep); return their IDs."""
        ids = [
            str(row["instance_id"])
            for row in self._store.connection.execute(
                "SELECT instance_id FROM workflow_instances WHERE status = ? "
                "ORDER BY started_at, instance_id",
                (WorkflowStatus.running,),
            )
        ]
        for instance_id in ids:
            await self.resume(instance_id)
        return ids

    # -- an operator's view and control (WorkflowOperations) ----------------------------

    async def list_instances(
        self,
        workflow: str,
        *,
        status: WorkflowStatus | None = None,
        change_id: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowInstance]:
        """The newest instances of ``workflow`` first (of one Change's, with
        ``change_id``), at most ``limit``."""
        self._definition(workflow)
        rows = self._store.connection.execute(
            "SELECT instance_id FROM workflow_instances WHERE workflow = ? "
            "AND (? IS NULL OR status = ?) "
            "AND (? IS NULL OR json_extract(input, '$.changeId') = ?) "
            "ORDER BY started_at DESC, instance_id LIMIT ?",
            (workflow, status, status, change_id, change_id, limit),
        ).fetchall()
        found = [await self.describe(workflow, str(row["instance_id"])) for row in rows]
        return [instance for instance in found if instance is not None]

    async def history(self, workflow: str, instance_id: str) -> WorkflowHistory | None:
        """Every step of the definition in order: finished, failed (with each failure an
        attempt), the one a running instance waits on, or not started. This engine retries
        nothing by itself: a failed step runs again only on a redrive."""
        instance = await self.describe(workflow, instance_id)
        if instance is None:
            return None
        db = self._store.connection
        finished = {
            str(row["step"]): str(row["finished_at"])
            for row in db.execute(
                "SELECT step, finished_at FROM workflow_steps WHERE instance_id = ?",
                (instance_id,),
            )
        }
        failures: dict[str, list[sqlite3.Row]] = {}
        for row in db.execute(
            "SELECT step, failed_at, error FROM workflow_step_failures WHERE instance_id = ? "
            "ORDER BY rowid",
            (instance_id,),
        ):
            failures.setdefault(str(row["step"]), []).append(row)
        steps: list[WorkflowStepRecord] = []
        pending: str | None = None
        for name, _ in self._definition(workflow).steps:
            failed = failures.get(name, [])
            last_failure = failed[-1] if failed else None
            if name in finished:
                status, at = "succeeded", finished[name]
            elif last_failure is not None and instance.status is not WorkflowStatus.running:
                status, at = "failed", str(last_failure["failed_at"])
            elif instance.status is WorkflowStatus.running and pending is None:
                status, at, pending = "running", None, name
            else:
                status, at = "not_started", None
            steps.append(
                WorkflowStepRecord(
                    name=name,
                    status=status,
                    attempts=len(failed) + (1 if name in finished else 0),
                    at=at,
                    error=None if last_failure is None else str(last_failure["error"]),
                )
            )
        return WorkflowHistory(instance, tuple(steps), pending, next_retry_at=None)

    async def cancel(self, workflow: str, instance_id: str, reason: str) -> WorkflowControl | None:
        """Stop a running instance for good: no further step runs (a step in flight in this
        process finishes, and its result is recorded)."""
        return await self._stop(workflow, instance_id, "cancel", WorkflowStatus.cancelled, reason)

    async def terminate(
        self, workflow: str, instance_id: str, reason: str
    ) -> WorkflowControl | None:
        """Stop a running instance as a failure, so that a redrive can run it on from the
        step it stopped at."""
        return await self._stop(workflow, instance_id, "terminate", WorkflowStatus.failed, reason)

    async def redrive(self, workflow: str, instance_id: str) -> WorkflowControl | None:
        """Run a failed instance again from its first unfinished step (the failed one); its
        finished steps are not run again. A cancelled or succeeded instance is left alone."""
        instance = await self.describe(workflow, instance_id)
        if instance is None:
            return None
        if instance.status is not WorkflowStatus.failed:
            return WorkflowControl.past(instance, "redrive")
        with self._store.transaction() as db:
            db.execute(
                "UPDATE workflow_instances SET status = ?, error = NULL, updated_at = ? "
                "WHERE instance_id = ? AND status = ?",
                (
                    WorkflowStatus.running,
                    self._clock.now().isoformat(),
                    instance_id,
                    WorkflowStatus.failed,
                ),
            )
        after = await self.resume(instance_id)
        status = after.status if after is not None else WorkflowStatus.running
        return WorkflowControl(
            workflow,
            instance_id,
            "redrive",
            True,
            status,
            f"ran again from its failed step: {status}",
        )

    async def _stop(
        self,
        workflow: str,
        instance_id: str,
        action: str,
        to: WorkflowStatus,
        reason: str,
    ) -> WorkflowControl | None:
        instance = await self.describe(workflow, instance_id)
        if instance is None:
            return None
        done = {"cancel": "cancelled", "terminate": "terminated"}[action]
        error = f"{done} by an operator: {reason}"
        with self._store.transaction() as db:
            stopped = db.execute(
                "UPDATE workflow_instances SET status = ?, error = ?, updated_at = ? "
                "WHERE instance_id = ? AND status = ?",
                (to, error, self._clock.now().isoformat(), instance_id, WorkflowStatus.running),
            ).rowcount
        if not stopped:
            return WorkflowControl.past(instance, action)
        return WorkflowControl(workflow, instance_id, action, True, to, error)

    def close(self) -> None:
        """Close the SQLite file."""
        self._store.close()

    def _definition(self, workflow: str) -> WorkflowDefinition:
        definition = self._definitions.get(workflow)
        if definition is None:
            known = ", ".join(sorted(self._definitions)) or "(none)"
            raise DomainError(f"unknown workflow {workflow!r}; this engine knows: {known}")
        return definition

    def _lock(self, instance_id: str) -> asyncio.Lock:
        lock = self._locks.get(instance_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[instance_id] = lock
        return lock

    async def _run(self, definition: WorkflowDefinition, instance_id: str) -> None:
        """Run the unfinished steps in order; the caller holds the instance's lock."""
        row = _row(self._store.connection, instance_id)
        assert row is not None  # the caller inserted or read it under the same lock
        input_ = json.loads(row["input"])
        state_json = str(row["state"])
        finished = {
            str(step["step"])
            for step in self._store.connection.execute(
                "SELECT step FROM workflow_steps WHERE instance_id = ?", (instance_id,)
            )
        }
        for name, step in definition.steps:
            if name in finished:
                continue
            if not self._still_running(instance_id):
                return  # an operator cancelled or terminated it: no further step runs
            try:
                # A fresh copy for each step: only what a step returns reaches the record.
                with step_span(definition.name, name, input_):
                    result = await step(input_, json.loads(state_json))
                state_json = json.dumps({**json.loads(state_json), **dict(result or {})})
            except Exception as exc:
                # BaseException (cancellation, a killed process) is not caught: the instance
                # stays running and resume() continues it from this step.
                self._fail(instance_id, name, f"step {name!r}: {type(exc).__name__}: {exc}")
                return
            now = self._clock.now().isoformat()
            with self._store.transaction() as db:
                # The step's work is done whatever happened meanwhile: it is recorded, but an
                # instance stopped while it ran keeps its status (no next step runs).
                db.execute(
                    "INSERT INTO workflow_steps (instance_id, step, finished_at) VALUES (?, ?, ?)",
                    (instance_id, name, now),
                )
                db.execute(
                    "UPDATE workflow_instances SET state = ?, updated_at = ? WHERE instance_id = ?",
                    (state_json, now, instance_id),
                )
        with self._store.transaction() as db:
            db.execute(
                "UPDATE workflow_instances SET status = ?, updated_at = ? "
                "WHERE instance_id = ? AND status = ?",
                (WorkflowStatus.succeeded, self._clock.now().isoformat(), instance_id, "running"),
            )

    def _fail(self, instance_id: str, step: str, error: str) -> None:
        now = self._clock.now().isoformat()
        with self._store.transaction() as db:
            db.execute(
                "INSERT INTO workflow_step_failures (instance_id, step, failed_at, error) "
                "VALUES (?, ?, ?, ?)",
                (instance_id, step, now, error),
            )
            db.execute(
                "UPDATE workflow_instances SET status = ?, error = ?, updated_at = ? "
                "WHERE instance_id = ? AND status = ?",
                (WorkflowStatus.failed, error, now, instance_id, WorkflowStatus.running),
            )

    def _still_running(self, instance_id: str) -> bool:
        row = _row(self._store.connection, instance_id)
        return row is not None and row["status"] == WorkflowStatus.running


def _row(db: sqlite3.Connection, instance_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = db.execute(
        "SELECT workflow, status, input, state, error FROM workflow_instances "
        "WHERE instance_id = ?",
        (instance_id,),
    ).fetchone()
    return row
