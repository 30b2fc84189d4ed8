"""Writes a crash may lose, and writes that must not wait (issue #16): the publisher's marks
commit without an fsync of their own and, on the event loop, never wait for a held file;
the view store commits without an fsync and syncs its WAL once before the acks.

Real SQLite files in temp dirs; the level a commit runs at is read back with ``PRAGMA``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from fsyncs import fail_fsyncs_of, path_of, record_fsyncs
from rhumbatron.actors.actor import Actor
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import ActorBusyError
from rhumbatron.protocol.ids import stream_index
from rhumbatron.router.handlers import ProjectViewProjector, RunContext
from rhumbatron.router.records import Outcome, Record, RecordOutcome
from rhumbatron.router.view_store import StreamViews
from rhumbatron.runtime.bootstrap import bootstrap

FULL, NORMAL = 2, 1  # what PRAGMA synchronous reads back
BUSY_TIMEOUT_MS = 60_000  # a write that waited for it would run into the test's own limit


def settings_for(tmp_path: Path, journal_mode: str = "WAL") -> Settings:
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url="nats://127.0.0.1:1",
        journal_mode=journal_mode,
        network_filesystem=False,
        sqlite_busy_timeout_ms=BUSY_TIMEOUT_MS,
    )


@pytest.fixture
def actor(tmp_path: Path, clock: ManualClock) -> Iterator[Actor]:
    app = bootstrap(settings_for(tmp_path), clock=clock, alarms=RecordingAlarmSink())
    shard = app.resource_shard("acme-web", change_resource_key("c1"))
    shard.connection.execute("CREATE TABLE IF NOT EXISTS notes (note TEXT)")
    yield shard
    shard.close()


def level(connection: sqlite3.Connection) -> int:
    return int(connection.execute("PRAGMA synchronous").fetchone()[0])


def notes(connection: sqlite3.Connection) -> list[str]:
    return [str(r[0]) for r in connection.execute("SELECT note FROM notes ORDER BY rowid")]


@contextlib.contextmanager
def held(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding ``path``'s write lock (another process's writer); the
    caller may let go sooner with its ``COMMIT``."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()


@pytest.fixture
def holder(actor: Actor) -> Iterator[sqlite3.Connection]:
    """Another connection holding the actor file's write lock."""
    with held(actor.path) as other:
        yield other


def test_a_light_write_commits_without_an_fsync_and_the_next_write_is_durable_again(
    actor: Actor,
) -> None:
    # GIVEN an actor file in WAL, its transactions committing at FULL (an fsync each)
    assert level(actor.connection) == FULL
    # WHEN a write a crash may lose runs, THEN it commits at NORMAL (the WAL, no fsync)
    with actor.write(durable=False) as db:
        db.execute("INSERT INTO notes VALUES ('light')")
        assert level(db) == NORMAL
    # AND the actor's next transaction is durable again, and both are there
    with actor.write() as db:
        db.execute("INSERT INTO notes VALUES ('durable')")
        assert level(db) == FULL
    assert notes(actor.connection) == ["light", "durable"]


def test_a_light_write_that_fails_leaves_the_actor_durable(actor: Actor) -> None:
    with pytest.raises(RuntimeError), actor.write(durable=False) as db:
        db.execute("INSERT INTO notes VALUES ('lost')")
        raise RuntimeError("the body fails")
    assert level(actor.connection) == FULL and notes(actor.connection) == []


def test_out_of_wal_a_light_write_is_as_durable_as_any(tmp_path: Path, clock: ManualClock) -> None:
    # GIVEN an actor file in the DELETE journal mode (EFS), whose commits sync the file
    app = bootstrap(settings_for(tmp_path, "DELETE"), clock=clock, alarms=RecordingAlarmSink())
    shard = app.resource_shard("acme-web", change_resource_key("c1"))
    try:
        # WHEN a write a crash may lose runs, THEN it commits at FULL all the same: without
        # a WAL, nothing later would sync it
        with shard.write(durable=False) as db:
            assert level(db) == FULL
    finally:
        shard.close()


