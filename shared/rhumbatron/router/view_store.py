"""The view store: the project views of one event stream in one SQLite file.

``<state>/views/EVENTS_NN.sqlite`` holds, keyed by project, the views of every project on
stream NN, their feed rows and the projector's claims (DECISIONS, "View store"). One fetch of
the stream is applied in ONE transaction: each project's fresh records are fed
(``project_events``) and projected under a SAVEPOINT of their own, and the whole fetch
commits once.

**The feed row is the claim.** An event's ``project_events`` row says the projector applied
it (``claimEvents`` inserts it, spec), keyed by the event ID and kept as long as a claim (14
days, the same daily prune): a second ``processed_events`` row per event would say the same
thing again, and its b-tree inserts were a third of the store's cost per event. The file's
``processed_events`` holds only the marks of dead-lettered events (never applied, never
fed). The claims commit with their effects: a router killed anywhere before the COMMIT
leaves neither, and the redelivery applies the events; killed after it, the redelivery finds
the claims and applies nothing (RELIABILITY F10).

**Visible at the commit, durable before the ack.** In WAL the store's commits write the WAL
without a sync (``synchronous=NORMAL``), and :meth:`StreamViews.sync` (one ``fdatasync`` of
the WAL) runs before the records a commit applied are acked: a machine that crashes in
between loses the commit with its claims, and JetStream redelivers the records. One sync in
flight covers every commit made before it started, and a nudge's next run goes on while it
runs (``group_sync``). Other journal modes sync at each commit.

A fetch's groups apply under one SAVEPOINT. When one fails, the fetch starts over with a
SAVEPOINT per group: the group at fault rolls back alone and is applied again one event per
SAVEPOINT, so only the event at fault fails (two statements per group saved on the common
path, where nothing fails).

A view is derived state: ``rhumbatron views rebuild`` rebuilds it from the stream (and the
archive beyond the stream's retention), see ``views``. Two cases are handled by the store
and the router themselves:

* **a state directory of the per-project layout** (``projects/<id>/view.sqlite``, before
  issue #16): at the first open of a stream's store, each such file of a project on the
  stream is copied in (claims included) and renamed ``view.sqlite.migrated``;
* **the file deleted or replaced under a warm process**: each transaction first checks that
  the file at the path is still the one this process has open; if not, the store reopens a
  fresh file and marks itself :attr:`StreamViews.lost`, and the router rebuilds the
  stream's views before it applies anything more (``EventRouter``).

A state directory whose ``views/`` is gone while the router was stopped cannot be told from a
new deployment (two routers starting at once each create the file): its views fill up from
what the projector reads next, and ``rhumbatron views rebuild`` restores the past.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

from rhumbatron.actors.storage import SqliteStore, fsync_directory
from rhumbatron.core.settings import Settings
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN, event_stream_name, stream_index
from rhumbatron.router.claims import CLAIMS_SCHEMA, complete_claims
from rhumbatron.router.projections import VIEW_SCHEMA, apply_events, apply_groups
from rhumbatron.router.records import APPLIED, DUPLICATE, Record, RecordOutcome

__all__ = ["PROJECTOR", "StreamViews", "view_store_path"]

_log = logging.getLogger(__name__)

PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR.value

#: The tables a project's rows live in, each with its project column.
VIEW_TABLES = (
    "view_project",
    "view_changes",
    "view_tasks",
    "view_agents",
    "view_candidates",
    "view_releases",
    "project_events",
)
_MIGRATED_SUFFIX = ".migrated"


def view_store_path(settings: Settings, stream: int) -> Path:
    """Where the views of stream ``stream`` live."""
    return settings.state_dir / "views" / f"{event_stream_name(stream)}.sqlite"


class StreamViews(SqliteStore):
    """The views of every project on one stream."""

    def __init__(self, settings: Settings, stream: int) -> None:
        super().__init__(view_store_path(settings, stream), settings, CLAIMS_SCHEMA + VIEW_SCHEMA)
        self.stream = stream
        #: The file was deleted or replaced under this process: its views must be rebuilt.
        self.lost = False
        self._inode: int | None = None
        #: In WAL, commits write the WAL without an fsync and :meth:`sync` makes them durable.
        self.syncs_later = False
        self._wal_entry_synced = True

    @property
    def connection(self) -> sqlite3.Connection:
        first = self._connection is None
        connection = super().connection
        if first:
            self._inode = os.stat(self.path).st_ino
            self.syncs_later = self.settings.journal_mode == "WAL"
            if self.syncs_later:
                connection.execute("PRAGMA synchronous=NORMAL")
                self._wal_entry_synced = False
            self._migrate_project_files(connection)
            self.sync()
        return connection

    def sync(self) -> None:
        """Make every commit so far durable: one ``fdatasync`` of the WAL (``fsync`` where
        the platform has no ``fdatasync``; in WAL; the commits are durable already in the
        other journal modes). Called before the records a commit applied are acked, on a
        worker thread."""
        if not self.syncs_later:
            return
        wal = f"{self.path}-wal"
        try:
            descriptor = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:
            return  # checkpointed and removed at a close: the database file holds it all
        try:
            # The WAL's data and its size, not its times: what SQLite's own syncs write on
            # Linux. fsync would also journal the file's new mtime at every fetch, which no
            # reader after a crash needs.
            getattr(os, "fdatasync", os.fsync)(descriptor)
        finally:
            os.close(descriptor)
        if not self._wal_entry_synced:  # a WAL this connection created: its directory entry
            fsync_directory(self.path.parent)
            self._wal_entry_synced = True

    @property
    def is_open(self) -> bool:
        return self._connection is not None

    def check_file(self) -> bool:
        """Whether the file at the path is still the one this process has open. When it is
        not (deleted, or replaced), the store closes it, will open the file at the path
        next, and sets :attr:`lost`."""
        if self._connection is None:
            return True
        try:
            inode: int | None = os.stat(self.path).st_ino
        except FileNotFoundError:
            inode = None
        if inode == self._inode:
            return True
        _log.error(
            "the view store %s was %s under this process; its views are rebuilt from the stream",
            self.path,
            "deleted" if inode is None else "replaced",
        )
        self.close()
        self.lost = True
        return False

    # -- the projector's writes ------------------------------------------------------------
    def apply(
        self, groups: Sequence[Sequence[Record]], *, now_s: float, wait: bool = True
    ) -> dict[str, RecordOutcome]:
        """Claim and apply each group (decoded records of one project) in one transaction.
        ``wait=False``: raise :class:`ActorBusyError` at once when the file is held."""
        self.check_file()
        with self.transaction(wait=wait) as db:
            outcomes, fresh_groups = _fresh(db, groups)
            db.execute("SAVEPOINT fetch")
            try:
                # The common case: every group applies, with no SAVEPOINT of its own, each
                # statement once for the whole fetch (``apply_groups``).
                apply_groups(
                    db, [(_events(f), [r.stream_seq for r in f]) for f in fresh_groups], now_s
                )
            except sqlite3.OperationalError:
                db.execute("ROLLBACK TO fetch")
                db.execute("RELEASE fetch")
                raise
            except _APPLY_ERRORS:
                # One group is at fault: start over, each group under a SAVEPOINT of its own.
                db.execute("ROLLBACK TO fetch")
                db.execute("RELEASE fetch")
                for fresh in fresh_groups:
                    outcomes.update(_apply_group(db, fresh, now_s))
            else:
                db.execute("RELEASE fetch")
        return outcomes

    def mark_processed(self, event_ids: Sequence[str], *, now_s: float) -> None:
        """Mark dead-lettered events processed, so a redelivery skips them (a rebuild keeps
        these marks: a poison event stays skipped)."""
        self.check_file()
        with self.transaction() as db:
            complete_claims(db, PROJECTOR, event_ids, now_s=now_s)
        self.sync()  # before the dead letters are acked

    def prune_feed(self, *, older_than_s: float, limit: int) -> int:
        """Delete at most ``limit`` feed rows applied before ``older_than_s``."""
        with self.transaction() as db:
            return db.execute(
                "DELETE FROM project_events WHERE event_id IN (SELECT event_id FROM "
                "project_events WHERE applied_at_s < ? LIMIT ?)",
                (older_than_s, limit),
            ).rowcount

    def forget(self, project_id: str | None = None) -> int:
        """Delete the views and feed rows (the claims) of ``project_id`` (every project of
        the stream for None), so a replay applies its events again. Returns the claims
        deleted. A dead letter's mark is kept: a poison event stays skipped."""
        self.check_file()
        with self.transaction() as db:
            where, args = (
                ("", ()) if project_id is None else (" WHERE project_id = ?", (project_id,))
            )
            claims = db.execute(f"DELETE FROM project_events{where}", args).rowcount
            for table in VIEW_TABLES:
                db.execute(f"DELETE FROM {table}{where}", args)
            return claims

    def claim_states(self, event_ids: Sequence[str]) -> dict[str, tuple[str, float | None]]:
        """``event_id -> (status, lease_until_s)`` of the projector's claims among
        ``event_ids``: a feed row or a dead letter's mark is ``done`` (a read)."""
        return {event_id: ("done", None) for event_id in _claimed(self.connection, event_ids)}

    def project_ids(self) -> list[str]:
        """The projects of this stream that have a view."""
        if not self.path.exists():
            return []
        rows = self.connection.execute("SELECT project_id FROM view_project ORDER BY 1")
        return [str(row[0]) for row in rows]

    # -- the per-project layout, migrated --------------------------------------------------
    def _migrate_project_files(self, connection: sqlite3.Connection) -> None:
        projects = self.settings.state_dir / "projects"
        if not projects.is_dir():
            return
        for old in sorted(projects.glob("*/view.sqlite")):
            project_id = old.parent.name
            if PROJECT_ID_PATTERN.fullmatch(project_id) and stream_index(project_id) == self.stream:
                _copy_project_file(self, connection, old, project_id)


