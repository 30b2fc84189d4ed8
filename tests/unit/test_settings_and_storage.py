"""Settings carry the specification's numbers; storage refuses unsafe journal modes and opens
actor files the way the settings say (issue item 5; RELIABILITY F21)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import zlib
from pathlib import Path

import pytest

from fsyncs import record_fsyncs
from rhumbatron.actors.storage import (
    check_journal_mode,
    is_network_filesystem,
    observe_commits,
    open_database,
    open_with_schema,
    schema_version,
    sqlite_error,
    write_transaction,
)
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import ActorBusyError, ActorError, ConfigurationError, UnsafeStorageError
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT
from rhumbatron.runtime.bootstrap import bootstrap


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RHUMBATRON_* variable from the caller's shell leaks into the defaults."""

    for name in list(os.environ):
        if name.startswith("RHUMBATRON_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_defaults_are_the_specifications_numbers() -> None:
    # GIVEN no configuration at all
    settings = load_settings()
    # THEN every default is the spec's number
    assert EVENT_STREAM_COUNT == 8  # eight event streams
    assert settings.publish_max_rows_per_project == 100  # max 100 rows per project
    assert settings.event_stream_max_age_days == 7  # retention 7 days
    assert settings.command_stream_max_age_days == 14  # a command stays at most 14 days
    assert settings.duplicate_window_s == 2 * 3600  # 2-hour duplicate window
    assert settings.outbox_backoff_initial_s == 1  # backoff 1 s, 2 s, 4 s ...
    assert settings.outbox_backoff_max_s == 5 * 60  # ... max 5 min
    assert settings.outbox_backoff_jitter == 0.2  # DECISIONS: ±20 %
    assert settings.outbox_max_attempts == 10  # 10th failed attempt -> failed
    assert settings.alarm_max_fires_per_day == 2_000  # AlarmGuard cap
    assert settings.outbox_published_retention_days == 7  # DECISIONS: kept 7 days
    assert settings.journal_mode == "WAL"  # WAL locally
    assert settings.state_dir == Path(".rhumbatron/state")
    assert settings.producer_bindings is None  # all eight streams bound
    assert settings.publish_concurrency == 16
    assert settings.evidence_bucket == "rhumbatron-evidence"  # the archive's bucket


def test_settings_are_frozen() -> None:
    settings = load_settings(state_dir=Path("/tmp/x"))
    with pytest.raises(Exception, match="frozen"):
        settings.journal_mode = "DELETE"  # type: ignore[misc]


def test_bad_keyword_value_raises_configuration_error_naming_the_variable_and_value() -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(publish_max_rows_per_project=0)
    assert "RHUMBATRON_PUBLISH_MAX_ROWS_PER_PROJECT=0" in str(caught.value)


def test_bad_environment_value_raises_configuration_error_naming_the_variable_and_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a journal mode SQLite supports but we do not
    monkeypatch.setenv("RHUMBATRON_JOURNAL_MODE", "TRUNCATE")
    # WHEN settings load
    # THEN the error names the variable and the value
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert "RHUMBATRON_JOURNAL_MODE='TRUNCATE'" in str(caught.value)


def test_environment_variables_configure_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHUMBATRON_JOURNAL_MODE", "DELETE")
    monkeypatch.setenv("RHUMBATRON_ALARM_MAX_FIRES_PER_DAY", "7")
    settings = load_settings()
    assert settings.journal_mode == "DELETE"
    assert settings.alarm_max_fires_per_day == 7


def test_producer_binding_outside_the_eight_streams_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="RHUMBATRON_PRODUCER_BINDINGS"):
        load_settings(producer_bindings=(0, 8))


def test_duplicate_window_longer_than_stream_retention_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="duplicate_window_s"):
        load_settings(duplicate_window_s=8 * 86_400)


def test_wal_on_a_network_filesystem_is_refused_naming_the_settings(tmp_path: Path) -> None:
    # GIVEN WAL on a path configured as a network filesystem
    settings = load_settings(state_dir=tmp_path, journal_mode="WAL", network_filesystem=True)
    # WHEN start-up checks the journal mode
    # THEN it refuses, naming the setting and what to set instead
    with pytest.raises(UnsafeStorageError) as caught:
        check_journal_mode(settings)
    assert str(caught.value) == (
        f"RHUMBATRON_JOURNAL_MODE=WAL but RHUMBATRON_STATE_DIR={tmp_path} is on a network "
        "filesystem, where SQLite's WAL corrupts data; set RHUMBATRON_JOURNAL_MODE=DELETE"
    )
    assert isinstance(caught.value, ConfigurationError)