def test_a_write_that_must_not_wait_is_refused_at_once_while_another_connection_writes(
    actor: Actor, holder: sqlite3.Connection
) -> None:
    # GIVEN the actor file's write lock held by another connection, and a 60 s busy timeout
    # WHEN a write that must not wait starts, THEN it is refused at once, naming the file
    with pytest.raises(ActorBusyError, match=str(actor.path)), actor.write(wait=False) as db:
        db.execute("INSERT INTO notes VALUES ('never')")
    # AND the connection waits its busy timeout again for every other write
    assert actor.connection.execute("PRAGMA busy_timeout").fetchone()[0] == BUSY_TIMEOUT_MS
    # AND once the lock is let go, the write goes through
    holder.execute("COMMIT")
    with actor.write(wait=False) as db:
        db.execute("INSERT INTO notes VALUES ('now')")
    assert notes(actor.connection) == ["now"]


def test_a_write_that_must_not_wait_is_refused_at_once_while_another_thread_writes(
    actor: Actor,
) -> None:
    # GIVEN a worker thread of this process inside a transaction on the actor
    inside, done = threading.Event(), threading.Event()

    def write_and_hold() -> None:
        with actor.write() as db:
            db.execute("INSERT INTO notes VALUES ('thread')")
            inside.set()
            done.wait(10)

    worker = threading.Thread(target=write_and_hold)
    worker.start()
    try:
        assert inside.wait(10)
        # WHEN a write that must not wait starts, THEN it is refused at once
        with (
            pytest.raises(ActorBusyError, match="in use by another thread"),
            actor.write(wait=False),
        ):
            pass
    finally:
        done.set()
        worker.join(10)
    assert notes(actor.connection) == ["thread"]


async def test_a_light_write_on_a_held_file_waits_on_a_worker_thread_not_the_event_loop(
    actor: Actor, holder: sqlite3.Connection
) -> None:
    # GIVEN the actor file's write lock held by another connection
    ran_on: list[str] = []

    levels: list[int] = []

    def body(db: sqlite3.Connection) -> None:
        ran_on.append(threading.current_thread().name)
        levels.append(level(db))
        db.execute("INSERT INTO notes VALUES ('marks')")

    # WHEN a light write is asked for on the event loop
    writing = asyncio.create_task(actor.write_lightly(body))
    # THEN the loop keeps serving while it waits for the file
    for _ in range(20):
        await asyncio.sleep(0)
    assert not writing.done() and ran_on == []
    # AND once the lock is let go, it commits, on a worker thread, once, with no fsync
    holder.execute("COMMIT")
    await asyncio.wait_for(writing, 10)
    assert len(ran_on) == 1 and ran_on[0] != threading.main_thread().name
    assert levels == [NORMAL]
    assert notes(actor.connection) == ["marks"] and level(actor.connection) == FULL


async def test_a_light_write_on_a_free_file_runs_on_the_event_loop(actor: Actor) -> None:
    ran_on: list[str] = []

    def body(db: sqlite3.Connection) -> None:
        ran_on.append(threading.current_thread().name)
        db.execute("INSERT INTO notes VALUES ('marks')")

    await actor.write_lightly(body)
    assert ran_on == [threading.main_thread().name] and notes(actor.connection) == ["marks"]


@pytest.mark.parametrize(("journal_mode", "expected"), [("WAL", NORMAL), ("DELETE", FULL)])
def test_the_view_store_syncs_later_only_in_wal(
    tmp_path: Path, journal_mode: str, expected: int
) -> None:
    # GIVEN a stream's view store in each journal mode
    store = StreamViews(settings_for(tmp_path, journal_mode), 3)
    try:
        # THEN in WAL its commits write the WAL without an fsync (sync() makes them durable
        # before the acks); in DELETE each commit syncs the file, and sync() has nothing to do
        assert level(store.connection) == expected
        assert store.syncs_later is (journal_mode == "WAL")
        store.sync()
    finally:
        store.close()