def _copy_project_file(
    store: StreamViews, connection: sqlite3.Connection, old: Path, project_id: str
) -> None:
    """Copy one per-project view file into the store (idempotent: a crash before the rename
    copies it again over the same keys), then rename it ``view.sqlite.migrated``."""
    with closing(sqlite3.connect(old)) as source:
        source.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file
    connection.execute("ATTACH DATABASE ? AS old", (str(old),))
    try:
        with store.transaction() as db:
            _copy_rows(db, project_id)
    finally:
        connection.execute("DETACH DATABASE old")
    old.rename(old.with_name(old.name + _MIGRATED_SUFFIX))
    _log.warning(
        "migrated the view of project %s from %s into %s (the old file is kept as %s)",
        project_id,
        old,
        store.path,
        old.name + _MIGRATED_SUFFIX,
    )


def _copy_rows(db: sqlite3.Connection, project_id: str) -> None:
    copies = {
        "view_project": "project_id, tenant_id, name, status, canonical_generation, "
        "canonical_candidate_id, events_applied, last_event_at",
        "view_changes": "change_id, title, status, reason, updated_seq, updated_at",
        "view_tasks": "task_id, change_id, status, agent_id, updated_seq, updated_at",
        "view_agents": "agent_id, change_id, task_id, since, updated_seq",
        "view_candidates": "candidate_id, change_id, status, base_generation, updated_seq, "
        "updated_at",
        "view_releases": "release_id, generation, status, updated_seq",
        "project_events": "event_id, stream_seq, event_type, change_id, task_id, actor, "
        "occurred_at, applied_at_s",
    }
    for table, columns in copies.items():
        if table == "view_project":
            db.execute(
                f"INSERT OR REPLACE INTO {table} ({columns}) SELECT {columns} FROM old.{table}"
            )
        else:
            db.execute(
                f"INSERT OR REPLACE INTO {table} (project_id, {columns}) "
                f"SELECT ?, {columns} FROM old.{table}",
                (project_id,),
            )
    # A claim without a feed row is a dead letter's mark (or a row the feed's prune took
    # first): kept as a mark, so the event stays skipped.
    db.execute(
        "INSERT OR IGNORE INTO processed_events (consumer, event_id, status, lease_until_s, "
        "processed_at_s) SELECT consumer, event_id, status, lease_until_s, processed_at_s "
        "FROM old.processed_events WHERE event_id NOT IN (SELECT event_id FROM old.project_events)"
    )