@pytest.mark.parametrize(("kind", "refused"), [("nfs4", True), ("ext4", False)])
def test_unless_told_the_check_reads_the_state_directorys_mount(
    tmp_path: Path, kind: str, refused: bool
) -> None:
    # GIVEN WAL, no RHUMBATRON_NETWORK_FILESYSTEM, and a mount table that puts the state
    #   directory on an NFS mount (or a local disk)
    state_dir = tmp_path.resolve() / "state"
    mounts = tmp_path / "mounts"
    mounts.write_text(
        f"overlay / overlay rw 0 0\nserver:/export {tmp_path.resolve()} {kind} rw 0 0\n"
    )
    settings = load_settings(state_dir=state_dir, journal_mode="WAL")
    assert settings.network_filesystem is None
    # WHEN start-up checks the journal mode, THEN it refuses WAL on the NFS mount only
    if refused:
        with pytest.raises(UnsafeStorageError, match="is on a network filesystem"):
            check_journal_mode(settings, mounts)
    else:
        check_journal_mode(settings, mounts)


def test_delete_journal_on_a_network_filesystem_is_allowed(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, journal_mode="DELETE", network_filesystem=True)
    check_journal_mode(settings)  # no error


def test_wal_on_a_local_filesystem_is_allowed(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, journal_mode="WAL", network_filesystem=False)
    check_journal_mode(settings)


def test_bootstrap_refuses_wal_on_a_network_filesystem(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, journal_mode="WAL", network_filesystem=True)
    with pytest.raises(UnsafeStorageError):
        bootstrap(settings)


def test_network_filesystem_is_detected_from_the_mount_table(tmp_path: Path) -> None:
    # GIVEN a mount table where <tmp>/efs is NFS (as EFS mounts are) and / is ext4
    efs = (tmp_path / "efs").resolve()
    efs.mkdir()
    (tmp_path / "efs-local").mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        f"fs-1234.efs.eu-west-1.amazonaws.com:/ {efs} nfs4 rw,vers=4.1 0 0\n"
    )
    # THEN a path under the mount (even one not created yet) is on a network filesystem
    assert is_network_filesystem(efs / "projects" / "p1", mounts)
    # AND a sibling whose name merely starts the same is not
    assert not is_network_filesystem(tmp_path / "efs-local", mounts)


@pytest.mark.parametrize(("mode", "reported"), [("WAL", "wal"), ("DELETE", "delete")])
def test_open_database_sets_the_configured_journal_mode(
    tmp_path: Path, mode: str, reported: str
) -> None:
    # GIVEN settings with a journal mode
    settings = load_settings(state_dir=tmp_path, journal_mode=mode)
    # WHEN an actor file is opened
    connection = open_database(tmp_path / "a" / "actor.sqlite", settings)
    # THEN SQLite runs in that mode, with full sync and the busy timeout, and keeps a
    #   transaction's statement and SAVEPOINT journals in memory, never in a temporary file
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == reported
        assert connection.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert connection.execute("PRAGMA busy_timeout").fetchone()[0] == 5_000
        assert connection.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY
    finally:
        connection.close()
    # AND the journal mode survives reopening with plain sqlite3 (WAL is persistent)
    if mode == "WAL":
        plain = sqlite3.connect(tmp_path / "a" / "actor.sqlite")
        assert plain.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        plain.close()


def test_a_schemas_version_is_the_crc32_of_its_text_with_whitespace_collapsed() -> None:
    # The version is kept in every file's user_version: files written by earlier releases
    # are recognised only while it is computed the same way.
    schema = "CREATE TABLE IF NOT EXISTS t (\n    x INTEGER,\n    y TEXT\n);"
    expected = zlib.crc32(b"CREATE TABLE IF NOT EXISTS t ( x INTEGER, y TEXT );") & 0x7FFFFFFF
    assert schema_version(schema) == expected
    assert schema_version("  CREATE TABLE IF NOT EXISTS t (x INTEGER,\ty TEXT );") != expected
    # a table added is a new version; every version fits SQLite's signed 32-bit user_version
    assert schema_version(schema + " CREATE TABLE u (z);") != expected
    assert all(0 <= schema_version(f"CREATE TABLE t{i} (x)") < 2**31 for i in range(200))


def test_a_second_writer_gets_actor_busy_error_after_the_busy_timeout(tmp_path: Path) -> None:
    # GIVEN one connection holding the write lock of an actor file
    settings: Settings = load_settings(state_dir=tmp_path, sqlite_busy_timeout_ms=0)
    path = tmp_path / "actor.sqlite"
    first = open_database(path, settings)
    second = open_database(path, settings)
    try:
        # WHEN a second writer starts a transaction
        # THEN it is refused with ActorBusyError (one writer per file at a time)
        with (
            write_transaction(first, path),
            pytest.raises(ActorBusyError, match="RHUMBATRON_SQLITE_BUSY_TIMEOUT_MS"),
            write_transaction(second, path),
        ):
            pass
    finally:
        first.close()
        second.close()