# -- the projector's one commit per fetch, on a view file another writer holds --------------

CALLER = Caller("acme", "system:test", correlation_id="corr-light")
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def fetch_of_two_projects() -> list[Record]:
    """A fetch's records: two projects of one stream, a task's first two facts each."""
    records: list[Record] = []
    for project in ("acme-web", "acme-mobile"):
        ctx = FactContext(CALLER, project, NOW)
        for verb, payload in (("ready", {}), ("assigned", {"agentId": "a1"})):
            event = ctx.fact(f"task.{verb}", payload, change_id=f"c-{project}", task_id="t1")
            records.append(Record(cast(Any, None), len(records) + 1, event.event_id, event, None))
    return records


@pytest.fixture
def projector(tmp_path: Path) -> Iterator[ProjectViewProjector]:
    """A projector whose writes wait at most a second for a held file."""
    settings = settings_for(tmp_path).model_copy(update={"sqlite_busy_timeout_ms": 1_000})
    projector = ProjectViewProjector(settings)
    yield projector
    projector.close()


def held_store(store: StreamViews) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    """:func:`held` on ``store``'s file, made with its schema first."""
    _ = store.connection
    return held(store.path)


async def test_a_fetch_on_a_held_view_file_commits_on_a_worker_thread_once_it_is_let_go(
    projector: ProjectViewProjector,
) -> None:
    # GIVEN a fetch of two projects, and their stream's view file held by another writer
    records = fetch_of_two_projects()
    stream = stream_index("acme-web")
    assert stream_index("acme-mobile") == stream
    store = projector.views(stream)
    run = RunContext(stream, now_s=1_700_000_000.0, apply_calls_left=15)
    with held_store(store) as holder:
        # WHEN the projector handles the fetch
        handling = asyncio.create_task(projector.handle(records, run))
        started = time.monotonic()
        await asyncio.sleep(0)  # it tries on the loop, is refused at once, and waits on a thread
        # THEN the event loop is free meanwhile: the fetch waits for the file off the loop,
        #   and the loop never waited for it (a second, the busy timeout, is far off)
        assert time.monotonic() - started < 0.5
        assert not handling.done()
        holder.execute("COMMIT")  # the other writer is done
        outcomes = await asyncio.wait_for(handling, 10)
    # AND once the file is let go the fetch commits, claims and views with the run's time
    assert {o.outcome for o in outcomes.values()} == {Outcome.APPLIED}
    applied_at = store.connection.execute("SELECT DISTINCT applied_at_s FROM project_events")
    assert [row[0] for row in applied_at] == [run.now_s]
    assert [projector.view(p).snapshot()["eventsApplied"] for p in ("acme-web", "acme-mobile")] == [
        2,
        2,
    ]


async def test_a_fetch_on_a_view_file_held_past_the_busy_timeout_is_given_back_to_retry(
    projector: ProjectViewProjector,
) -> None:
    # GIVEN a fetch, and its stream's view file held by another writer for longer than the
    #   second a write waits
    records = fetch_of_two_projects()
    store = projector.views(stream_index("acme-web"))
    run = RunContext(stream_index("acme-web"), now_s=1_700_000_000.0, apply_calls_left=15)
    with held_store(store):
        # WHEN the projector handles the fetch
        started = time.monotonic()
        outcomes = await projector.handle(records, run)
        waited_s = time.monotonic() - started
    # THEN it waited the busy timeout for the file, then gave every record back to retry,
    #   saying why and what to do (nothing is the events' fault, nothing committed)
    assert waited_s >= 1.0
    busy = (
        f"SQLite file {store.path} is held by another writer past the busy timeout (cannot "
        "start a transaction); retry later, or raise RHUMBATRON_SQLITE_BUSY_TIMEOUT_MS"
    )
    assert outcomes == {r.key: RecordOutcome.retry(busy) for r in records}
    assert store.connection.execute("SELECT COUNT(*) FROM project_events").fetchone()[0] == 0


