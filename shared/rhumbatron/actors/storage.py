"""Opening actor SQLite files safely, on a local disk or on EFS.

SQLite's WAL needs shared memory, which a network filesystem (EFS, NFS) cannot give: WAL on
such a path corrupts files. :func:`check_journal_mode` refuses that combination at start-up.
Every write transaction starts with ``BEGIN IMMEDIATE`` so one writer holds a file at a time
and a second one waits up to the busy timeout, then gets :class:`ActorBusyError`.

Every write of every SQLite file the system keeps goes through :func:`write_transaction`, so
:func:`observe_commits` sees each durable commit (the benchmarks count commits per event and
per file with it; with no observer it costs one truth test per commit).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rhumbatron.core.settings import Settings
from rhumbatron.errors import ActorBusyError, ActorError, UnsafeStorageError

__all__ = [
    "NETWORK_FILESYSTEMS",
    "SqliteStore",
    "check_journal_mode",
    "fsync_directory",
    "is_network_filesystem",
    "observe_commits",
    "open_database",
    "open_with_schema",
    "sqlite_error",
    "write_transaction",
]

# Called with the file's path after each COMMIT that wrote a row (a transaction that only read
# under the write lock commits nothing to disk). A list, not a set: observers are few and
# their order is their registration's.
_commit_observers: list[Callable[[Path], None]] = []


def observe_commits(observer: Callable[[Path], None]) -> Callable[[], None]:
    """Call ``observer(path)`` after every write transaction that changed a row, in any
    thread; returns the function that stops it. The observer must be quick and must not
    raise: it runs after the COMMIT, inside the writer's call."""
    _commit_observers.append(observer)

    def stop() -> None:
        if observer in _commit_observers:
            _commit_observers.remove(observer)

    return stop


NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "efs", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "lustre", "glusterfs"}
)


def _mount_type(path: Path, mounts_file: Path) -> str | None:
    target = str(path.resolve())
    best: tuple[int, str] | None = None
    try:
        lines = mounts_file.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount_point = parts[1].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        # The longest mount point holding the path; of mounts on the same point, the last
        # listed, which is mounted over the others and the one the path reaches.
        if inside and (best is None or len(mount_point) >= best[0]):
            best = (len(mount_point), parts[2])
    return best[1] if best else None


def is_network_filesystem(path: Path, mounts_file: Path = Path("/proc/mounts")) -> bool:
    """Whether ``path`` lives on a network filesystem, read from the mount table: where the
    path leads once its links are followed (a link to a directory not made yet on a network
    mount is on it: the files will be created there), even before it exists."""
    return (_mount_type(path, mounts_file) or "") in NETWORK_FILESYSTEMS


def check_journal_mode(settings: Settings, mounts_file: Path = Path("/proc/mounts")) -> None:
    """Refuse WAL on a network filesystem (RELIABILITY F21), naming the settings to change;
    unless ``RHUMBATRON_NETWORK_FILESYSTEM`` says, the state directory's mount in
    ``mounts_file`` decides."""
    network = settings.network_filesystem
    if network is None:
        network = is_network_filesystem(settings.state_dir, mounts_file)
    if network and settings.journal_mode == "WAL":
        raise UnsafeStorageError(
            f"RHUMBATRON_JOURNAL_MODE=WAL but RHUMBATRON_STATE_DIR={settings.state_dir} is on a "
            "network filesystem, where SQLite's WAL corrupts data; set "
            "RHUMBATRON_JOURNAL_MODE=DELETE"
        )