def test_opening_a_file_another_connection_holds_gives_up_after_the_busy_timeout(
    tmp_path: Path,
) -> None:
    # GIVEN a rollback-journal file another connection holds exclusively, and a 100 ms
    #   busy timeout (SQLite's own default wait is 5 s)
    path = tmp_path / "held.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("CREATE TABLE t (x INTEGER)")
    settings = load_settings(state_dir=tmp_path, journal_mode="WAL", sqlite_busy_timeout_ms=100)
    try:
        # WHEN it is opened for WAL
        started = time.monotonic()
        with pytest.raises(ActorBusyError, match="RHUMBATRON_SQLITE_BUSY_TIMEOUT_MS"):
            open_database(path, settings)
        waited_s = time.monotonic() - started
    finally:
        holder.close()
    # THEN it gave up after about the configured wait, not SQLite's default of 5 s
    assert 0.1 <= waited_s < 2.5


def test_a_file_sqlite_cannot_open_is_named_with_sqlites_reason(tmp_path: Path) -> None:
    # GIVEN a folder where the file should be
    taken = tmp_path / "actor.sqlite"
    taken.mkdir()
    # WHEN it is opened, THEN the error names the path and SQLite's reason
    with pytest.raises(ActorError) as refused:
        open_database(taken, load_settings(state_dir=tmp_path))
    assert str(refused.value) == f"cannot open the file on {taken}: unable to open database file"


