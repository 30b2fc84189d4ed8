"""The view store against a real nats-server: rebuilt from the log, by the command and after
the faults that lose it (issue #16): a view file deleted under a warm router, a state
directory that lost its views (rebuilt by the operator), and a rebuild while the projector
runs. After each, the views equal a rebuild from the stream."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsyncs import fail_fsyncs_of, path_of, watch_syncs
from project_roots import restore_project_roots
from rhumbatron.cli import main
from rhumbatron.core.clock import ManualClock
from rhumbatron.errors import MessagingError, ReplayError
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name, stream_index
from rhumbatron.router.view_store import view_store_path
from rhumbatron.router.views import rebuild_views
from rhumbatron.runtime.bootstrap import Rhumbatron

from . import test_router
from .test_router import PROJECTOR, AppFactory, lifecycle, projects_on_stream, publish

pytestmark = pytest.mark.integration

make_app = test_router.make_app  # the router tests' runtimes, on this test's servers

STREAM = 2


def view_state(app: Rhumbatron, project_id: str) -> dict[str, Any]:
    """What a reader of the project's view sees, the feed's apply times left out."""
    view = app.router().projector.view(project_id)
    snapshot = view.snapshot(latest=100)
    rows = view.connection.execute(
        "SELECT event_id, stream_seq, event_type FROM project_events WHERE project_id = ? "
        "ORDER BY stream_seq",
        (project_id,),
    )
    return {**snapshot, "feed": [tuple(r) for r in rows]}


def is_the_wal_of(app: Rhumbatron, descriptor: int) -> bool:
    """Whether ``descriptor`` (the one a sync was given) is the WAL of the stream's views."""
    wal = f"{view_store_path(app.settings, STREAM)}-wal"
    return path_of(descriptor) == wal


async def history_on_stream(app: Rhumbatron, clock: ManualClock, count: int = 2) -> list[str]:
    projects = projects_on_stream(STREAM, count)
    for project in projects:
        await publish(app, lifecycle(project, clock.now()))
    return projects


async def rebuilt_elsewhere(
    make_app: AppFactory, tmp_path: Path, app: Rhumbatron, projects: list[str]
) -> dict[str, dict[str, Any]]:
    """The views a fresh state directory rebuilds from the stream: what the views must equal."""
    fresh = await make_app(state_dir=tmp_path / "reference")
    restore_project_roots(app, fresh, projects)
    await rebuild_views(fresh.router(), stream=STREAM)
    return {p: view_state(fresh, p) for p in projects}