# -- applying a fetch ----------------------------------------------------------------------------


def _claimed(db: sqlite3.Connection, event_ids: Sequence[str]) -> set[str]:
    """The IDs among ``event_ids`` the projector has already claimed: applied (a feed row)
    or dead-lettered (a mark). One query per 400 IDs."""
    found: set[str] = set()
    for offset in range(0, len(event_ids), 400):
        chunk = event_ids[offset : offset + 400]
        marks = ", ".join("?" * len(chunk))
        rows = db.execute(
            f"SELECT event_id FROM project_events WHERE event_id IN ({marks}) UNION ALL "
            f"SELECT event_id FROM processed_events WHERE consumer = ? AND event_id IN ({marks})",
            [*chunk, PROJECTOR, *chunk],
        )
        found.update(row[0] for row in rows)
    return found


#: What applying an event may raise that is the event's fault (an OperationalError is not:
#: a busy file or a full disk fails the whole fetch, for a retry).
_APPLY_ERRORS = (sqlite3.Error, ValueError, KeyError, TypeError, AttributeError)


def _fresh(
    db: sqlite3.Connection, groups: Sequence[Sequence[Record]]
) -> tuple[dict[str, RecordOutcome], list[list[Record]]]:
    """Each record's outcome if nothing fails (a duplicate when claimed already, or earlier
    in the fetch), and each group's records still to apply."""
    done = _claimed(db, [r.key for group in groups for r in group])
    outcomes: dict[str, RecordOutcome] = {}
    fresh_groups: list[list[Record]] = []
    for group in groups:
        fresh: list[Record] = []
        for record in group:
            if record.key in done or record.key in outcomes:
                outcomes[record.key] = DUPLICATE
            else:
                outcomes[record.key] = APPLIED
                fresh.append(record)
        if fresh:
            fresh_groups.append(fresh)
    return outcomes, fresh_groups


