"""The indexer: the ``indexing`` queue's handler, and the ``project_indexes`` table it keeps.

``index.build`` (queued by ``artifact.promoted``, ``canonical.advanced`` and the daily
backfill) indexes what is canonical *now*, whatever generation the command names; a repeat
for a generation already indexed does nothing. ``index.purge`` (archived or deleted
Projects) deletes the index file. The indexing queue has no dead-letter queue: every failure
is recorded in ``project_indexes`` (status ``failed``, the error, one more attempt) and
re-raised, so the queue runtime retries it after 30 s and, after the last retry, terminates
it — the recorded failure is what remains for the sweep's backfill and for operators.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import DomainError
from rhumbatron.indexing.index import Document, ProjectIndex
from rhumbatron.messaging.queue_consumer import Delivery, Retry, queue_row
from rhumbatron.protocol.command_types import IndexBuild
from rhumbatron.protocol.envelopes import Command

__all__ = [
    "PROJECT_INDEXES_SCHEMA",
    "CanonicalDocuments",
    "CanonicalSnapshot",
    "IndexState",
    "IndexStatus",
    "Indexer",
]

_log = logging.getLogger(__name__)

_INDEXING_QUEUE = "indexing"
_ERROR_LIMIT = 2_000  # characters of an error kept in the row; a traceback is in the logs

PROJECT_INDEXES_SCHEMA = """
CREATE TABLE IF NOT EXISTS project_indexes (
    project_id   TEXT PRIMARY KEY,
    generation   INTEGER,
    status       TEXT NOT NULL CHECK (status IN ('ready', 'failed', 'purged')),
    documents    INTEGER NOT NULL DEFAULT 0,
    error        TEXT NOT NULL DEFAULT '',
    attempts     INTEGER NOT NULL DEFAULT 0,
    updated_at_s REAL NOT NULL
);
"""


class IndexState(StrEnum):
    READY = "ready"  # the file holds ``generation``
    FAILED = "failed"  # the last build or purge failed; a ready file may still answer
    PURGED = "purged"  # the file is gone


@dataclass(frozen=True, slots=True)
class IndexStatus:
    """One ``project_indexes`` row.

    ``generation`` is the generation the file holds (None once purged; kept when a rebuild
    fails, since the old index is untouched). ``attempts`` counts failures since the last
    success.
    """

    project_id: str
    generation: int | None
    status: IndexState
    documents: int
    error: str
    attempts: int
    updated_at_s: float


@dataclass(frozen=True, slots=True)
class CanonicalSnapshot:
    """A project's canonical artifacts at one generation."""

    generation: int
    documents: tuple[Document, ...]


class CanonicalDocuments(Protocol):
    """Where the indexer reads what is canonical."""

    def canonical_snapshot(self, project_id: str) -> CanonicalSnapshot | None:
        """The current canonical artifacts; None when the project is unknown or nothing
        has been promoted yet."""
        ...


