"""The rows of a resource shard's tables, read as domain state.

Each reader takes the connection it reads through: the shard's own (a query) or the one of
a write transaction (a command's handler reads the state it decides on inside the
``BEGIN IMMEDIATE`` that writes the result).
"""

from __future__ import annotations

import json
import sqlite3

from rhumbatron.actors.rows import json_tuple, row_to, utc_timestamp
from rhumbatron.domain.candidates import CandidateState, CandidateStatus
from rhumbatron.domain.changes import ChangeState
from rhumbatron.domain.changesets import Changeset
from rhumbatron.domain.releases import ReleaseState, ReleaseStatus
from rhumbatron.domain.resources import Challenge, Claim, Intent
from rhumbatron.domain.tasks import TaskState, TaskStatus

__all__ = [
    "active_tasks",
    "app_status",
    "candidate",
    "candidates",
    "challenge",
    "change",
    "changes",
    "changeset",
    "claim",
    "claims",
    "intent",
    "project_status",
    "release",
    "releases",
    "task",
    "tasks",
]


# -- one row per key, or None --------------------------------------------------------------------
def claim(db: sqlite3.Connection, resource: str) -> Claim | None:
    row = db.execute("SELECT * FROM claims WHERE resource = ?", (resource,)).fetchone()
    return None if row is None else _claim(row)


def intent(db: sqlite3.Connection, intent_id: str) -> Intent | None:
    row = db.execute("SELECT * FROM intents WHERE intent_id = ?", (intent_id,)).fetchone()
    return None if row is None else row_to(Intent, row, paths=json_tuple)


def challenge(db: sqlite3.Connection, challenge_id: str) -> Challenge | None:
    row = db.execute("SELECT * FROM challenges WHERE challenge_id = ?", (challenge_id,)).fetchone()
    return None if row is None else row_to(Challenge, row)


def change(db: sqlite3.Connection, change_id: str) -> ChangeState | None:
    row = db.execute("SELECT * FROM changes WHERE change_id = ?", (change_id,)).fetchone()
    return None if row is None else row_to(ChangeState, row)


def task(db: sqlite3.Connection, task_id: str) -> TaskState | None:
    row = db.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    return None if row is None else _task(row)


def changeset(db: sqlite3.Connection, changeset_id: str) -> Changeset | None:
    row = db.execute("SELECT * FROM changesets WHERE changeset_id = ?", (changeset_id,)).fetchone()
    return None if row is None else row_to(Changeset, row, files=json.loads)


def candidate(db: sqlite3.Connection, candidate_id: str) -> CandidateState | None:
    row = db.execute("SELECT * FROM candidates WHERE candidate_id = ?", (candidate_id,)).fetchone()
    return None if row is None else _candidate(row)


def release(db: sqlite3.Connection, release_id: str) -> ReleaseState | None:
    row = db.execute("SELECT * FROM releases WHERE release_id = ?", (release_id,)).fetchone()
    return None if row is None else _release(row)


def project_status(db: sqlite3.Connection, project_id: str) -> str | None:
    row = db.execute(
        "SELECT status FROM project_admin WHERE project_id = ?", (project_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def app_status(db: sqlite3.Connection, app_name: str) -> str | None:
    row = db.execute("SELECT status FROM apps WHERE app_name = ?", (app_name,)).fetchone()
    return None if row is None else str(row[0])


# -- lists -------------------------------------------------------------------------------------
def claims(db: sqlite3.Connection) -> list[Claim]:
    return [_claim(r) for r in db.execute("SELECT * FROM claims ORDER BY resource")]


def tasks(db: sqlite3.Connection, change_id: str) -> list[TaskState]:
    rows = db.execute("SELECT * FROM tasks WHERE change_id = ? ORDER BY task_id", (change_id,))
    return [_task(row) for row in rows]


def active_tasks(db: sqlite3.Connection, change_id: str) -> int:
    """How many of the Change's Tasks an Agent holds (assigned or running)."""
    return int(
        db.execute(
            "SELECT COUNT(*) FROM tasks WHERE change_id = ? AND status IN ('assigned', 'running')",
            (change_id,),
        ).fetchone()[0]
    )


def changes(db: sqlite3.Connection) -> list[ChangeState]:
    rows = db.execute("SELECT * FROM changes ORDER BY created_at, change_id")
    return [row_to(ChangeState, row) for row in rows]


def candidates(db: sqlite3.Connection, change_id: str | None) -> list[CandidateState]:
    rows = db.execute(
        "SELECT * FROM candidates WHERE ? IS NULL OR change_id = ? ORDER BY created_at",
        (change_id, change_id),
    )
    return [_candidate(row) for row in rows]


def releases(db: sqlite3.Connection, change_id: str | None) -> list[ReleaseState]:
    rows = db.execute(
        "SELECT * FROM releases WHERE ? IS NULL OR change_id = ? ORDER BY generation",
        (change_id, change_id),
    )
    return [_release(row) for row in rows]


# -- the mappings with converted columns -------------------------------------------------------
def _claim(row: sqlite3.Row) -> Claim:
    return row_to(Claim, row, expires_at=utc_timestamp)


def _task(row: sqlite3.Row) -> TaskState:
    return row_to(TaskState, row, status=TaskStatus, depends_on=json_tuple)


def _candidate(row: sqlite3.Row) -> CandidateState:
    return row_to(
        CandidateState, row, changeset_ids=json_tuple, paths=json_tuple, status=CandidateStatus
    )


def _release(row: sqlite3.Row) -> ReleaseState:
    return row_to(ReleaseState, row, status=ReleaseStatus)
