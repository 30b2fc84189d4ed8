"""The due-actor index (issue #17, "gauges without scans"): the every-minute scan opens only
the actor files that may have due work, never every file, and no alarm is left unscanned."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
from fractions import Fraction
from pathlib import Path

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink, alarm_due_at
from rhumbatron.actors.due_index import FULL_WALK_EVERY_S, NEVER_DUE_S, DueIndex
from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.publisher import requeue_failed_rows
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.messaging.sender import EventSender
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.testing import MemorySender, RefuseFirstRowOnce, RefusingSender

CALLER = Caller("acme", "system:test", "corr-due-index")


def runtime(tmp_path: Path, clock: ManualClock, sender: EventSender) -> Rhumbatron:
    settings = load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")
    return bootstrap(settings, clock=clock, alarms=RecordingAlarmSink(), sender=sender)


def write_tasks(app: Rhumbatron, project: str, count: int = 1) -> str:
    """``count`` task facts on one change shard of ``project``; the shard's actor key."""
    shard = app.resource_shard(project, change_resource_key("chg-1"))
    facts = tuple(ChangeFact("task.ready", {}, task_id=f"t-{i:04d}") for i in range(count))
    shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=facts))
    return shard.ref.key


def marker(app: Rhumbatron, key: str) -> Path:
    return app.settings.state_dir / "alarms" / key


def marker_at(app: Rhumbatron, key: str) -> Fraction | None:
    """The marker's time, exactly: ``st_mtime_ns / 1e9`` as a float can round above the
    alarm the marker was floored to, and a comparison with the alarm would then fail."""
    try:
        return Fraction(marker(app, key).stat().st_mtime_ns, 10**9)
    except FileNotFoundError:
        return None


async def projects_created_and_published(app: Rhumbatron, count: int) -> list[str]:
    projects = [f"p-{i:03d}" for i in range(count)]
    for project in projects:
        app.project_root(project).create_project(CALLER, name=project)
    await app.close()
    first = await app.fire_due_alarms()
    assert first.full_walk
    assert (first.actors_visited, sum(r.published for r in first.reports)) == (count, count)
    return projects


# --------------------------------------------------------------------------- the index alone


def test_a_marker_only_ever_moves_earlier_when_marked(tmp_path: Path) -> None:
    index = DueIndex(tmp_path / "alarms")
    index.mark("project_root:p1", 1_000.0)
    index.mark("project_root:p1", 2_000.0)  # a later alarm never delays the marker
    assert index.due(999.0) == []
    assert index.due(1_000.0) == ["project_root:p1"]
    index.mark("project_root:p1", 500.0)
    assert index.due(500.0) == ["project_root:p1"]


def test_a_marker_is_a_plain_file_read_and_written_by_its_owner_and_read_by_others(
    tmp_path: Path,
) -> None:
    index = DueIndex(tmp_path / "alarms")
    index.mark("project_root:p1", 1_000.0)
    umask = os.umask(0)
    os.umask(umask)
    mode = (tmp_path / "alarms" / "project_root:p1").stat().st_mode
    assert stat.S_IMODE(mode) == 0o644 & ~umask


def test_a_marker_is_never_later_than_its_alarm_to_the_nanosecond(tmp_path: Path) -> None:
    # At today's epoch a float second times 1e9 rounds to 256 ns; this alarm's rounded product
    # lies 121 ns above it, so a marker taken from that product would be due after its alarm.
    index = DueIndex(tmp_path / "alarms")
    alarm_at = 1767225601.0395324
    index.mark("project_root:p1", alarm_at)
    index.settle("project_root:p2", alarm_at, failed_rows=0)
    for key in ("project_root:p1", "project_root:p2"):
        marked_ns = (tmp_path / "alarms" / key).stat().st_mtime_ns
        assert Fraction(marked_ns, 10**9) <= Fraction(alarm_at) < Fraction(marked_ns + 1, 10**9)
    assert index.due(alarm_at) == ["project_root:p1", "project_root:p2"]