@dataclass
class Indexer:
    """The ``indexing`` queue's handler (see the module docstring)."""

    settings: Settings
    store: SqliteStore
    clock: Clock
    source: CanonicalDocuments

    def project_index(self, project_id: str) -> ProjectIndex:
        """The index file of ``project_id`` (for searching); refuses an unsafe ID."""
        return ProjectIndex(self.settings, project_id, self.clock)

    async def __call__(self, command: Command, delivery: Delivery) -> Retry | None:
        """Build or purge the index of ``command.project_id``; a failure is recorded, then
        raised for the queue runtime to retry."""
        if command.command_type == "index.build":
            work = self._build
        elif command.command_type == "index.purge":
            work = self._purge
        else:
            raise DomainError(
                f"the indexer handles index.build and index.purge, not "
                f"{command.command_type!r} ({command.command_id}); send it to its own queue"
            )
        try:
            # SQLite and the file system block: off the event loop, so in-progress marks of
            # a long build still go out.
            return await asyncio.to_thread(work, command)
        except Exception as exc:
            await asyncio.to_thread(self._record_failure, command, exc, delivery)
            raise

    # -- queries for the sweep -------------------------------------------------------------

    def status(self, project_id: str) -> IndexStatus | None:
        """The ``project_indexes`` row of ``project_id``; None when it never had one."""
        rows = self._read(
            "SELECT project_id, generation, status, documents, error, attempts, updated_at_s "
            "FROM project_indexes WHERE project_id = ?",
            (project_id,),
        )
        return _status(rows[0]) if rows else None

    def ready_generation(self, project_id: str) -> int | None:
        """The generation of the project's ready index; None when it has no ready index."""
        row = self.status(project_id)
        if row is None or row.status is not IndexState.READY:
            return None
        return row.generation

    def projects_with_index_rows(self, project_ids: Iterable[str] | None = None) -> list[str]:
        """Projects (of ``project_ids``, or all) whose index is not purged: ready or failed.

        The sweep purges these when their Project is archived or deleted.
        """
        sql = "SELECT project_id FROM project_indexes WHERE status IN ('ready', 'failed')"
        return [str(row[0]) for row in self._read_among(sql, project_ids)]

    def projects_without_ready_index(self, project_ids: Iterable[str]) -> list[str]:
        """Of ``project_ids`` (active Projects), those without a ready index, in the given
        order: the daily backfill queues ``index.build`` for them."""
        wanted = list(dict.fromkeys(project_ids))
        sql = "SELECT project_id FROM project_indexes WHERE status = 'ready'"
        ready = {str(row[0]) for row in self._read_among(sql, wanted)}
        return [project_id for project_id in wanted if project_id not in ready]

    # -- work, on a worker thread ----------------------------------------------------------

    def _build(self, command: Command) -> Retry | None:
        project_id = command.project_id
        index = self.project_index(project_id)
        snapshot = self.source.canonical_snapshot(project_id)
        if snapshot is None:
            _log.info("index.build %s: nothing canonical in %s yet", command.command_id, project_id)
            return None
        held = index.meta()
        if held is None or held.generation < snapshot.generation:
            held = index.build(snapshot.generation, snapshot.documents)
            _log.info(
                "indexed %s at generation %d (%d documents)",
                project_id,
                held.generation,
                held.documents,
            )
        row = self.status(project_id)
        if not (
            row is not None
            and row.status is IndexState.READY
            and row.generation == held.generation
            and row.documents == held.documents
        ):
            # Also after a crash between the file's commit and this row: the file is
            # ready, only the row has to say so.
            self._mark_ready(project_id, held.generation, held.documents)
        requested = command.payload.generation if isinstance(command.payload, IndexBuild) else None
        if requested is not None and requested > held.generation:
            # The command saw a promotion the source does not show yet: index what is there
            # and come back for the rest.
            return Retry(
                queue_row(_INDEXING_QUEUE, self.settings).retry_delay_s,
                f"{project_id} asks for generation {requested}, "
                f"but the canonical source is at {snapshot.generation}",
            )
        return None

    def _purge(self, command: Command) -> None:
        project_id = command.project_id
        # File first, row second: a crash in between leaves a row that is not purged, so
        # the sweep queues the purge again; the other order could orphan the file.
        removed = self.project_index(project_id).purge()
        with self.store.transaction() as db:
            changed = db.execute(
                "UPDATE project_indexes SET status = 'purged', generation = NULL, documents = 0, "
                "error = '', updated_at_s = ? WHERE project_id = ? AND status != 'purged'",
                (self._now_s(), project_id),
            ).rowcount
        if removed or changed:
            _log.info("purged the index of %s", project_id)

    def _mark_ready(self, project_id: str, generation: int, documents: int) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO project_indexes "
                "(project_id, generation, status, documents, error, attempts, updated_at_s) "
                "VALUES (?, ?, 'ready', ?, '', 0, ?) "
                "ON CONFLICT (project_id) DO UPDATE SET generation = excluded.generation, "
                "status = 'ready', documents = excluded.documents, error = '', attempts = 0, "
                "updated_at_s = excluded.updated_at_s",
                (project_id, generation, documents, self._now_s()),
            )

    def _record_failure(self, command: Command, exc: Exception, delivery: Delivery) -> None:
        """Status failed with the error and one more attempt, in its own transaction (the
        build's own transaction, if any, has rolled back). Generation and documents stay:
        the previous index, if any, still answers searches."""
        error = f"{type(exc).__name__}: {exc}"[:_ERROR_LIMIT]
        try:
            with self.store.transaction() as db:
                db.execute(
                    "INSERT INTO project_indexes "
                    "(project_id, generation, status, documents, error, attempts, updated_at_s) "
                    "VALUES (?, NULL, 'failed', 0, ?, 1, ?) "
                    "ON CONFLICT (project_id) DO UPDATE SET status = 'failed', "
                    "error = excluded.error, attempts = attempts + 1, "
                    "updated_at_s = excluded.updated_at_s",
                    (command.project_id, error, self._now_s()),
                )
        except Exception as record_exc:
            # The original error is the one the queue must see; this one only goes to logs.
            _log.error(
                "cannot record the failure of %s in project_indexes: %s",
                command.command_id,
                record_exc,
            )
            return
        _log.warning(
            "%s of %s failed (delivery %d of %d): %s",
            command.command_type,
            command.project_id,
            delivery.delivered,
            delivery.max_deliveries,
            error,
        )

    # -- helpers ---------------------------------------------------------------------------

    def _now_s(self) -> float:
        return self.clock.now().timestamp()

    def _read(self, sql: str, params: tuple[object, ...]) -> list[sqlite3.Row]:
        # In a transaction: the store's one connection is shared by the process's threads,
        # and a bare read between another thread's BEGIN and COMMIT would see its
        # uncommitted rows. SqliteStore has no public read lock, so this takes its write one.
        with self.store.transaction() as db:
            rows: list[sqlite3.Row] = db.execute(sql, params).fetchall()
        return rows

    def _read_among(self, sql: str, project_ids: Iterable[str] | None) -> list[sqlite3.Row]:
        if project_ids is None:
            return self._read(sql + " ORDER BY project_id", ())
        # One JSON parameter instead of one per ID: no limit on how many IDs are asked about.
        return self._read(
            sql + " AND project_id IN (SELECT value FROM json_each(?)) ORDER BY project_id",
            (json.dumps(list(project_ids)),),
        )


def _status(row: sqlite3.Row) -> IndexStatus:
    return IndexStatus(
        project_id=str(row[0]),
        generation=None if row[1] is None else int(row[1]),
        status=IndexState(row[2]),
        documents=int(row[3]),
        error=str(row[4]),
        attempts=int(row[5]),
        updated_at_s=float(row[6]),
    )