async def test_a_fetch_whose_wal_cannot_be_synced_still_fails_the_event_at_fault(
    projector: ProjectViewProjector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a fetch of two projects whose view refuses one event (a stand-in for any event
    #   the view cannot take), and a disk that fails the sync of the view store's WAL
    records = fetch_of_two_projects()
    bad = records[1]
    store = projector.views(stream_index("acme-web"))
    assert bad.event is not None and bad.event.event_type == "task.assigned"
    store.connection.execute(  # acme-web's task.assigned, the only row with an agent
        "CREATE TRIGGER refuse BEFORE INSERT ON view_tasks WHEN NEW.change_id = 'c-acme-web' "
        "AND NEW.agent_id IS NOT NULL BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    fail_fsyncs_of(monkeypatch, f"{store.path}-wal")
    run = RunContext(stream_index("acme-web"), now_s=1_700_000_000.0, apply_calls_left=15)
    # WHEN the projector handles the fetch
    outcomes = await projector.handle(records, run)
    # THEN the events it applied are given back to retry (their commit may be lost), and the
    #   event at fault still fails, for its failure to count
    unsynced = RecordOutcome.retry(
        f"cannot make the views of {store.path} durable: [Errno 5] Input/output error"
    )
    assert outcomes[bad.key].outcome is Outcome.FAILED
    assert "refused" in (outcomes[bad.key].reason or "")
    assert {k: o for k, o in outcomes.items() if k != bad.key} == {
        r.key: unsynced for r in records if r is not bad
    }


def test_one_projects_apply_on_a_held_view_file_waits_the_busy_timeout(
    projector: ProjectViewProjector,
) -> None:
    # GIVEN one project's records, and its stream's view file held by another writer
    view = projector.view("acme-web")
    records = [
        r for r in fetch_of_two_projects() if r.event and r.event.project_id == view.project_id
    ]
    with held_store(view.store):
        # WHEN they are applied (a caller on a worker thread, which may wait)
        started = time.monotonic()
        with pytest.raises(ActorBusyError, match="RHUMBATRON_SQLITE_BUSY_TIMEOUT_MS"):
            view.apply_delta(records, now_s=1_700_000_000.0)
        # THEN the apply waited the busy timeout (a second) for the file before giving up
        assert time.monotonic() - started >= 1.0


def test_a_new_wal_has_its_directory_entry_synced_once_and_the_wal_alone_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a stream's new view store, and every sync of the process recorded by path
    store = StreamViews(settings_for(tmp_path), 3)
    synced = record_fsyncs(monkeypatch)
    try:
        # WHEN it opens (creating its WAL) and syncs twice, as two fetches do
        _ = store.connection
        opened = len(synced)
        store.sync()
        store.sync()
    finally:
        store.close()
    # THEN opening made the new file's directory entry durable, then its new WAL with the
    #   WAL's entry; each fetch's sync after that is one sync of the WAL alone
    wal, folder = f"{store.path}-wal", str(store.path.parent)
    assert synced[:opened] == [folder, wal, folder]
    assert synced[opened:] == [wal, wal]


@pytest.mark.skipif(not hasattr(os, "fdatasync"), reason="the platform has no fdatasync")
def test_a_fetchs_sync_makes_the_wals_data_durable_not_its_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an open stream's view store, and the process's fdatasyncs recorded by path
    store = StreamViews(settings_for(tmp_path), 3)
    _ = store.connection
    data_synced: list[str] = []
    fdatasync = os.fdatasync

    def recorded(descriptor: int) -> None:
        data_synced.append(path_of(descriptor))
        fdatasync(descriptor)

    monkeypatch.setattr(os, "fdatasync", recorded)
    try:
        # WHEN a fetch's commit is made durable
        store.sync()
    finally:
        store.close()
    # THEN its WAL was synced by fdatasync (its data and size), as SQLite syncs its own: an
    #   fsync would also journal the WAL's new times at every fetch, which no reader needs
    assert data_synced == [f"{store.path}-wal"]
