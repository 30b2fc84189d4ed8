"""The actor runtime: one SQLite file per actor, state and outbox in one transaction.

An actor runs a *decision* (a function of the current state that returns a
:class:`~rhumbatron.domain.transition.Transition`) inside ``BEGIN IMMEDIATE`` … ``COMMIT``: it
applies the patch, appends the facts to the outbox and sets its alarm, all or nothing. A
decision that raises leaves neither state nor outbox row behind.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, ClassVar

from rhumbatron.actors.alarms import ALARM_SCHEMA, AlarmSink, NoAlarmSink, set_alarm
from rhumbatron.actors.due_index import DueIndex
from rhumbatron.actors.outbox import OUTBOX_SCHEMA, append_facts, migrate_outbox
from rhumbatron.actors.storage import (
    open_with_schema,
    schema_version,
    synchronous,
    write_transaction,
)
from rhumbatron.core.clock import Clock, SystemClock
from rhumbatron.core.faults import crash_point
from rhumbatron.core.settings import Settings
from rhumbatron.domain.transition import Delete, Insert, Mutation, Transition, Update, Upsert
from rhumbatron.errors import ActorBusyError, ActorError, DomainError
from rhumbatron.paths import path_under
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN

__all__ = ["Actor", "ActorKind", "ActorRef", "TransactResult"]

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")


class ActorKind(StrEnum):
    """The two actor classes that own an outbox (spec: ProjectRootDO and ResourceShardDO)."""

    PROJECT_ROOT = "project_root"
    RESOURCE_SHARD = "resource_shard"


@dataclass(frozen=True, slots=True, order=True)
class ActorRef:
    """Names one actor: its class, its project and (for shards) its shard number."""

    kind: ActorKind
    project_id: str
    shard: int | None = None

    def __post_init__(self) -> None:
        if not PROJECT_ID_PATTERN.fullmatch(self.project_id):
            raise ActorError(
                f"project id {self.project_id!r} is not valid: use 1-64 letters, digits, "
                "'_' or '-', starting with a letter or digit"
            )
        if (self.kind is ActorKind.RESOURCE_SHARD) != (self.shard is not None):
            raise ActorError(
                f"a {self.kind} actor of {self.project_id!r} cannot have shard {self.shard}: "
                "resource shards have a shard number, project roots do not"
            )
        if self.shard is not None and self.shard < 0:
            raise ActorError(f"actor {self.key} names shard {self.shard}; shards count from 0")

    @property
    def key(self) -> str:
        """``project_root:<project>`` or ``resource_shard:<project>:<NN>``."""
        if self.shard is None:
            return f"{self.kind}:{self.project_id}"
        return f"{self.kind}:{self.project_id}:{self.shard:02d}"

    @classmethod
    def parse(cls, key: str) -> ActorRef:
        """The inverse of :attr:`key`; raises :class:`ActorError` naming a bad key."""
        parts = key.split(":")
        try:
            kind = ActorKind(parts[0])
            if kind is ActorKind.PROJECT_ROOT and len(parts) == 2:
                return cls(kind, parts[1])
            if kind is ActorKind.RESOURCE_SHARD and len(parts) == 3:
                return cls(kind, parts[1], int(parts[2]))
        except ValueError:
            pass
        raise ActorError(
            f"actor key {key!r} is not 'project_root:<project>' or "
            "'resource_shard:<project>:<shard>'"
        )

    @property
    def file_name(self) -> str:
        """``root.sqlite`` or ``shard-<NN>.sqlite``: the file's name in its project's
        directory."""
        return "root.sqlite" if self.shard is None else f"shard-{self.shard:02d}.sqlite"

    def path(self, state_dir: Path) -> Path:
        """``<state>/projects/<project>/root.sqlite`` or ``…/shard-<NN>.sqlite``."""
        return _actor_path(state_dir, self.project_id, self.file_name)


@functools.lru_cache(maxsize=65_536)
def _actor_path(state_dir: Path, project_id: str, file_name: str) -> Path:
    # Checked once per process and actor: scans, the backlog gauge and the lifecycle's reads
    # ask for the same paths again and again, and path_under resolves two paths each time.
    return path_under(state_dir / "projects", project_id, file_name)


@dataclass(frozen=True, slots=True)
class TransactResult:
    """What one actor transaction wrote."""

    transition: Transition
    events_added: int


class Actor:
    """Base of the two actor classes. Subclasses declare their tables and their decisions."""

    KIND: ClassVar[ActorKind]
    #: ``CREATE TABLE IF NOT EXISTS`` statements of the actor's own state.
    STATE_SCHEMA: ClassVar[str] = ""
    #: Tables a patch may touch (the outbox and alarm tables are never patchable).
    STATE_TABLES: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        ref: ActorRef,
        settings: Settings,
        *,
        clock: Clock | None = None,
        alarms: AlarmSink | None = None,
    ) -> None:
        if ref.kind is not self.KIND:
            raise ActorError(f"{type(self).__name__} cannot open a {ref.kind} actor ({ref.key})")
        self.ref = ref
        self.settings = settings
        self.clock = clock or SystemClock()
        self.alarms = alarms or NoAlarmSink()
        self.path = ref.path(settings.state_dir)
        #: Where this actor's alarm is marked for the every-minute scan.
        self.due_index = DueIndex.of_state_dir(settings.state_dir)
        self._connection: sqlite3.Connection | None = None
        # The publisher commits on a worker thread; the lock keeps one transaction of this
        # process on the actor's connection at a time.
        self._lock = threading.RLock()
        self._publish_lock_file: IO[bytes] | None = None
        self._publishing = threading.Lock()

    # -- connection ------------------------------------------------------------------------
    @property
    def connection(self) -> sqlite3.Connection:
        """The actor file's connection, opened (and its schema created) on first use."""
        if self._connection is None:
            self._connection = open_with_schema(
                self.path,
                self.settings,
                OUTBOX_SCHEMA + ALARM_SCHEMA + self.STATE_SCHEMA,
                version=schema_version(OUTBOX_SCHEMA + ALARM_SCHEMA + self.STATE_SCHEMA),
                what="actor",
                new_dirs_to_sync=2,  # the actor file's folder and the projects folder
                migrations=(migrate_outbox,),
            )
        return self._connection

    @property
    def is_open(self) -> bool:
        """Whether this process has the actor's file open now."""
        return self._connection is not None

    def close(self) -> None:
        # Under the lock: the publisher may be committing on a worker thread.
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            if self._publish_lock_file is not None:
                self._publish_lock_file.close()  # releases a lock a crashed caller left
                self._publish_lock_file = None

    # -- the publish lock ------------------------------------------------------------------
    @contextmanager
    def publish_lock(self) -> Iterator[bool]:
        """Try to become this actor's only publisher; yields whether it did (never waits).

        An exclusive ``flock`` on the lock file beside the actor file (``root.sqlite`` is
        locked through ``root.publish.lock``) keeps out publishers of other processes, of
        other handles on the same file (each opens its own lock file) and any other program
        that holds it; a second caller through this same handle is refused too. The lock
        file stays open between calls: under load an alarm fires per event, and creating
        and opening the file each time cost more than the publish of a single row.
        """
        if not self._publishing.acquire(blocking=False):
            yield False
            return
        try:
            handle = self._open_publish_lock()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                acquired = False
            else:
                acquired = True
            try:
                yield acquired
            finally:
                if acquired and not handle.closed:  # close() has already released it
                    fcntl.flock(handle, fcntl.LOCK_UN)
        finally:
            self._publishing.release()

    def _open_publish_lock(self) -> IO[bytes]:
        if self._publish_lock_file is None:
            lock_path = self.path.with_suffix(".publish.lock")
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            self._publish_lock_file = lock_path.open("ab")
        return self._publish_lock_file

    def __enter__(self) -> Actor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transactions ----------------------------------------------------------------------
    @contextmanager
    def write(self, *, durable: bool = True, wait: bool = True) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` on the actor file, under the actor's lock.

        ``durable=False`` (WAL only): the commit writes the WAL without an fsync; the next
        durable commit of the file, or its checkpoint, syncs it with its own. Only for
        writes a crash may lose, such as the publisher's marks (the rows are sent again and
        the duplicate window drops them). ``wait=False``: raise :class:`ActorBusyError` at
        once when another thread or connection holds the file (see :func:`write_transaction`).
        """
        if not self._lock.acquire(blocking=wait):
            raise ActorBusyError(
                f"SQLite file {self.path} is in use by another thread of this process"
            )
        try:
            configured = self.settings.sqlite_synchronous
            light = not durable and self.settings.journal_mode == "WAL"
            with (
                synchronous(self.connection, "NORMAL" if light else configured, restore=configured),
                write_transaction(self.connection, self.path, wait=wait) as connection,
            ):
                yield connection
        finally:
            self._lock.release()

    async def write_lightly(self, body: Callable[[sqlite3.Connection], object]) -> None:
        """Run ``body`` in a transaction a crash may lose (``write(durable=False)``): in WAL on
        the event loop, with no fsync and no thread hop, unless another thread or connection
        holds the file, and then (or in another journal mode, whose commit syncs) on a worker
        thread, so the loop never waits. Should the loop's attempt find the file busy only at
        its commit, it is rolled back and ``body`` runs again on the thread."""

        def on_a_thread() -> None:
            with self.write(durable=False) as connection:
                body(connection)

        if self.settings.journal_mode == "WAL":
            try:
                with self.write(durable=False, wait=False) as connection:
                    body(connection)
                return
            except ActorBusyError:
                pass
        await asyncio.to_thread(on_a_thread)

    def transact(self, decide: Callable[[sqlite3.Connection], Transition]) -> TransactResult:
        """Run ``decide`` on the current state and write its patch and facts atomically."""
        now = self.clock.now()
        alarm_moved = False
        with self.write() as connection:
            transition = decide(connection)
            for mutation in transition.patch:
                try:
                    self._apply(connection, mutation)
                except sqlite3.IntegrityError as exc:
                    raise DomainError(
                        f"{type(self).__name__} {self.ref.key}: the change to {mutation.table} "
                        f"breaks a constraint ({exc}); the key is taken or the row is missing"
                    ) from exc
            added = append_facts(
                connection,
                transition.facts,
                owner=self.KIND.value,
                project_id=self.ref.project_id,
                now_s=now.timestamp(),
                max_event_bytes=self.settings.max_event_bytes,
            )
            if added:
                alarm_moved = set_alarm(connection, now.timestamp())
                if alarm_moved:
                    # Before COMMIT: a marker without its alarm costs the scan a visit; an
                    # alarm without its marker would never be scanned (see due_index).
                    self.due_index.mark(self.ref.key, now.timestamp())
            crash_point(self.settings.crash_at, "in_txn")
        if alarm_moved:
            # After COMMIT: announcing an alarm for rows that may roll back would be a lie.
            # If we die before this line the every-minute scan still finds the alarm.
            self.alarms.alarm_set(self.ref.key, now)
        return TransactResult(transition, added)

    def _apply(self, connection: sqlite3.Connection, mutation: Mutation) -> None:
        if mutation.table not in self.STATE_TABLES:
            raise ActorError(
                f"{type(self).__name__} has no table {mutation.table!r} to patch; "
                f"its tables are {sorted(self.STATE_TABLES)}"
            )
        match mutation:
            case Insert(table=table, row=row, ignore_existing=ignore):
                columns = _columns(row)
                verb = "INSERT OR IGNORE" if ignore else "INSERT"
                connection.execute(
                    f"{verb} INTO {table} ({', '.join(columns)}) "
                    f"VALUES ({', '.join('?' * len(columns))})",
                    [row[c] for c in columns],
                )
            case Upsert(table=table, row=row, key=key):
                columns = _columns(row)
                updates = [c for c in columns if c not in key]
                assignments = ", ".join(f"{c} = excluded.{c}" for c in updates) or None
                conflict = f"ON CONFLICT ({', '.join(_columns(dict.fromkeys(key)))}) " + (
                    f"DO UPDATE SET {assignments}" if assignments else "DO NOTHING"
                )
                connection.execute(
                    f"INSERT INTO {table} ({', '.join(columns)}) "
                    f"VALUES ({', '.join('?' * len(columns))}) {conflict}",
                    [row[c] for c in columns],
                )
            case Update(table=table, key=key, values=values):
                key_columns, value_columns = _columns(key), _columns(values)
                cursor = connection.execute(
                    f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in value_columns)} "
                    f"WHERE {' AND '.join(f'{c} = ?' for c in key_columns)}",
                    [values[c] for c in value_columns] + [key[c] for c in key_columns],
                )
                if cursor.rowcount != 1:
                    raise ActorError(
                        f"update of {table} {dict(key)} matched {cursor.rowcount} rows"
                    )
            case Delete(table=table, where=where):
                columns = _columns(where)
                if not columns:
                    raise ActorError(f"refusing to delete every row of {table}")
                connection.execute(
                    f"DELETE FROM {table} WHERE {' AND '.join(f'{c} = ?' for c in columns)}",
                    [where[c] for c in columns],
                )


def _columns(row: Mapping[str, Any]) -> list[str]:
    columns = list(row)
    for column in columns:
        if not _IDENTIFIER.match(column):
            raise ActorError(f"column name {column!r} is not a plain identifier")
    return columns
