"""The ProjectView actor: what a dashboard needs about one project, built from its Events.

One SQLite file per project, ``<state>/projects/<id>/view.sqlite``, next to the project's own
actors. :meth:`ProjectView.apply_delta` takes a project's fresh records from one fetch and, in
ONE transaction, claims each (``INSERT OR IGNORE processed_events``), writes its
``project_events`` feed row and applies it to the view tables. The claim commits with the
effect: a router killed anywhere before the COMMIT leaves neither, and the redelivery applies
the event; killed after it, the redelivery finds the claims and applies nothing (F10).

Each event runs under its own SAVEPOINT: one event that cannot be applied rolls back alone
(its claim with it) and is reported failed; the others commit.

Events of a project reach the view in stream order, except that a nacked event comes back
after later ones. Every row remembers the stream sequence that last moved it, and an older
event never moves it back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.settings import Settings
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.paths import path_under
from rhumbatron.protocol.envelopes import Event, format_timestamp
from rhumbatron.router.claims import CLAIMS_SCHEMA, claim_events
from rhumbatron.router.records import APPLIED, DUPLICATE, Record, RecordOutcome

__all__ = ["PROJECTOR", "ProjectView"]

PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR.value

_VIEW_SCHEMA = """
CREATE TABLE IF NOT EXISTS view_project (
    project_id             TEXT PRIMARY KEY,
    tenant_id              TEXT NOT NULL,
    name                   TEXT,
    status                 TEXT NOT NULL DEFAULT 'active',
    canonical_generation   INTEGER NOT NULL DEFAULT 0,
    canonical_candidate_id TEXT,
    events_applied         INTEGER NOT NULL DEFAULT 0,
    last_event_at          TEXT
);
CREATE TABLE IF NOT EXISTS view_changes (
    change_id   TEXT PRIMARY KEY,
    title       TEXT,
    status      TEXT NOT NULL,
    reason      TEXT NOT NULL DEFAULT '',
    updated_seq INTEGER NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS view_tasks (
    task_id     TEXT PRIMARY KEY,
    change_id   TEXT,
    status      TEXT NOT NULL,
    agent_id    TEXT,
    updated_seq INTEGER NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS view_agents (
    agent_id    TEXT PRIMARY KEY,
    change_id   TEXT,
    task_id     TEXT,
    since       TEXT NOT NULL,
    updated_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS view_candidates (
    candidate_id    TEXT PRIMARY KEY,
    change_id       TEXT,
    status          TEXT NOT NULL,
    base_generation INTEGER,
    updated_seq     INTEGER NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS view_releases (
    release_id  TEXT PRIMARY KEY,
    generation  INTEGER NOT NULL,
    status      TEXT NOT NULL,
    updated_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS project_events (
    event_id     TEXT PRIMARY KEY,
    stream_seq   INTEGER NOT NULL,
    event_type   TEXT NOT NULL,
    change_id    TEXT,
    task_id      TEXT,
    actor        TEXT NOT NULL,
    occurred_at  TEXT NOT NULL,
    applied_at_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS project_events_order ON project_events (stream_seq);
CREATE INDEX IF NOT EXISTS project_events_age ON project_events (applied_at_s);
"""

#: A projection: the connection, the event, its stream sequence and its timestamp as the
#: wire writes it (formatted once per event, not once per row).
_Projection = Callable[[sqlite3.Connection, Event, int, str], None]


class ProjectView(SqliteStore):
    """The view of one project."""

    def __init__(self, settings: Settings, project_id: str) -> None:
        super().__init__(
            path_under(settings.state_dir / "projects", project_id, "view.sqlite"),
            settings,
            CLAIMS_SCHEMA + _VIEW_SCHEMA,
        )
        self.project_id = project_id

    def apply_delta(self, records: Sequence[Record], *, now_s: float) -> dict[str, RecordOutcome]:
        """Claim and apply ``records`` (decoded, all of this project) in one transaction.

        The common path claims the batch with one read and two multi-row writes; if
        anything in it raises, it is rolled back and the batch is applied again one event
        per SAVEPOINT, so only the event at fault fails.
        """
        with self.transaction() as db:
            done = _claimed(db, [r.key for r in records])
            fresh: list[Record] = []
            outcomes: dict[str, RecordOutcome] = {}
            for record in records:
                if record.key in done or record.key in outcomes:
                    outcomes[record.key] = DUPLICATE
                else:
                    outcomes[record.key] = APPLIED
                    fresh.append(record)
            if not fresh:
                return outcomes
            db.execute("SAVEPOINT batch")
            try:
                _apply_batch(db, fresh, now_s)
            except (sqlite3.Error, ValueError, KeyError, TypeError):
                db.execute("ROLLBACK TO batch")
                db.execute("RELEASE batch")
                outcomes.update(_apply_one_by_one(db, fresh, now_s))
            else:
                db.execute("RELEASE batch")
        return outcomes

    def mark_processed(self, event_ids: Sequence[str], *, now_s: float) -> None:
        """Mark dead-lettered events processed, so a redelivery skips them."""
        from rhumbatron.router.claims import complete_claims

        with self.transaction() as db:
            complete_claims(db, PROJECTOR, event_ids, now_s=now_s)

    def stream_seq_of(self, event_id: str) -> int | None:
        """Where an applied event of the feed sits on its project's stream (None: not
        applied yet, or aged out of the feed)."""
        row = self.connection.execute(
            "SELECT stream_seq FROM project_events WHERE event_id = ?", (event_id,)
        ).fetchone()
        return None if row is None else int(row[0])

    def prune_feed(self, *, older_than_s: float, limit: int) -> int:
        """Delete at most ``limit`` feed rows applied before ``older_than_s``."""
        with self.transaction() as db:
            return db.execute(
                "DELETE FROM project_events WHERE event_id IN (SELECT event_id FROM "
                "project_events WHERE applied_at_s < ? LIMIT ?)",
                (older_than_s, limit),
            ).rowcount

    def snapshot(self, latest: int = 20) -> dict[str, Any]:
        """The view as plain data: what the demo prints and the dashboard draws."""
        db = self.connection
        project = db.execute("SELECT * FROM view_project").fetchone()

        def by_status(table: str) -> dict[str, int]:
            rows = db.execute(f"SELECT status, COUNT(*) FROM {table} GROUP BY status ORDER BY 1")
            return {row[0]: row[1] for row in rows}

        return {
            "projectId": self.project_id,
            "name": project["name"] if project else None,
            "status": project["status"] if project else None,
            "canonicalGeneration": project["canonical_generation"] if project else 0,
            "eventsApplied": project["events_applied"] if project else 0,
            "changesByState": by_status("view_changes"),
            "tasksByState": by_status("view_tasks"),
            "activeAgents": [
                dict(row)
                for row in db.execute(
                    "SELECT agent_id AS agentId, change_id AS changeId, task_id AS taskId "
                    "FROM view_agents ORDER BY agent_id"
                )
            ],
            "candidates": [
                dict(row)
                for row in db.execute(
                    "SELECT candidate_id AS candidateId, change_id AS changeId, status "
                    "FROM view_candidates ORDER BY candidate_id"
                )
            ],
            "latestEvents": [
                dict(row)
                for row in db.execute(
                    "SELECT stream_seq AS streamSeq, event_type AS eventType, event_id AS "
                    "eventId, occurred_at AS occurredAt FROM project_events "
                    "ORDER BY stream_seq DESC LIMIT ?",
                    (latest,),
                )
            ],
        }


# -- projections ----------------------------------------------------------------------------


def _claimed(db: sqlite3.Connection, event_ids: Sequence[str]) -> set[str]:
    """The IDs among ``event_ids`` the projector has already claimed (one query)."""
    marks = ", ".join("?" * len(event_ids))
    rows = db.execute(
        f"SELECT event_id FROM processed_events WHERE consumer = ? AND event_id IN ({marks})",
        [PROJECTOR, *event_ids],
    )
    return {row[0] for row in rows}


def _event(record: Record) -> Event:
    assert record.event is not None
    return record.event


def _apply_batch(db: sqlite3.Connection, records: Sequence[Record], now_s: float) -> None:
    """Claims, feed rows and the project row for the whole batch, then each projection."""
    events = [_event(r) for r in records]
    stamps = [format_timestamp(e.timestamp) for e in events]
    db.executemany(
        "INSERT INTO processed_events (consumer, event_id, status, lease_until_s, "
        "processed_at_s) VALUES (?, ?, 'done', NULL, ?)",
        [(PROJECTOR, e.event_id, now_s) for e in events],
    )
    db.executemany(
        "INSERT INTO project_events (event_id, stream_seq, event_type, change_id, task_id, "
        "actor, occurred_at, applied_at_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                e.event_id,
                r.stream_seq,
                e.event_type,
                e.change_id,
                e.task_id,
                e.actor,
                at,
                now_s,
            )
            for e, r, at in zip(events, records, stamps, strict=True)
        ],
    )
    _bump_project(db, events[0], len(events), max(stamps))
    for event, record, at in zip(events, records, stamps, strict=True):
        _project_event(db, event, record.stream_seq, at)


def _apply_one_by_one(
    db: sqlite3.Connection, records: Sequence[Record], now_s: float
) -> dict[str, RecordOutcome]:
    """The fallback: each event under its own SAVEPOINT, so only a bad one fails."""
    outcomes: dict[str, RecordOutcome] = {}
    for record in records:
        event = _event(record)
        db.execute("SAVEPOINT event")
        try:
            claim_events(db, PROJECTOR, [event.event_id], now_s=now_s)
            _apply(db, event, record.stream_seq, now_s)
            outcomes[record.key] = APPLIED
        except sqlite3.OperationalError:
            # Disk full, I/O error, a lock: nothing is this event's fault. Up to the caller,
            # which retries the whole batch without counting a failure.
            raise
        except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
            db.execute("ROLLBACK TO event")
            outcomes[record.key] = RecordOutcome.failed(
                f"applying {event.event_type} to the view failed: {exc}"
            )
        db.execute("RELEASE event")
    return outcomes


def _bump_project(db: sqlite3.Connection, event: Event, count: int, last_at: str) -> None:
    db.execute(
        "INSERT INTO view_project (project_id, tenant_id, events_applied, last_event_at) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (project_id) DO UPDATE SET "
        "events_applied = events_applied + excluded.events_applied, "
        "last_event_at = max(coalesce(last_event_at, ''), excluded.last_event_at)",
        (event.project_id, event.tenant_id, count, last_at),
    )


def _project_event(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    projection = _PROJECTIONS.get(event.event_type.split(".")[0])
    if projection is not None:
        projection(db, event, seq, at)


def _apply(db: sqlite3.Connection, event: Event, seq: int, now_s: float) -> None:
    at = format_timestamp(event.timestamp)
    db.execute(
        "INSERT INTO project_events (event_id, stream_seq, event_type, change_id, task_id, "
        "actor, occurred_at, applied_at_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            event.event_id,
            seq,
            event.event_type,
            event.change_id,
            event.task_id,
            event.actor,
            at,
            now_s,
        ),
    )
    _bump_project(db, event, 1, at)
    _project_event(db, event, seq, at)


def _payload(event: Event) -> Any:
    """The typed payload, read by attribute (a ``model_dump`` per event cost more than the
    projection itself); its type is the one the event type registers."""
    return event.payload


def _project(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    if event.event_type == "project.created":
        db.execute(
            "UPDATE view_project SET name = ? WHERE project_id = ?",
            (_payload(event).name, event.project_id),
        )


def _canonical(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    db.execute(
        "UPDATE view_project SET canonical_generation = ?, canonical_candidate_id = ? "
        "WHERE project_id = ? AND canonical_generation < ?",
        (payload.generation, payload.candidate_id, event.project_id, payload.generation),
    )


def _set_change(
    db: sqlite3.Connection,
    event: Event,
    seq: int,
    at: str,
    status: str,
    *,
    title: str | None = None,
    reason: str = "",
) -> None:
    db.execute(
        "INSERT INTO view_changes (change_id, title, status, reason, updated_seq, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (change_id) DO UPDATE SET "
        "title = coalesce(excluded.title, title), status = excluded.status, "
        "reason = excluded.reason, updated_seq = excluded.updated_seq, "
        "updated_at = excluded.updated_at WHERE excluded.updated_seq >= updated_seq",
        (event.change_id, title, status, reason, seq, at),
    )


def _change(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    verb = event.event_type.split(".", 1)[1]
    if verb == "created":
        _set_change(db, event, seq, at, status="open", title=payload.title)
    elif verb == "planned":
        for task_id in payload.task_ids:
            _set_task(db, event, seq, at, task_id, status="planned")
    elif verb in ("status_changed", "settled"):
        reason = getattr(payload, "reason", "")
        _set_change(db, event, seq, at, status=payload.to_status, reason=reason)
    else:  # completed, failed, cancelled, not_selected, declined: the verb is the state
        _set_change(db, event, seq, at, status=verb, reason=getattr(payload, "reason", ""))


def _set_task(
    db: sqlite3.Connection,
    event: Event,
    seq: int,
    at: str,
    task_id: str,
    *,
    status: str,
    agent_id: str | None = None,
) -> None:
    db.execute(
        "INSERT INTO view_tasks (task_id, change_id, status, agent_id, updated_seq, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET "
        "status = excluded.status, agent_id = coalesce(excluded.agent_id, agent_id), "
        "updated_seq = excluded.updated_seq, updated_at = excluded.updated_at "
        "WHERE excluded.updated_seq >= updated_seq",
        (task_id, event.change_id, status, agent_id, seq, at),
    )


def _task(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    verb = event.event_type.split(".", 1)[1]
    assert event.task_id is not None
    agent_id = getattr(_payload(event), "agent_id", None)
    _set_task(db, event, seq, at, event.task_id, status=verb, agent_id=agent_id)
    if verb == "assigned" and agent_id:
        _agent_active(db, event, seq, at, agent_id)
    elif verb in ("completed", "failed", "blocked"):
        # The task's agent slot is free; an agent that moved on to another task stays.
        db.execute(
            "DELETE FROM view_agents WHERE task_id = ? AND updated_seq <= ?", (event.task_id, seq)
        )


def _agent_active(db: sqlite3.Connection, event: Event, seq: int, at: str, agent_id: str) -> None:
    db.execute(
        "INSERT INTO view_agents (agent_id, change_id, task_id, since, updated_seq) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (agent_id) DO UPDATE SET "
        "change_id = excluded.change_id, task_id = coalesce(excluded.task_id, task_id), "
        "updated_seq = excluded.updated_seq WHERE excluded.updated_seq >= updated_seq",
        (agent_id, event.change_id, event.task_id, at, seq),
    )


def _agent(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    if event.event_type == "agent.woke" and not getattr(payload, "false_wakeup", False):
        _agent_active(db, event, seq, at, payload.agent_id)


def _candidate(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    _set_candidate(
        db,
        event,
        seq,
        at,
        payload.candidate_id,
        status=event.event_type.split(".", 1)[1],
        base_generation=getattr(payload, "base_generation", None),
    )


def _set_candidate(
    db: sqlite3.Connection,
    event: Event,
    seq: int,
    at: str,
    candidate_id: str,
    *,
    status: str,
    base_generation: int | None = None,
) -> None:
    db.execute(
        "INSERT INTO view_candidates (candidate_id, change_id, status, base_generation, "
        "updated_seq, updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (candidate_id) DO "
        "UPDATE SET status = excluded.status, "
        "base_generation = coalesce(excluded.base_generation, base_generation), "
        "updated_seq = excluded.updated_seq, updated_at = excluded.updated_at "
        "WHERE excluded.updated_seq >= updated_seq",
        (
            candidate_id,
            event.change_id,
            status,
            base_generation,
            seq,
            at,
        ),
    )


def _promotion(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    if event.event_type == "promotion.completed" and payload.outcome == "promoted":
        _set_candidate(db, event, seq, at, payload.candidate_id, status="promoted")


def _release(db: sqlite3.Connection, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    db.execute(
        "INSERT INTO view_releases (release_id, generation, status, updated_seq) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (release_id) DO UPDATE SET status = excluded.status, "
        "updated_seq = excluded.updated_seq WHERE excluded.updated_seq >= updated_seq",
        (payload.release_id, payload.generation, event.event_type.split(".", 1)[1], seq),
    )


#: Projections by the subject of the event type; other subjects only add a feed row.
_PROJECTIONS: dict[str, _Projection] = {
    "project": _project,
    "canonical": _canonical,
    "change": _change,
    "task": _task,
    "agent": _agent,
    "candidate": _candidate,
    "promotion": _promotion,
    "release": _release,
}