def _events(records: Sequence[Record]) -> list[Event]:
    events = [r.event for r in records]
    assert all(e is not None for e in events)
    return events  # type: ignore[return-value]


def _apply_group(
    db: sqlite3.Connection, records: Sequence[Record], now_s: float
) -> dict[str, RecordOutcome]:
    """One project's fresh records under a SAVEPOINT; on an error, one event per SAVEPOINT."""
    events = _events(records)
    db.execute("SAVEPOINT project")
    try:
        apply_events(db, events, [r.stream_seq for r in records], now_s)
    except sqlite3.OperationalError:
        # Disk full, I/O error, a lock: nothing is these events' fault. Up to the caller,
        # which retries the whole batch without counting a failure.
        db.execute("ROLLBACK TO project")
        db.execute("RELEASE project")
        raise
    except _APPLY_ERRORS:
        db.execute("ROLLBACK TO project")
        db.execute("RELEASE project")
        return _apply_one_by_one(db, records, now_s)
    db.execute("RELEASE project")
    return {}


def _apply_one_by_one(
    db: sqlite3.Connection, records: Sequence[Record], now_s: float
) -> dict[str, RecordOutcome]:
    """The fallback: each event under its own SAVEPOINT, so only a bad one fails."""
    outcomes: dict[str, RecordOutcome] = {}
    for record, event in zip(records, _events(records), strict=True):
        db.execute("SAVEPOINT event")
        try:
            apply_events(db, [event], [record.stream_seq], now_s)
        except sqlite3.OperationalError:
            raise
        except _APPLY_ERRORS as exc:
            db.execute("ROLLBACK TO event")
            outcomes[record.key] = RecordOutcome.failed(
                f"applying {event.event_type} to the view failed: {exc}"
            )
        db.execute("RELEASE event")
    return outcomes
