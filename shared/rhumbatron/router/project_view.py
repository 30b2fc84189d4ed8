"""One project's view: a handle on its rows in its stream's view store (``view_store``).

What the API, the dashboard and the lookups read (:meth:`ProjectView.snapshot`, the feed, an
applied event's stream sequence), and :meth:`ProjectView.apply_delta`, one project's records
applied in a transaction of their own (the projector applies a whole fetch at once through
:meth:`~rhumbatron.router.view_store.StreamViews.apply`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rhumbatron.router.records import Record, RecordOutcome
from rhumbatron.router.view_store import PROJECTOR, StreamViews

__all__ = ["PROJECTOR", "ProjectView"]


@dataclass(frozen=True)
class ProjectView:
    """The view of one project, in the store of its stream."""

    store: StreamViews
    project_id: str

    @property
    def connection(self) -> sqlite3.Connection:
        return self.store.connection

    @property
    def path(self) -> Path:
        return self.store.path

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.store.transaction() as db:
            yield db

    def apply_delta(self, records: Sequence[Record], *, now_s: float) -> dict[str, RecordOutcome]:
        """Claim and apply ``records`` (decoded, all of this project) in one transaction."""
        return self.store.apply([records], now_s=now_s)

    def stream_seq_of(self, event_id: str) -> int | None:
        """Where an applied event of the feed sits on its project's stream (None: not
        applied yet, or aged out of the feed)."""
        row = self.connection.execute(
            "SELECT stream_seq FROM project_events WHERE event_id = ? AND project_id = ?",
            (event_id, self.project_id),
        ).fetchone()
        return None if row is None else int(row[0])

    def snapshot(self, latest: int = 20) -> dict[str, Any]:
        """The view as plain data: what the demo prints and the dashboard draws."""
        db = self.connection
        project_id = self.project_id
        project = db.execute(
            "SELECT * FROM view_project WHERE project_id = ?", (project_id,)
        ).fetchone()

        def by_status(table: str) -> dict[str, int]:
            rows = db.execute(
                f"SELECT status, COUNT(*) FROM {table} WHERE project_id = ? "
                "GROUP BY status ORDER BY 1",
                (project_id,),
            )
            return {row[0]: row[1] for row in rows}

        def rows(sql: str, *args: object) -> list[dict[str, Any]]:
            return [dict(row) for row in db.execute(sql, (project_id, *args))]

        return {
            "projectId": project_id,
            "name": project["name"] if project else None,
            "status": project["status"] if project else None,
            "canonicalGeneration": project["canonical_generation"] if project else 0,
            "eventsApplied": project["events_applied"] if project else 0,
            "changesByState": by_status("view_changes"),
            "tasksByState": by_status("view_tasks"),
            "activeAgents": rows(
                "SELECT agent_id AS agentId, change_id AS changeId, task_id AS taskId "
                "FROM view_agents WHERE project_id = ? ORDER BY agent_id"
            ),
            "candidates": rows(
                "SELECT candidate_id AS candidateId, change_id AS changeId, status "
                "FROM view_candidates WHERE project_id = ? ORDER BY candidate_id"
            ),
            "latestEvents": rows(
                "SELECT stream_seq AS streamSeq, event_type AS eventType, event_id AS "
                "eventId, occurred_at AS occurredAt FROM project_events WHERE project_id = ? "
                "ORDER BY stream_seq DESC LIMIT ?",
                latest,
            ),
        }