def test_a_visit_settles_the_marker_to_the_alarm_it_read_or_removes_it(tmp_path: Path) -> None:
    index = DueIndex(tmp_path / "alarms")
    index.mark("project_root:p1", 100.0)
    index.settle("project_root:p1", 5_000.0, failed_rows=0)  # only a backoff left: wait for it
    assert index.due(4_999.0) == []
    assert index.due(5_000.0) == ["project_root:p1"]
    index.settle("project_root:p1", None, failed_rows=2)  # failed rows: listed, never due
    assert index.due(NEVER_DUE_S - 1) == []
    assert index.marked() == ["project_root:p1"]
    index.settle("project_root:p1", None, failed_rows=0)
    assert index.due(10**9) == [] and index.marked() == []
    index.settle("project_root:p1", None, failed_rows=0)  # settling twice is harmless


def test_the_index_lists_its_markers_not_its_own_files_and_forgets_twice_harmlessly(
    tmp_path: Path,
) -> None:
    # GIVEN an index that a full walk covered (its own dot file beside the markers)
    index = DueIndex(tmp_path / "alarms")
    index.mark("project_root:p1", 10.0)
    index.mark_complete(0.0)
    # THEN it lists the actor's marker only, and forgetting an actor twice is harmless
    assert index.marked() == ["project_root:p1"]
    index.forget("project_root:p1")
    index.forget("project_root:p1")
    assert index.marked() == []


def test_due_actors_come_longest_due_first(tmp_path: Path) -> None:
    index = DueIndex(tmp_path / "alarms")
    for key, at in (("project_root:b", 30.0), ("project_root:a", 20.0), ("project_root:c", 10.0)):
        index.mark(key, at)
    assert index.due(25.0) == ["project_root:c", "project_root:a"]
    assert index.due(30.0) == ["project_root:c", "project_root:a", "project_root:b"]


def test_a_full_walk_is_due_before_the_first_and_a_day_after_the_last(tmp_path: Path) -> None:
    index = DueIndex(tmp_path / "alarms")
    assert index.needs_full_walk(0.0)
    index.mark_complete(1_000.0)
    assert not index.needs_full_walk(1_000.0 + FULL_WALK_EVERY_S - 1)
    assert index.needs_full_walk(1_000.0 + FULL_WALK_EVERY_S)
    assert FULL_WALK_EVERY_S == 86_400.0


# --------------------------------------------------------------------------- the scan on it