def open_database(path: Path, settings: Settings) -> sqlite3.Connection:
    """Open (creating if needed) one SQLite file (an actor's, a store's) with the configured
    journal and sync modes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the write lock is
        # taken at the start of the transaction, not half-way through it.
        connection = sqlite3.connect(
            path,
            isolation_level=None,
            timeout=settings.sqlite_busy_timeout_ms / 1000,
            check_same_thread=False,
        )
    except sqlite3.Error as exc:
        raise sqlite_error(exc, path, "cannot open the file") from exc
    try:
        _set_journal_mode(connection, settings)
        connection.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        connection.execute(f"PRAGMA busy_timeout={settings.sqlite_busy_timeout_ms}")
        connection.execute("PRAGMA foreign_keys=ON")
        # Statement and SAVEPOINT journals (a transaction's own undo, never read after a
        # crash) in memory: past 64 KiB SQLite spills them to a temporary file, a pwrite per
        # page changed. The view store's one SAVEPOINT per fetch spilled on every fetch.
        connection.execute("PRAGMA temp_store=MEMORY")
    except sqlite3.Error as exc:
        connection.close()  # a half-opened connection must not keep the file
        raise sqlite_error(exc, path, "cannot open the file") from exc
    connection.row_factory = sqlite3.Row
    return connection


def _set_journal_mode(connection: sqlite3.Connection, settings: Settings) -> None:
    """Switch the journal mode, waiting out a second opener of the same new file.

    Switching a brand-new file to WAL takes an exclusive lock without calling the busy
    handler: two processes opening the same new file at once (two routers starting cold)
    would otherwise fail at once with "database is locked".
    """
    deadline = time.monotonic() + settings.sqlite_busy_timeout_ms / 1000
    while True:
        try:
            connection.execute(f"PRAGMA journal_mode={settings.journal_mode}")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)  # the other opener holds the lock for one schema write


@contextmanager
def write_transaction(
    connection: sqlite3.Connection, path: Path, *, wait: bool = True
) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``; roll back on any exception.

    A second writer waits up to the busy timeout and then raises :class:`ActorBusyError`;
    with ``wait=False`` it raises at once (a caller on the event loop, which must not block,
    then waits on a worker thread). A process killed inside the block leaves the file as it
    was before ``BEGIN`` (SQLite's journal makes the transaction atomic).
    """
    try:
        if wait:
            connection.execute("BEGIN IMMEDIATE")
        else:
            _begin_without_waiting(connection)
    except sqlite3.OperationalError as exc:
        raise sqlite_error(exc, path, "cannot start a transaction") from exc
    changes_before = connection.total_changes
    try:
        yield connection
    except BaseException:
        # SQLite may already have rolled back by itself (disk full, I/O error): a second
        # ROLLBACK would then raise and hide the real error.
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    try:
        connection.execute("COMMIT")
    except sqlite3.Error as exc:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise sqlite_error(exc, path, "commit failed") from exc
    if _commit_observers and connection.total_changes != changes_before:
        for observer in _commit_observers:
            observer(path)


def _begin_without_waiting(connection: sqlite3.Connection) -> None:
    (waits_ms,) = connection.execute("PRAGMA busy_timeout").fetchone()
    connection.execute("PRAGMA busy_timeout=0")
    try:
        connection.execute("BEGIN IMMEDIATE")
    finally:
        connection.execute(f"PRAGMA busy_timeout={int(waits_ms)}")


@contextmanager
def synchronous(
    connection: sqlite3.Connection, level: str, *, restore: str
) -> Iterator[sqlite3.Connection]:
    """The transactions of the block commit at ``PRAGMA synchronous=level``, then ``restore``.

    Outside any transaction, and under the lock that keeps the connection's other users out:
    the level is the connection's, not the transaction's."""
    if level == restore:
        yield connection
        return
    connection.execute(f"PRAGMA synchronous={level}")
    try:
        yield connection
    finally:
        connection.execute(f"PRAGMA synchronous={restore}")


def schema_version(schema: str) -> int:
    """The ``user_version`` a file with ``schema`` carries: a digest of the schema's text, so
    a file created by an older schema (a table added since) gets the new ``CREATE … IF NOT
    EXISTS`` statements the next time it is opened. A column added to an existing table
    needs a migration of its own; none has been needed before the first release."""
    return zlib.crc32(" ".join(schema.split()).encode("utf-8")) & 0x7FFFFFFF