def test_write_transaction_rolls_back_when_the_block_raises(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    path = tmp_path / "actor.sqlite"
    connection = open_database(path, settings)
    connection.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(RuntimeError), write_transaction(connection, path) as db:
        db.execute("INSERT INTO t VALUES (1)")
        raise RuntimeError("boom")
    assert connection.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 0
    connection.close()


def test_commit_observers_see_each_commit_that_wrote_and_nothing_else(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    path = tmp_path / "actor.sqlite"
    connection = open_database(path, settings)
    connection.execute("CREATE TABLE t (x INTEGER)")
    seen: list[Path] = []
    stop = observe_commits(seen.append)
    with write_transaction(connection, path) as db:
        db.execute("INSERT INTO t VALUES (1)")
    with write_transaction(connection, path) as db:  # read under the lock: nothing synced
        db.execute("SELECT COUNT(*) FROM t").fetchone()
    with pytest.raises(RuntimeError), write_transaction(connection, path) as db:
        db.execute("INSERT INTO t VALUES (2)")
        raise RuntimeError("rolled back")
    assert seen == [path]
    stop()
    with write_transaction(connection, path) as db:
        db.execute("INSERT INTO t VALUES (3)")
    assert seen == [path]
    connection.close()


def test_a_schema_that_fails_to_apply_rolls_back_and_names_the_file(tmp_path: Path) -> None:
    # GIVEN a schema whose migration fails part-way (after its table was created)
    settings = load_settings(state_dir=tmp_path, network_filesystem=False)
    target = tmp_path / "broken.sqlite"

    def failing_migration(connection: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("no such column: gone")

    # WHEN the file is opened, THEN the error names the file, what was being done and why
    with pytest.raises(ActorError) as refused:
        open_with_schema(
            target,
            settings,
            "CREATE TABLE IF NOT EXISTS t (x INTEGER);",
            version=7,
            what="test",
            migrations=(failing_migration,),
        )
    assert str(refused.value) == f"cannot open the test file on {target}: no such column: gone"
    # AND nothing of the schema stayed: no table, no version
    with contextlib.closing(sqlite3.connect(target)) as check:
        assert check.execute("SELECT name FROM sqlite_master").fetchall() == []
        assert check.execute("PRAGMA user_version").fetchone()[0] == 0


def test_a_new_files_folder_entry_is_made_durable_and_an_existing_file_costs_no_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a record of what os.fsync is asked to make durable (the real fsync still runs)
    synced = record_fsyncs(monkeypatch)
    settings = load_settings(state_dir=tmp_path, network_filesystem=False)
    folder = tmp_path.resolve() / "projects" / "p1"
    schema = "CREATE TABLE IF NOT EXISTS t (x INTEGER);"
    # WHEN a new file is made, THEN its folder's entry is fsynced, and that folder's only
    open_with_schema(folder / "root.sqlite", settings, schema, version=1, what="test").close()
    assert [p for p in synced if Path(p).is_dir()] == [str(folder)]
    # WHEN it is opened again, THEN no folder is fsynced
    synced.clear()
    open_with_schema(folder / "root.sqlite", settings, schema, version=1, what="test").close()
    assert [p for p in synced if Path(p).is_dir()] == []


def test_two_openers_of_the_same_new_file_both_get_wal(tmp_path: Path) -> None:
    """Switching a brand-new file to WAL does not call the busy handler; a second opener at
    the same moment (two routers starting cold) must wait, not fail "database is locked"."""
    import threading

    from rhumbatron.actors.storage import open_with_schema

    settings = load_settings(state_dir=tmp_path, journal_mode="WAL", network_filesystem=False)
    schema = "CREATE TABLE IF NOT EXISTS t (x INTEGER);"
    errors: list[BaseException] = []

    def open_it(target: Path, gate: threading.Barrier) -> None:
        gate.wait()
        try:
            connection = open_with_schema(target, settings, schema, version=1, what="test")
            assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            connection.close()
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    # 200 pairs: the race is won often enough that a retry-less opener fails every run.
    for attempt in range(200):
        barrier = threading.Barrier(2)
        target = tmp_path / f"race-{attempt}.sqlite"
        threads = [threading.Thread(target=open_it, args=(target, barrier)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


def test_a_queues_concurrency_is_a_setting_over_the_table_and_names_a_bad_queue(
    tmp_path: Path,
) -> None:
    from rhumbatron.messaging.queue_consumer import queue_row
    from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS

    sized = load_settings(state_dir=tmp_path, queue_concurrency={"agent-wakeups": 8})
    assert queue_row("agent-wakeups", sized).concurrency == 8
    assert queue_row("integration", sized) == QUEUE_CONSUMERS["integration"]
    assert queue_row("agent-wakeups", load_settings(state_dir=tmp_path)).concurrency == 2
    with pytest.raises(ConfigurationError, match=r"unknown queue\(s\) agent-wakeup;"):
        load_settings(state_dir=tmp_path, queue_concurrency={"agent-wakeup": 8})
    with pytest.raises(ConfigurationError, match="at least 1 handler"):
        load_settings(state_dir=tmp_path, queue_concurrency={"indexing": 0})


def test_sqlite_failures_become_errors_that_say_what_to_do() -> None:
    path = Path("/state/projects/p1/root.sqlite")
    for text in ("database is locked", "database is busy"):
        busy = sqlite_error(sqlite3.OperationalError(text), path, "writing")
        assert isinstance(busy, ActorBusyError)
        assert str(busy) == (
            f"SQLite file {path} is held by another writer past the busy timeout (writing); "
            "retry later, or raise RHUMBATRON_SQLITE_BUSY_TIMEOUT_MS"
        )
    full = sqlite_error(sqlite3.OperationalError("database or disk is full"), path, "writing")
    assert type(full) is ActorError
    assert str(full) == (
        f"writing on {path}: the disk is full (database or disk is full); free space and retry"
    )
    other = sqlite_error(sqlite3.DatabaseError("file is not a database"), path, "opening")
    assert (type(other), str(other)) == (ActorError, f"opening on {path}: file is not a database")


def test_a_wal_switch_held_off_by_another_opener_tries_again_within_milliseconds(
    tmp_path: Path,
) -> None:
    import threading

    from rhumbatron.actors.storage import _set_journal_mode

    settings = load_settings(state_dir=tmp_path, journal_mode="WAL", network_filesystem=False)
    # GIVEN a new file another connection is writing (a second opener's schema write)
    path = tmp_path / "new.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    # (no busy handler, as for a new file's switch to WAL: each refusal comes at once)
    opener = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
    attempts: list[float] = []
    second_attempt = threading.Event()

    def traced(statement: str) -> None:
        if statement.startswith("PRAGMA journal_mode"):
            attempts.append(time.monotonic())
            if len(attempts) == 2:  # the first was refused: the holder may let go now
                second_attempt.set()

    opener.set_trace_callback(traced)
    took: list[float] = []

    def switch() -> None:
        started = time.monotonic()
        _set_journal_mode(opener, settings)
        took.append(time.monotonic() - started)

    # WHEN the switch runs while the file is held, and the holder lets go once the switch
    #   has been refused and is trying again
    worker = threading.Thread(target=switch)
    worker.start()
    try:
        assert second_attempt.wait(timeout=10), "the switch never tried again"
    finally:
        holder.execute("COMMIT")
        worker.join(timeout=10)
        holder.close()
    # THEN it tried again after milliseconds, not after a second's wait, and got WAL
    assert attempts[1] - attempts[0] < 0.5
    assert took and took[0] < 0.5
    assert opener.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    opener.close()