async def test_the_scan_opens_only_the_actors_with_work_not_every_actor_file(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN 40 projects, all published by a first scan, which walks every file once and
    # settles each marker as it goes
    app = runtime(tmp_path, clock, MemorySender())
    projects = await projects_created_and_published(app, 40)
    clock.advance(minutes=1)
    settled = await app.fire_due_alarms()
    assert (settled.full_walk, settled.actors_visited, settled.reports) == (False, 0, [])

    # WHEN two of them write again, in a fresh container
    written = sorted(write_tasks(app, project) for project in projects[:2])
    await app.close()
    clock.advance(minutes=1)
    scan = await app.fire_due_alarms()

    # THEN the scan opens those two files and no other, and publishes their rows
    assert scan.full_walk is False
    assert scan.actors_visited == 2
    assert sorted(r.actor_key for r in scan.reports) == written
    assert all(r.published == 1 for r in scan.reports)
    # AND the next scan has nothing to open at all
    clock.advance(minutes=1)
    assert (await app.fire_due_alarms()).actors_visited == 0
    await app.close()


async def test_a_write_marks_its_actor_due_in_the_same_transaction(
    tmp_path: Path, clock: ManualClock
) -> None:
    app = runtime(tmp_path, clock, MemorySender())
    root = app.project_root("p-one")
    root.create_project(CALLER, name="one")
    alarm = alarm_due_at(root.connection)
    marked = marker_at(app, root.ref.key)
    assert alarm is not None and marked is not None and alarm - 1e-6 < marked <= alarm
    await app.close()


async def test_a_state_directory_from_before_the_index_is_walked_once_and_nothing_is_lost(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN actors with due rows whose state directory has no index (the code before it)
    memory = MemorySender()
    app = runtime(tmp_path, clock, memory)
    for project in ("old-a", "old-b", "old-c"):
        app.project_root(project).create_project(CALLER, name=project)
    await app.close()
    for path in (app.settings.state_dir / "alarms").iterdir():
        path.unlink()
    (app.settings.state_dir / "alarms").rmdir()

    # WHEN the first scan runs
    scan = await app.fire_due_alarms()

    # THEN it walks every actor file, publishes every row, and stamps the index complete
    assert scan.full_walk is True
    assert sum(r.published for r in scan.reports) == len(memory.sent) == 3
    assert not DueIndex.of_state_dir(app.settings.state_dir).needs_full_walk(
        clock.now().timestamp()
    )
    await app.close()


async def test_the_days_full_walk_finds_an_alarm_whose_marker_was_lost(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an indexed state directory, and a write whose marker was lost (a power cut
    # on a local disk can drop a directory entry that was never fsynced)
    memory = MemorySender()
    app = runtime(tmp_path, clock, memory)
    await projects_created_and_published(app, 2)
    key = write_tasks(app, "p-000")
    marker(app, key).unlink()
    await app.close()

    # WHEN scans run within the day, the alarm is not seen
    clock.advance(minutes=1)
    assert (await app.fire_due_alarms()).reports == []
    # THEN the walk a day after the last one finds it and publishes its row
    clock.advance(seconds=FULL_WALK_EVERY_S)
    scan = await app.fire_due_alarms()
    assert scan.full_walk is True
    assert [(r.actor_key, r.published) for r in scan.reports] == [(key, 1)]
    await app.close()


async def test_a_marker_left_by_a_writer_killed_before_its_commit_costs_one_visit(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an indexed state directory, and a marker whose alarm was never committed
    app = runtime(tmp_path, clock, MemorySender())
    await projects_created_and_published(app, 1)
    key = ProjectRoot.ref_for("p-000").key
    app.actors.due_index.mark(key, clock.now().timestamp())

    # WHEN the scan runs twice
    first, second = await app.fire_due_alarms(), await app.fire_due_alarms()

    # THEN the first opens the actor, publishes nothing and drops the marker; the second
    # opens nothing
    assert (first.actors_visited, first.reports) == (1, [])
    assert marker_at(app, key) is None
    assert second.actors_visited == 0
    await app.close()


async def test_a_marker_for_an_actor_with_no_file_or_no_valid_name_creates_nothing(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN markers longest due of all for an actor never created, a shard the project
    # cannot have and a stray file; and, due after them, an actor with a row to publish
    app = runtime(tmp_path, clock, MemorySender())
    await projects_created_and_published(app, 1)
    index = app.actors.due_index
    index.mark("project_root:never-created", 0.0)
    index.mark("resource_shard:p-000:99", 0.0)  # a shard the project cannot have
    (index.root / "stray.txt").touch()
    os.utime(index.root / "stray.txt", ns=(0, 0))
    real = write_tasks(app, "p-000")

    # WHEN the every-minute scan runs
    scan = await app.fire_due_alarms()

    # THEN it visits only the real actor, creates no file for the others, drops their
    # markers, and names each marker that is no actor in a warning
    assert [report.actor_key for report in scan.reports] == [real]
    assert not ProjectRoot.ref_for("never-created").path(app.settings.state_dir).exists()
    assert sorted(p.name for p in index.root.iterdir()) == [".complete"]
    assert sorted(r.getMessage() for r in caplog.records if r.levelname == "WARNING") == [
        "the due-actor index holds 'resource_shard:p-000:99', which is no actor: actor "
        "resource_shard:p-000:99 names shard 99, but projects have 16 shards "
        "(RHUMBATRON_RESOURCE_SHARD_COUNT)",
        "the due-actor index holds 'stray.txt', which is no actor: actor key 'stray.txt' is "
        "not 'project_root:<project>' or 'resource_shard:<project>:<shard>'",
    ]
    await app.close()


async def test_an_actor_waiting_out_a_backoff_is_not_opened_until_its_retry_is_due(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an indexed state directory and an actor whose first row was refused once
    memory = MemorySender()
    app = runtime(tmp_path, clock, RefuseFirstRowOnce(memory))
    app.actors.due_index.mark_complete(clock.now().timestamp())
    write_tasks(app, "loop-p", 3)
    shard = app.resource_shard("loop-p", change_resource_key("chg-1"))
    await app.drain_alarms()
    assert counts_by_state(shard.connection)[RowState.RETRY_WAIT] == 1
    retry_at = alarm_due_at(shard.connection)
    assert retry_at is not None and retry_at > clock.now().timestamp()
    await app.close()

    # WHEN scans run before the retry is due
    first, second = await app.fire_due_alarms(), await app.fire_due_alarms()

    # THEN the first settles the marker at the retry (one visit), and the next opens nothing
    assert (first.actors_visited, first.reports, second.actors_visited) == (1, [], 0)
    marked = marker_at(app, shard.ref.key)
    assert marked is not None and retry_at - 1e-6 < marked <= retry_at
    # AND once the retry is due, the scan opens it and publishes all three rows
    clock.advance(seconds=retry_at - clock.now().timestamp() + 0.001)
    scan = await app.fire_due_alarms()
    assert (scan.actors_visited, [r.published for r in scan.reports]) == (1, [3])
    await app.close()


async def test_an_actor_the_scan_cannot_read_stays_in_the_index(
    tmp_path: Path, clock: ManualClock
) -> None:
    app = runtime(tmp_path, clock, MemorySender())
    await projects_created_and_published(app, 1)
    key = write_tasks(app, "p-000")
    shard_path = app.resource_shard("p-000", change_resource_key("chg-1")).path
    await app.close()
    shard_path.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        shard_path.with_name(shard_path.name + suffix).unlink(missing_ok=True)

    scan = await app.fire_due_alarms()

    assert [r.error is not None for r in scan.reports] == [True]
    assert app.actors.due_index.due(clock.now().timestamp()) == [key]
    await app.close()


# --------------------------------------------------------------------------- the backlog gauge


async def _one_failed_one_pending(
    tmp_path: Path, clock: ManualClock
) -> tuple[Rhumbatron, str, str]:
    """40 published projects; then a row of p-000 refused once with one attempt allowed
    (failed, so no alarm is left) and a row of p-001 written and not yet published."""
    app = runtime(tmp_path, clock, MemorySender())
    await projects_created_and_published(app, 40)
    await app.close()
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", outbox_max_attempts=1
    )
    refusing = bootstrap(
        settings, clock=clock, alarms=RecordingAlarmSink(), sender=RefusingSender()
    )
    failed_key = write_tasks(refusing, "p-000")
    [report] = await refusing.drain_alarms()
    assert report.failed == 1
    await refusing.close()
    pending_key = write_tasks(app, "p-001")
    await app.close()
    return app, failed_key, pending_key


async def test_the_backlog_gauge_opens_only_the_actors_with_open_rows(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN 40 published projects, one actor with a failed row and one with a pending row
    app, failed_key, pending_key = await _one_failed_one_pending(tmp_path, clock)
    # AND every other actor file damaged, so that opening any of them would be logged
    others = [ref for ref in app.actor_refs() if ref.key not in (failed_key, pending_key)]
    assert len(others) == 40
    for ref in others:
        ref.path(app.settings.state_dir).write_bytes(b"not a database" * 100)

    # WHEN the sweep's gauge reads the backlog
    backlog = app.outbox_backlog()

    # THEN it counts both open rows, and opened no other actor file
    assert backlog == {"pending": 1, "retry_wait": 0, "failed": 1}
    assert "cannot read the outbox" not in caplog.text
    assert sorted(DueIndex(app.settings.state_dir / "alarms").marked()) == sorted(
        [failed_key, pending_key]
    )
    await app.close()


async def test_a_failed_row_keeps_its_actor_in_the_index_never_due_until_it_is_requeued(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor whose only open row failed, settled by a scan (its alarm is gone)
    app, failed_key, _ = await _one_failed_one_pending(tmp_path, clock)
    clock.advance(minutes=1)
    await app.fire_due_alarms()
    assert marker_at(app, failed_key) == NEVER_DUE_S
    # THEN the scan never opens it for that, and the gauge still counts its row
    clock.advance(minutes=1)
    assert (await app.fire_due_alarms()).actors_visited == 0
    assert app.outbox_backlog()["failed"] == 1

    # WHEN an operator requeues it and the scan publishes it
    shard = app.resource_shard("p-000", change_resource_key("chg-1"))
    assert requeue_failed_rows(shard) == 1
    await app.close()
    clock.advance(minutes=1)
    assert [r.published for r in (await app.fire_due_alarms()).reports] == [1]

    # THEN its marker is gone with its last open row
    assert marker_at(app, failed_key) is None
    assert app.outbox_backlog() == {"pending": 0, "retry_wait": 0, "failed": 0}
    await app.close()


async def test_a_full_walk_marks_the_failed_rows_of_a_state_directory_from_before_the_index(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a state directory whose index was lost, with a failed row in it
    app, failed_key, pending_key = await _one_failed_one_pending(tmp_path, clock)
    shutil.rmtree(app.settings.state_dir / "alarms")
    # THEN the gauge walks every file until a scan has settled the index
    assert app.outbox_backlog() == {"pending": 1, "retry_wait": 0, "failed": 1}
    clock.advance(minutes=1)
    assert (await app.fire_due_alarms()).full_walk
    # AND after the walk it finds the failed row through the index alone
    assert marker_at(app, failed_key) == NEVER_DUE_S
    assert marker_at(app, pending_key) is None  # published by the walk
    assert app.outbox_backlog() == {"pending": 0, "retry_wait": 0, "failed": 1}
    await app.close()


async def test_the_dashboard_reads_every_actor_file_published_rows_included(
    tmp_path: Path, clock: ManualClock
) -> None:
    app, _, _ = await _one_failed_one_pending(tmp_path, clock)
    backlog = app.outbox_backlog(every_actor=True)
    # 40 project.created, plus the failed and the pending task.ready
    assert backlog == {"pending": 1, "retry_wait": 0, "published": 40, "failed": 1}
    await app.close()


async def test_an_actor_file_the_gauge_cannot_read_is_named_and_the_others_still_count(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN 40 published projects, and the first actor file in the walk's order damaged
    app, _, _ = await _one_failed_one_pending(tmp_path, clock)
    [first, *_] = list(app.actor_refs())
    path = first.path(app.settings.state_dir)
    with contextlib.closing(sqlite3.connect(path)) as db:
        (rows_of_first,) = db.execute("SELECT count(*) FROM outbox").fetchone()
    path.write_bytes(b"not a database" * 100)
    # WHEN the dashboard reads every actor file
    backlog = app.outbox_backlog(every_actor=True)
    # THEN the damaged one is named in an error, and every other actor's rows still count
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"cannot read the outbox of {first.key}: cannot open the file on {path}: "
        "file is not a database"
    ]
    assert sum(backlog.values()) == 40 + 2 - rows_of_first
    await app.close()


async def test_a_row_that_fails_marks_its_actor_even_when_its_marker_was_lost(
    tmp_path: Path, clock: ManualClock
) -> None:
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", outbox_max_attempts=1
    )
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink(), sender=RefusingSender())
    app.actors.due_index.mark_complete(clock.now().timestamp())
    key = write_tasks(app, "p-000")
    marker(app, key).unlink()  # a power cut took the marker's directory entry
    [report] = await app.drain_alarms()
    assert report.failed == 1
    assert marker_at(app, key) == NEVER_DUE_S
    assert app.outbox_backlog()["failed"] == 1
    await app.close()