async def test_a_view_file_deleted_under_a_warm_router_is_rebuilt_from_the_stream(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN two projects' histories applied by a warm router
    app = await make_app()
    projects = await history_on_stream(app, clock)
    await app.router().nudge(STREAM)
    before = {p: view_state(app, p) for p in projects}
    assert all(state["eventsApplied"] == 6 for state in before.values())

    # WHEN the stream's view file is deleted under it, and more events come and are nudged
    view_store_path(app.settings, STREAM).unlink()
    more = lifecycle(projects[0], clock.now(), change="chg-2")[1:3]
    await publish(app, more)
    with caplog.at_level(logging.WARNING, logger="rhumbatron.router.handlers"):
        await app.router().nudge(STREAM)

    # THEN it says so, naming the stream
    said = [r.getMessage() for r in caplog.records if r.name == "rhumbatron.router.handlers"]
    assert said == [f"rebuilding the views of stream {STREAM} from the log"]
    # AND the views were rebuilt from the stream before the new events were applied: every
    # event is in its view once
    after = {p: view_state(app, p) for p in projects}
    assert after[projects[1]] == before[projects[1]]
    assert after[projects[0]]["eventsApplied"] == 8
    assert len(after[projects[0]]["feed"]) == 8
    assert not app.router().projector.views(STREAM).lost


async def test_a_lost_view_file_rebuilds_its_own_stream_and_leaves_the_others_alone(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN histories on two streams, applied by a warm router an hour ago
    app = await make_app()
    other = (STREAM + 3) % EVENT_STREAM_COUNT
    (elsewhere,) = projects_on_stream(other, 1)
    await history_on_stream(app, clock)
    await publish(app, lifecycle(elsewhere, clock.now()))
    await app.router().nudge(STREAM)
    await app.router().nudge(other)
    other_store = app.router().projector.views(other)

    def feed_elsewhere() -> list[tuple[Any, ...]]:
        """The other stream's feed with the apply times its retention counts from."""
        rows = other_store.connection.execute(
            "SELECT event_id, stream_seq, applied_at_s FROM project_events ORDER BY stream_seq"
        )
        return [tuple(r) for r in rows]

    applied_elsewhere = feed_elsewhere()
    assert len(applied_elsewhere) == 6
    clock.advance(3600)

    # WHEN the first stream's view file is deleted under it, and that stream is nudged
    view_store_path(app.settings, STREAM).unlink()
    await app.router().nudge(STREAM)

    # THEN only that stream was rebuilt: the other stream's feed keeps its rows as they were
    #   applied, an hour ago (a rebuild would apply them again now and restart their
    #   retention), and its projector has nothing to apply again
    assert feed_elsewhere() == applied_elsewhere
    js = (await app.nats()).jetstream()
    info = await js.consumer_info(event_stream_name(other), PROJECTOR.value)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


def held_wal_syncs(
    app: Rhumbatron, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Every sync of the stream's view WAL held until the test sets the second event; the
    first is set when one starts."""
    syncing, synced = threading.Event(), threading.Event()

    def hold(sync: Callable[[int], None]) -> Callable[[int], None]:
        def held_sync(descriptor: int) -> None:
            if is_the_wal_of(app, descriptor):
                syncing.set()
                synced.wait(10)
            sync(descriptor)

        return held_sync

    watch_syncs(monkeypatch, hold)
    return syncing, synced


async def test_a_fetch_is_visible_at_its_commit_and_acked_only_once_its_wal_is_synced(
    make_app: AppFactory, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two projects' histories on the stream, its view store open, and every sync of
    #   the store's WAL held until the test lets it go (the sync the store calls)
    app = await make_app()
    projects = await history_on_stream(app, clock)
    store = app.router().projector.views(STREAM)
    _ = store.connection
    syncing, synced = held_wal_syncs(app, monkeypatch)
    # WHEN the stream is nudged, and its projector's commit is being synced
    nudge = asyncio.create_task(app.router().nudge(STREAM))
    assert await asyncio.to_thread(syncing.wait, 10), "no sync of the view store's WAL"
    # THEN the views already show the fetch (a view is visible at its commit)
    assert [view_state(app, p)["eventsApplied"] for p in projects] == [6, 6]
    # AND JetStream still holds every record of it unacknowledged
    js = (await app.nats()).jetstream()
    info = await js.consumer_info(event_stream_name(STREAM), PROJECTOR.value)
    assert (info.num_ack_pending, info.ack_floor.stream_seq) == (12, 0)
    # AND once the WAL is synced, they are acknowledged
    synced.set()
    await asyncio.wait_for(nudge, 15)
    info = await js.consumer_info(event_stream_name(STREAM), PROJECTOR.value)
    assert (info.num_ack_pending, info.num_pending, info.ack_floor.stream_seq) == (0, 0, 12)


@pytest.mark.parametrize("in_a_turn", [False, True], ids=["a nudge", "a turn's run"])
async def test_a_fetch_whose_wal_cannot_be_synced_is_retried_not_acked(
    make_app: AppFactory,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    in_a_turn: bool,
) -> None:
    # GIVEN two projects' histories on the stream, its view store open, and an fsync of
    #   the store's WAL that fails (an I/O error of the disk)
    app = await make_app()
    await history_on_stream(app, clock)
    router = app.router()
    _ = router.projector.views(STREAM).connection
    fail_fsyncs_of(monkeypatch, f"{view_store_path(app.settings, STREAM)}-wal")
    # WHEN the stream is nudged (or a run of a nudge's turn ends, and then the turn)
    with caplog.at_level(logging.WARNING):
        report = await router.nudge(STREAM, settle=not in_a_turn)
        if in_a_turn:
            await router.release_held(STREAM)
    # THEN nothing of the fetch is acknowledged: every record waits for its redelivery
    js = (await app.nats()).jetstream()
    info = await js.consumer_info(event_stream_name(STREAM), PROJECTOR.value)
    assert info.ack_floor.stream_seq == 0 and info.num_ack_pending == 12
    # AND the run's report counts them as retried, not applied
    projector = report.subscriptions[PROJECTOR.value]
    assert (projector.applied, projector.retried) == (0, 12)
    # AND the warning names the store that could not be made durable
    assert f"cannot make the views of {view_store_path(app.settings, STREAM)} durable" in (
        caplog.text
    )


async def test_a_run_of_a_turn_ends_before_its_sync_and_its_acks_go_out_after_it(
    make_app: AppFactory, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two projects' histories on the stream, its view store open, and every sync of
    #   the store's WAL held until the test lets it go
    app = await make_app()
    projects = await history_on_stream(app, clock)
    router = app.router()
    _ = router.projector.views(STREAM).connection
    syncing, synced = held_wal_syncs(app, monkeypatch)
    # WHEN a run of a nudge's turn, whose next run may follow, ends (settle=False)
    report = await asyncio.wait_for(router.nudge(STREAM, settle=False), 5)
    # THEN it did not wait for the disk: its commit is being synced, the views show it,
    #   and its report counts what it applied
    assert syncing.is_set()
    assert [view_state(app, p)["eventsApplied"] for p in projects] == [6, 6]
    assert report.subscriptions[PROJECTOR.value].applied == 12
    # AND JetStream holds every record of it unacknowledged while the sync runs
    js = (await app.nats()).jetstream()
    info = await js.consumer_info(event_stream_name(STREAM), PROJECTOR.value)
    assert (info.num_ack_pending, info.ack_floor.stream_seq) == (12, 0)
    # AND the turn's end waits for the sync, then acknowledges them
    ending = asyncio.create_task(router.release_held(STREAM))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not ending.done()
    synced.set()
    await asyncio.wait_for(ending, 15)
    info = await js.consumer_info(event_stream_name(STREAM), PROJECTOR.value)
    assert (info.num_ack_pending, info.num_pending, info.ack_floor.stream_seq) == (0, 0, 12)


async def test_the_claims_of_more_events_than_one_query_takes_are_all_found(
    make_app: AppFactory,
) -> None:
    # GIVEN 1,000 events the projector has claimed (dead letters' marks), more than the 400
    #   one query asks about, and 5 it has not
    app = await make_app()
    store = app.router().projector.views(STREAM)
    claimed = [f"evt_{n:032x}" for n in range(1_000)]
    store.mark_processed(claimed, now_s=0.0)
    unclaimed = [f"evt_{n:032x}" for n in range(1_000, 1_005)]
    # WHEN their claims are read, in one call
    states = store.claim_states([*unclaimed, *claimed])
    # THEN every claimed one is found, to the last, and none of the others
    assert set(states) == set(claimed)
    assert set(states.values()) == {("done", None)}


async def test_a_lost_view_file_another_reader_noticed_first_is_still_rebuilt(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN two projects' histories applied by a warm router, whose view file is deleted and
    #   found missing by another of its readers first (the store opens a fresh file then)
    app = await make_app()
    projects = await history_on_stream(app, clock)
    await app.router().nudge(STREAM)
    before = view_state(app, projects[1])
    view_store_path(app.settings, STREAM).unlink()
    store = app.router().projector.views(STREAM)
    assert not store.check_file() and store.lost
    # WHEN more events come and the stream is nudged
    await publish(app, lifecycle(projects[0], clock.now(), change="chg-2")[1:3])
    await app.router().nudge(STREAM)
    # THEN the views were rebuilt from the stream all the same
    assert view_state(app, projects[0])["eventsApplied"] == 8
    assert view_state(app, projects[1]) == before
    assert not store.lost


async def test_a_lost_view_file_with_no_rebuild_wired_is_said_and_filled_from_then_on(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN two projects' histories applied by a warm router built with no rebuild of lost
    #   views (the composition root wires one; a router may be built without)
    app = await make_app()
    app.router().rebuild_lost_views = None
    projects = await history_on_stream(app, clock)
    await app.router().nudge(STREAM)

    # WHEN the stream's view file is deleted under it, and more events come and are nudged
    view_store_path(app.settings, STREAM).unlink()
    more = lifecycle(projects[0], clock.now(), change="chg-2")[1:3]
    await publish(app, more)
    with caplog.at_level(logging.ERROR, logger="rhumbatron.router.handlers"):
        await app.router().nudge(STREAM)
        await app.router().nudge(STREAM)

    # THEN it says so once, naming the stream, and the views hold only what came since
    said = [r.getMessage() for r in caplog.records if r.name == "rhumbatron.router.handlers"]
    assert said == [f"the views of stream {STREAM} were lost and no rebuild is wired"]
    assert view_state(app, projects[0])["eventsApplied"] == 2
    assert not app.router().projector.views(STREAM).lost


async def test_a_state_directory_that_lost_its_views_gets_them_back_by_a_rebuild(
    make_app: AppFactory, clock: ManualClock, settings: Any
) -> None:
    # GIVEN a router that applied two projects' histories, then stopped
    first = await make_app()
    projects = await history_on_stream(first, clock)
    await first.router().nudge(STREAM)
    before = {p: view_state(first, p) for p in projects}
    await first.close()

    # WHEN the views directory is gone, a new process starts, and the operator rebuilds
    shutil.rmtree(settings.state_dir / "views")
    second = await make_app()
    result = await rebuild_views(second.router())

    # THEN every stream was read, and the views are back as they were
    assert result.streams == list(range(8)) and result.failed == 0
    assert {p: view_state(second, p) for p in projects} == before


async def test_a_rebuild_while_the_projector_runs_applies_each_event_once(
    make_app: AppFactory, clock: ManualClock, tmp_path: Path
) -> None:
    # GIVEN two projects' histories applied, and more events waiting; fetches of 4 records
    app = await make_app(router_fetch_max_records=4)
    projects = await history_on_stream(app, clock)
    await app.router().drain()
    await publish(app, lifecycle(projects[1], clock.now(), change="chg-2"))

    # WHEN one project's view is rebuilt while nudges apply the rest
    rebuild = asyncio.create_task(rebuild_views(app.router(), project_id=projects[1]))
    for _ in range(5):
        await app.router().nudge(STREAM)
    result = await rebuild
    await app.router().nudge(STREAM)

    # THEN the rebuild forgot that project's claims and applied its events again, and both
    # views equal the views a fresh directory rebuilds from the stream
    assert result.forgotten_claims >= 6  # at least the history applied before it started
    assert result.failed == 0
    reference = await rebuilt_elsewhere(make_app, tmp_path, app, projects)
    assert {p: view_state(app, p) for p in projects} == reference


async def test_the_views_rebuild_command_rebuilds_one_project_and_reports_it(
    make_app: AppFactory, clock: ManualClock, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two projects applied, one of whose view rows were damaged by hand
    app = await make_app()
    projects = await history_on_stream(app, clock)
    await app.router().nudge(STREAM)
    before = view_state(app, projects[0])
    app.router().projector.views(STREAM).connection.execute(
        "UPDATE view_tasks SET status = 'garbled' WHERE project_id = ?", (projects[0],)
    )
    await app.close()

    # WHEN the operator runs `rhumbatron views rebuild --project` on the same state
    for name, value in {
        "RHUMBATRON_STATE_DIR": str(settings.state_dir),
        "RHUMBATRON_NATS_URL": settings.nats_url,
        "RHUMBATRON_S3_ENDPOINT_URL": app.settings.s3_endpoint_url or "",
        "RHUMBATRON_EVIDENCE_BUCKET": app.settings.evidence_bucket,
    }.items():
        monkeypatch.setenv(name, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = await asyncio.to_thread(main, ["views", "rebuild", "--project", projects[0]])

    # THEN it succeeded, showed its progress, said what it did, and the view is whole again
    assert status == 0, out.getvalue()
    assert "EVENTS_02 rebuilt (1/1): 6 events applied" in err.getvalue()
    report = json.loads(out.getvalue())
    assert report["projectId"] == projects[0]
    assert (report["forgottenClaims"], report["applied"], report["failed"]) == (6, 6, 0)
    again = await make_app()
    assert view_state(again, projects[0]) == before
    assert stream_index(projects[0]) == STREAM


def test_the_views_rebuild_command_refuses_a_bad_project_id(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["views", "rebuild", "--project", "../etc"]) == 3
    assert "--project '../etc' is not a project ID" in capsys.readouterr().err


async def test_a_rebuild_reads_what_the_stream_dropped_from_the_archive_then_the_rest(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN two projects' histories, a minute apart, applied and archived by the router;
    # then the stream loses the first project's six events (its max age, or a purge)
    app = await make_app()
    first, second = projects_on_stream(STREAM, 2)
    await publish(app, lifecycle(first, clock.now()))
    clock.advance(minutes=1)
    await publish(app, lifecycle(second, clock.now())[:3])
    clock.advance(minutes=1)
    await publish(app, lifecycle(second, clock.now())[3:])
    # (a history archived on another stream, and a clock past them all)
    await publish(app, lifecycle(projects_on_stream(5, 1)[0], clock.now()))
    clock.advance(minutes=1)
    await app.router().drain()
    before = {p: view_state(app, p) for p in (first, second)}
    js = (await app.nats()).jetstream()
    await js.purge_stream(event_stream_name(STREAM), seq=7)
    assert (await js.stream_info(event_stream_name(STREAM))).state.first_seq == 7

    # WHEN the stream's views are rebuilt
    result = await rebuild_views(app.router(), stream=STREAM)

    # THEN the second project's events came from the stream, then the first's from the
    # archive: its events up to the first the stream holds, that one's minute included
    # (three of the second's, already applied); each applied once, nothing missing, and the
    # views as they were
    stream, archive = result.replays
    assert (stream.source, stream.applied, stream.first_seq) == ("stream", 6, 7)
    assert (archive.source, archive.stream_index) == ("archive", STREAM)
    assert (archive.scanned, archive.applied, archive.already_applied) == (9, 6, 3)
    assert (result.forgotten_claims, result.gaps, result.failed) == (12, [], 0)
    assert result.as_json() | {"errors": []} == {
        "projectId": None,
        "streams": [event_stream_name(STREAM)],
        "forgottenClaims": 12,
        "scanned": 15,
        "applied": 12,
        "alreadyApplied": 3,
        "retried": 0,
        "failed": 0,
        "errors": [],
        "gaps": [],
    }
    # (the archive keeps the events, not their stream positions: the first project's feed
    # rows read position 0, "not known", where they read 1 to 6)
    after = {p: view_state(app, p) for p in (first, second)}
    assert after[second] == before[second]
    unplaced = {
        **before[first],
        "feed": [(event_id, 0, kind) for event_id, _, kind in before[first]["feed"]],
        "latestEvents": [e | {"streamSeq": 0} for e in before[first]["latestEvents"]],
    }
    assert after[first] == unplaced


async def test_a_rebuild_whose_archive_cannot_be_read_names_the_gap_and_keeps_the_stream(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a stream that lost its first project's events, and an archive that cannot be
    # read (its bucket is gone)
    app = await make_app()
    first, second = projects_on_stream(STREAM, 2)
    await publish(app, lifecycle(first, clock.now()))
    clock.advance(minutes=1)
    await publish(app, lifecycle(second, clock.now()))
    await app.router().drain()
    before = view_state(app, second)
    js = (await app.nats()).jetstream()
    await js.purge_stream(event_stream_name(STREAM), seq=7)
    s3 = app.s3()
    bucket = app.settings.evidence_bucket
    for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=item["Key"])
    s3.delete_bucket(Bucket=bucket)

    # WHEN the stream's views are rebuilt
    result = await rebuild_views(app.router(), stream=STREAM)

    # THEN the rebuild says which part of the history it could not read, and why, in its
    # report and its log; the views hold what the stream holds
    [gap] = result.gaps
    assert gap.startswith(f"{event_stream_name(STREAM)} before sequence 7: the archive could")
    assert bucket in gap
    assert result.as_json()["gaps"] == [gap]
    assert f"views rebuild: {gap}" in [r.getMessage() for r in caplog.records]
    [stream] = result.replays
    assert (stream.applied, stream.first_seq) == (6, 7)
    assert view_state(app, second) == before
    assert view_state(app, first)["eventsApplied"] == 0


async def test_a_stream_that_lost_every_event_is_rebuilt_from_the_archive_alone(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a project whose one event was applied and archived, and then dropped by the
    # stream: it holds no message, and its next sequence is 2
    app = await make_app()
    (project,) = projects_on_stream(STREAM, 1)
    await publish(app, lifecycle(project, clock.now())[:1])
    await app.router().drain()
    js = (await app.nats()).jetstream()
    await js.purge_stream(event_stream_name(STREAM))
    state = (await js.stream_info(event_stream_name(STREAM))).state
    assert (state.messages, state.last_seq, state.first_seq) == (0, 1, 2)

    # WHEN its views are rebuilt
    result = await rebuild_views(app.router(), stream=STREAM)

    # THEN the archive alone gave the event back
    assert [(r.source, r.applied) for r in result.replays] == [("archive", 1)]
    assert view_state(app, project)["name"] == f"Project {project}"


async def test_a_rebuild_of_every_stream_adds_up_what_it_forgot_and_shows_each_streams_progress(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN two projects' histories applied, on streams 2 and 5, each stream whole
    app = await make_app()
    for stream in (2, 5):
        await publish(app, lifecycle(projects_on_stream(stream, 1)[0], clock.now()))
    await app.router().drain()
    heard: list[tuple[int, int | None, str]] = []

    # WHEN every stream's views are rebuilt
    result = await rebuild_views(
        app.router(), progress=lambda done, total, line="": heard.append((done, total, line))
    )

    # THEN both streams' claims were forgotten and their events applied again, from the
    # streams alone (they hold everything: no archive is read), and the progress named each
    # stream with what it applied
    assert (result.forgotten_claims, result.applied) == (12, 12)
    assert [(r.source, r.stream_index) for r in result.replays] == [("stream", 2), ("stream", 5)]
    assert [(done, total) for done, total, _ in heard] == [(n, 8) for n in range(1, 9)]
    assert heard[2][2] == "EVENTS_02 rebuilt (3/8): 6 events applied"
    assert heard[5][2] == "EVENTS_05 rebuilt (6/8): 6 events applied"
    assert heard[6][2] == "EVENTS_06 rebuilt (7/8): 0 events applied"


async def test_a_rebuild_is_refused_for_a_bad_request_and_names_a_missing_stream(
    make_app: AppFactory,
) -> None:
    app = await make_app()
    router = app.router()
    with pytest.raises(ReplayError, match=r"^give a project or a stream to rebuild, not both$"):
        await rebuild_views(router, project_id="acme-web", stream=1)
    for bad in (-1, 8):
        with pytest.raises(ReplayError, match=rf"^stream {bad} is outside 0\.\.7$"):
            await rebuild_views(router, stream=bad)
    assert (await rebuild_views(router, stream=0)).streams == [0]  # the first stream is one
    assert (await rebuild_views(router, stream=7)).streams == [7]  # and so is the last
    await (await app.nats()).jetstream().delete_stream(event_stream_name(3))
    with pytest.raises(MessagingError, match=r"^stream EVENTS_03 does not exist"):
        await rebuild_views(router, stream=3)