def open_with_schema(
    path: Path,
    settings: Settings,
    schema: str,
    *,
    version: int,
    what: str,
    new_dirs_to_sync: int = 1,
    migrations: Sequence[Callable[[sqlite3.Connection], None]] = (),
) -> sqlite3.Connection:
    """Open ``path`` and create its ``schema`` once, marked by ``PRAGMA user_version``.

    Only a file without the schema takes a write lock: reading an existing file (the
    every-minute alarm scan) must not queue behind its writers. A new file's directory entry
    is fsynced (and that many parent folders' entries), so a crash cannot lose the file.
    ``migrations`` run after the schema, in its transaction, whenever the version changes:
    each brings a table of an older shape up to date and does nothing to a current one.
    """
    is_new = not path.exists()
    connection = open_database(path, settings)
    try:
        if connection.execute("PRAGMA user_version").fetchone()[0] != version:
            # executescript commits an open transaction first: the script brings its own,
            # and leaves it open for the migrations; the version is set as the last step.
            connection.executescript(f"BEGIN IMMEDIATE; {schema}")
            for migrate in migrations:
                migrate(connection)
            connection.execute(f"PRAGMA user_version = {version}")
            connection.execute("COMMIT")
    except sqlite3.Error as exc:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        connection.close()
        raise sqlite_error(exc, path, f"cannot open the {what} file") from exc
    if is_new:
        folder = path.parent
        for _ in range(new_dirs_to_sync):
            fsync_directory(folder)
            folder = folder.parent
    return connection


def sqlite_error(exc: sqlite3.Error, path: Path, doing: str) -> ActorError:
    """The Rhumbatron error for a SQLite failure on one of its files (an actor's, a view
    store, the product database): busy, full, or other."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return ActorBusyError(
            f"SQLite file {path} is held by another writer past the busy timeout ({doing}); "
            "retry later, or raise RHUMBATRON_SQLITE_BUSY_TIMEOUT_MS"
        )
    if "full" in text:
        return ActorError(f"{doing} on {path}: the disk is full ({text}); free space and retry")
    return ActorError(f"{doing} on {path}: {text}")


def fsync_directory(path: Path) -> None:
    """Make a new file's directory entry durable (a crash must not lose a new actor file)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class SqliteStore:
    """One SQLite file that is not an actor (router state, the product database).

    Opened on first use with the configured journal mode; ``schema`` (``CREATE … IF NOT
    EXISTS`` statements) is applied once, under a write lock, and marked by ``user_version``.
    """

    def __init__(
        self,
        path: Path,
        settings: Settings,
        schema: str,
        migrations: Sequence[Callable[[sqlite3.Connection], None]] = (),
    ) -> None:
        self.path = path
        self.settings = settings
        self._schema = schema
        self._migrations = tuple(migrations)
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.RLock()

    @property
    def connection(self) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = open_with_schema(
                self.path,
                self.settings,
                self._schema,
                version=schema_version(self._schema),
                what="store",
                migrations=self._migrations,
            )
        return self._connection

    @contextmanager
    def transaction(self, *, wait: bool = True) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` on this file (see :func:`write_transaction`).

        One connection serves the process; the router may use it from a worker thread, so
        a lock keeps two transactions of one process off it at the same time. ``wait=False``
        raises :class:`ActorBusyError` at once when that lock or the file's is held.
        """
        if not self._lock.acquire(blocking=wait):
            raise ActorBusyError(
                f"SQLite file {self.path} is in use by another thread of this process"
            )
        try:
            with write_transaction(self.connection, self.path, wait=wait) as connection:
                yield connection
        finally:
            self._lock.release()

    def close(self) -> None:
        # Under the lock: a worker thread may be inside a transaction on this connection.
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
