"""What each Event does to its project's view: the rows of one stream's view store.

Every row is keyed by its project. Events of a project reach the view in stream order, except
that a nacked event comes back after later ones: every row remembers the stream sequence that
last moved it, and an older event never moves it back.

The functions run inside the view store's transaction (``view_store``). Each reads the typed
payload by attribute: a ``model_dump`` per event cost more than the projection itself.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rhumbatron.actors.row_statements import write_rows
from rhumbatron.protocol.envelopes import Event, format_timestamp

__all__ = ["VIEW_SCHEMA", "apply_events", "apply_groups"]

VIEW_SCHEMA = """
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
    project_id  TEXT NOT NULL,
    change_id   TEXT NOT NULL,
    title       TEXT,
    status      TEXT NOT NULL,
    reason      TEXT NOT NULL DEFAULT '',
    updated_seq INTEGER NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (project_id, change_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS view_tasks (
    project_id  TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    change_id   TEXT,
    status      TEXT NOT NULL,
    agent_id    TEXT,
    updated_seq INTEGER NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (project_id, task_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS view_agents (
    project_id  TEXT NOT NULL,
    agent_id    TEXT NOT NULL,
    change_id   TEXT,
    task_id     TEXT,
    since       TEXT NOT NULL,
    updated_seq INTEGER NOT NULL,
    PRIMARY KEY (project_id, agent_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS view_candidates (
    project_id      TEXT NOT NULL,
    candidate_id    TEXT NOT NULL,
    change_id       TEXT,
    status          TEXT NOT NULL,
    base_generation INTEGER,
    updated_seq     INTEGER NOT NULL,
    updated_at      TEXT NOT NULL,
    PRIMARY KEY (project_id, candidate_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS view_releases (
    project_id  TEXT NOT NULL,
    release_id  TEXT NOT NULL,
    generation  INTEGER NOT NULL,
    status      TEXT NOT NULL,
    updated_seq INTEGER NOT NULL,
    PRIMARY KEY (project_id, release_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS project_events (
    event_id     TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL,
    stream_seq   INTEGER NOT NULL,
    event_type   TEXT NOT NULL,
    change_id    TEXT,
    task_id      TEXT,
    actor        TEXT NOT NULL,
    occurred_at  TEXT NOT NULL,
    applied_at_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS project_events_order ON project_events (project_id, stream_seq);
CREATE INDEX IF NOT EXISTS project_events_age ON project_events (applied_at_s);
"""


class _Writes(Protocol):
    """What a projection writes through: a connection, or :class:`_Batched`."""

    def execute(self, sql: str, parameters: tuple[Any, ...], /) -> object: ...


#: A projection: where it writes, the event, its stream sequence and its timestamp as the
#: wire writes it (formatted once per event, not once per row).
_Projection = Callable[[_Writes, Event, int, str], None]

_FEED_SQL = (
    "INSERT INTO project_events (event_id, project_id, stream_seq, event_type, change_id, "
    "task_id, actor, occurred_at, applied_at_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_BUMP_SQL = (
    "INSERT INTO view_project (project_id, tenant_id, events_applied, last_event_at) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (project_id) DO UPDATE SET "
    "events_applied = events_applied + excluded.events_applied, "
    "last_event_at = max(coalesce(last_event_at, ''), excluded.last_event_at)"
)


class _Batched:
    """Runs each run of consecutive writes of the same statement as one batch
    (:func:`~rhumbatron.actors.row_statements.write_rows`: an ``INSERT`` as a few multi-row
    statements, anything else as one ``executemany``).

    The rows still reach SQLite in the order they were written, one statement after the
    other, so the result is that of one ``execute`` each; a stream of ``task.*`` Events
    costs a few calls into SQLite per fetch instead of one per Event. The projections only
    write (they read no result), which is what makes the deferral safe.
    """

    __slots__ = ("_db", "_rows", "_sql")

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._sql = ""
        self._rows: list[tuple[Any, ...]] = []

    def execute(self, sql: str, parameters: tuple[Any, ...], /) -> None:
        if sql is not self._sql and sql != self._sql:
            self.flush()
            self._sql = sql
        self._rows.append(parameters)

    def flush(self) -> None:
        if self._rows:
            write_rows(self._db, self._sql, self._rows)
            self._rows = []


def apply_events(
    db: sqlite3.Connection, events: Sequence[Event], seqs: Sequence[int], now_s: float
) -> None:
    """The feed rows, the project row and every projection of ``events`` (all of one
    project, none applied yet), in the caller's transaction."""
    apply_groups(db, [(events, seqs)], now_s)


def apply_groups(
    db: sqlite3.Connection,
    groups: Sequence[tuple[Sequence[Event], Sequence[int]]],
    now_s: float,
) -> None:
    """:func:`apply_events` for several projects' groups at once (a fetch), in the caller's
    transaction: every feed row, then every project row, then each Event's projection in
    the order given. A project's row exists before its projections read it, and each table
    sees its writes in the Events' order, as one group after the other would."""
    feed: list[tuple[Any, ...]] = []
    bumps: list[tuple[Any, ...]] = []
    stamped: list[tuple[Event, int, str]] = []
    for events, seqs in groups:
        stamps = [format_timestamp(e.timestamp) for e in events]
        for event, seq, at in zip(events, seqs, stamps, strict=True):
            feed.append(
                (
                    event.event_id,
                    event.project_id,
                    seq,
                    event.event_type,
                    event.change_id,
                    event.task_id,
                    event.actor,
                    at,
                    now_s,
                )
            )
            stamped.append((event, seq, at))
        first = events[0]
        bumps.append((first.project_id, first.tenant_id, len(events), max(stamps)))
    write_rows(db, _FEED_SQL, feed)
    write_rows(db, _BUMP_SQL, bumps)
    writes = _Batched(db)
    for event, seq, at in stamped:
        projection = _projection_of(event.event_type)
        if projection is not None:
            projection(writes, event, seq, at)
    writes.flush()


def _payload(event: Event) -> Any:
    """The typed payload; its type is the one the event type registers."""
    return event.payload


def _optional(payload: Any, name: str, default: Any) -> Any:
    """A field only some payload types have. Read from the model's fields directly:
    ``getattr`` with a default on a missing name goes through pydantic's ``__getattr__``
    and costs more than the row write it feeds."""
    return payload.__dict__.get(name, default)


def _project(db: _Writes, event: Event, seq: int, at: str) -> None:
    if event.event_type == "project.created":
        db.execute(
            "UPDATE view_project SET name = ? WHERE project_id = ?",
            (_payload(event).name, event.project_id),
        )


def _canonical(db: _Writes, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    db.execute(
        "UPDATE view_project SET canonical_generation = ?, canonical_candidate_id = ? "
        "WHERE project_id = ? AND canonical_generation < ?",
        (payload.generation, payload.candidate_id, event.project_id, payload.generation),
    )


def _set_change(
    db: _Writes,
    event: Event,
    seq: int,
    at: str,
    status: str,
    *,
    title: str | None = None,
    reason: str = "",
) -> None:
    db.execute(
        "INSERT INTO view_changes (project_id, change_id, title, status, reason, updated_seq, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (project_id, change_id) DO "
        "UPDATE SET title = coalesce(excluded.title, title), status = excluded.status, "
        "reason = excluded.reason, updated_seq = excluded.updated_seq, "
        "updated_at = excluded.updated_at WHERE excluded.updated_seq >= updated_seq",
        (event.project_id, event.change_id, title, status, reason, seq, at),
    )


def _change(db: _Writes, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    verb = event.event_type.split(".", 1)[1]
    if verb == "created":
        _set_change(db, event, seq, at, status="open", title=payload.title)
    elif verb == "planned":
        for task_id in payload.task_ids:
            _set_task(db, event, seq, at, task_id, status="planned")
    elif verb in ("status_changed", "settled"):
        reason = _optional(payload, "reason", "")
        _set_change(db, event, seq, at, status=payload.to_status, reason=reason)
    else:  # completed, failed, cancelled, not_selected, declined: the verb is the state
        _set_change(db, event, seq, at, status=verb, reason=_optional(payload, "reason", ""))


def _set_task(
    db: _Writes,
    event: Event,
    seq: int,
    at: str,
    task_id: str,
    *,
    status: str,
    agent_id: str | None = None,
) -> None:
    db.execute(
        "INSERT INTO view_tasks (project_id, task_id, change_id, status, agent_id, "
        "updated_seq, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (project_id, "
        "task_id) DO UPDATE SET status = excluded.status, "
        "agent_id = coalesce(excluded.agent_id, agent_id), "
        "updated_seq = excluded.updated_seq, updated_at = excluded.updated_at "
        "WHERE excluded.updated_seq >= updated_seq",
        (event.project_id, task_id, event.change_id, status, agent_id, seq, at),
    )


def _task(db: _Writes, event: Event, seq: int, at: str) -> None:
    verb = event.event_type.split(".", 1)[1]
    assert event.task_id is not None
    agent_id = _optional(_payload(event), "agent_id", None)
    _set_task(db, event, seq, at, event.task_id, status=verb, agent_id=agent_id)
    if verb == "assigned" and agent_id:
        _agent_active(db, event, seq, at, agent_id)
    elif verb in ("completed", "failed", "blocked"):
        # The task's agent slot is free; an agent that moved on to another task stays.
        db.execute(
            "DELETE FROM view_agents WHERE project_id = ? AND task_id = ? AND updated_seq <= ?",
            (event.project_id, event.task_id, seq),
        )


def _agent_active(db: _Writes, event: Event, seq: int, at: str, agent_id: str) -> None:
    db.execute(
        "INSERT INTO view_agents (project_id, agent_id, change_id, task_id, since, "
        "updated_seq) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (project_id, agent_id) DO UPDATE "
        "SET change_id = excluded.change_id, task_id = coalesce(excluded.task_id, task_id), "
        "updated_seq = excluded.updated_seq WHERE excluded.updated_seq >= updated_seq",
        (event.project_id, agent_id, event.change_id, event.task_id, at, seq),
    )


def _agent(db: _Writes, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    if event.event_type == "agent.woke" and not _optional(payload, "false_wakeup", False):
        _agent_active(db, event, seq, at, payload.agent_id)


def _candidate(db: _Writes, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    _set_candidate(
        db,
        event,
        seq,
        at,
        payload.candidate_id,
        status=event.event_type.split(".", 1)[1],
        base_generation=_optional(payload, "base_generation", None),
    )


def _set_candidate(
    db: _Writes,
    event: Event,
    seq: int,
    at: str,
    candidate_id: str,
    *,
    status: str,
    base_generation: int | None = None,
) -> None:
    db.execute(
        "INSERT INTO view_candidates (project_id, candidate_id, change_id, status, "
        "base_generation, updated_seq, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (project_id, candidate_id) DO UPDATE SET status = excluded.status, "
        "base_generation = coalesce(excluded.base_generation, base_generation), "
        "updated_seq = excluded.updated_seq, updated_at = excluded.updated_at "
        "WHERE excluded.updated_seq >= updated_seq",
        (event.project_id, candidate_id, event.change_id, status, base_generation, seq, at),
    )


def _promotion(db: _Writes, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    if event.event_type == "promotion.completed" and payload.outcome == "promoted":
        _set_candidate(db, event, seq, at, payload.candidate_id, status="promoted")


def _release(db: _Writes, event: Event, seq: int, at: str) -> None:
    payload = _payload(event)
    db.execute(
        "INSERT INTO view_releases (project_id, release_id, generation, status, updated_seq) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (project_id, release_id) DO UPDATE SET "
        "status = excluded.status, updated_seq = excluded.updated_seq "
        "WHERE excluded.updated_seq >= updated_seq",
        (
            event.project_id,
            payload.release_id,
            payload.generation,
            event.event_type.split(".", 1)[1],
            seq,
        ),
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

_BY_TYPE: dict[str, _Projection | None] = {}


def _projection_of(event_type: str) -> _Projection | None:
    """The projection of ``event_type`` (by its subject), looked up once per type."""
    try:
        return _BY_TYPE[event_type]
    except KeyError:
        projection = _BY_TYPE[event_type] = _PROJECTIONS.get(event_type.split(".", maxsplit=1)[0])
        return projection
