"""Replay against a real nats-server, real SQLite files and moto's S3 server: a rewind of a
subscription to a stream sequence or a time, and a replay of an archive range, both through
the ``(consumer, event_id)`` claims (spec: "Replay = rewinding a consumer's cursor"; consumer
effect rows keyed on the event ID, so a rewind replays with zero duplicate effects)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any

import pytest

from project_roots import restore_project_roots
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import MessagingError, NatsUnavailableError, ReplayError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.metrics import MetricBinding, metric_counts
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.router.replay import ReplayReport, ReplaySource, replay_archive, rewind, run_replay
from rhumbatron.router.view_store import view_store_path
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

# The router tests' helpers: the same small project history, sweep minutes and app factory.
from . import test_router as router_tests
from .test_router import START, AppFactory, projects_on_stream, publish, sweep_minute, wakes
from .test_router import lifecycle as history

pytestmark = pytest.mark.integration

# The router tests' app factory (a fixture), registered here under the same name.
make_app = router_tests.make_app

PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR
CAUSAL = Subscription.CAUSAL_ROUTER
ANALYTICS = Subscription.ANALYTICS_PROJECTOR
ARCHIVER = Subscription.AUDIT_ARCHIVER
EAST = timezone(timedelta(hours=5))


def view_rows(app: Rhumbatron, project_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of a project's view in its stream's store, its project column left out: its
    tables and its feed (the projector's claims; the store's ``processed_events`` holds only
    dead letters' marks, of no project)."""
    db = app.router().projector.view(project_id).connection
    tables = ["view_project", "view_changes", "view_tasks", "view_agents", "project_events"]
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for table in tables:
        cursor = db.execute(f"SELECT * FROM {table} WHERE project_id = ?", (project_id,))
        names = [c[0] for c in cursor.description]
        keep = [
            i for i, name in enumerate(names) if name != "project_id" or table == "view_project"
        ]
        rows[table] = sorted(tuple(row[i] for i in keep) for row in cursor)
    return rows


def files_under(path: Path) -> dict[str, int]:
    """Every file under ``path`` with its size: what a dry run must leave as it was."""
    return {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.is_file()}


async def consumer_names(app: Rhumbatron, stream: int) -> list[str]:
    js = (await app.nats()).jetstream()
    return sorted(info.name for info in await js.consumers_info(event_stream_name(stream)))


def counts(report: ReplayReport) -> dict[str, int]:
    return {
        name: getattr(report, name)
        for name in (
            "scanned",
            "applied",
            "would_apply",
            "already_applied",
            "in_flight",
            "retried",
            "failed",
        )
        if getattr(report, name)
    }


# -- rewind ------------------------------------------------------------------------------------


async def test_a_rewind_after_everything_was_applied_applies_nothing_twice(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a project's history applied by the projector
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, history(project, clock.now()))
    assert (await app.router().nudge(0)).subscriptions[PROJECTOR.value].applied == 6
    before = view_rows(app, project)

    # WHEN the projector is rewound to sequence 1, first as a dry run, then for real
    dry = await rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=True)
    real = await rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=False)

    # THEN the dry run finds every event already applied, and the real run applies none:
    # the view, its feed and its claims are exactly as they were
    assert counts(dry) == {"scanned": 6, "already_applied": 6}
    assert (dry.first_seq, dry.last_seq) == (1, 6)
    assert counts(real) == {"scanned": 6, "already_applied": 6}
    assert view_rows(app, project) == before
    # AND the replay's reader is gone; the live durable consumers are untouched
    assert await consumer_names(app, 0) == sorted([PROJECTOR.value, CAUSAL.value])
    lag = await router_tests.settled_lag(app)
    assert (lag.num_pending, lag.num_ack_pending) == (0, 0)


async def test_a_rewind_applies_exactly_the_events_the_subscription_missed(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a first history consumed by every subscription (a sweep runs analytics too) ...
    app = await make_app()
    first, second = projects_on_stream(0, 2)
    await publish(app, history(first, clock.now()))
    sweep = await app.router().sweep(now=sweep_minute(0))
    assert sweep.run.subscriptions[ANALYTICS.value].applied == 6
    # ... and a second one consumed by the projector and the causal router only (a nudge)
    missed = history(second, clock.now())
    await publish(app, missed)
    nudge = await app.router().nudge(0)
    assert nudge.subscriptions[PROJECTOR.value].applied == 6
    metrics = app.product().connection
    assert metric_counts(metrics, MetricBinding.EVENT_METRICS)["change_created"] == 1

    # WHEN analytics is rewound to sequence 1: a dry run, then for real
    dry = await rewind(app, stream_index=0, subscription=ANALYTICS, to_seq=1, dry_run=True)
    real = await rewind(app, stream_index=0, subscription=ANALYTICS, to_seq=1, dry_run=False)

    # THEN the dry run counts the missed events as would-apply and changed nothing ...
    assert counts(dry) == {"scanned": 12, "would_apply": 6, "already_applied": 6}
    # ... and the real run applied exactly those: one data point per missed event
    assert counts(real) == {"scanned": 12, "applied": 6, "already_applied": 6}
    points = metric_counts(metrics, MetricBinding.EVENT_METRICS)
    assert points["change_created"] == 2
    assert sum(points.values()) == 12
    # AND the projector, which missed nothing, would apply nothing
    projector = await rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=True)
    assert counts(projector) == {"scanned": 12, "already_applied": 12}
    # AND when the live analytics cursor reaches the same events, they are duplicates
    later = await app.router().sweep(now=sweep_minute(0) + timedelta(minutes=8))
    live = later.run.subscriptions[ANALYTICS.value]
    assert (live.applied, live.duplicates) == (0, 6)
    assert metric_counts(metrics, MetricBinding.EVENT_METRICS) == points


async def test_a_rewind_to_a_time_starts_at_the_first_event_stored_at_or_after_it(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN two histories stored one after the other on stream 0, none consumed
    app = await make_app()
    first, second = projects_on_stream(0, 2)
    await publish(app, history(first, clock.now()))
    await publish(app, history(second, clock.now()))
    js = (await app.nats()).jetstream()
    stored_at = (await js.get_msg(event_stream_name(0), 7)).time
    assert stored_at is not None

    # WHEN the projector is rewound to the time the second history's first event was stored
    dry = await rewind(app, stream_index=0, subscription=PROJECTOR, to_time=stored_at, dry_run=True)
    real = await rewind(
        app, stream_index=0, subscription=PROJECTOR, to_time=stored_at, dry_run=False
    )

    # THEN only the second history is read, from sequence 7, and applied
    assert counts(dry) == {"scanned": 6, "would_apply": 6}
    assert (dry.first_seq, dry.last_seq) == (7, 12)
    assert counts(real) == {"scanned": 6, "applied": 6}
    assert view_rows(app, second)["view_project"][0][2] == f"Project {second}"
    # AND the live cursor then applies the first history and skips the replayed one
    live = (await app.router().nudge(0)).subscriptions[PROJECTOR.value]
    assert (live.applied, live.duplicates) == (6, 6)


async def test_a_replay_while_the_live_cursor_consumes_applies_every_event_once(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN 150 events of three projects on stream 0, none consumed yet
    app = await make_app()
    projects = projects_on_stream(0, 3)
    events = [e for p in projects for e in [*history(p, clock.now()), *wakes(p, clock.now(), 44)]]
    await publish(app, events)

    # WHEN the live nudge and two rewinds (projector, causal router) run at the same time
    live, projector, causal = await asyncio.gather(
        app.router().nudge(0),
        rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=False),
        rewind(app, stream_index=0, subscription=CAUSAL, to_seq=1, dry_run=False),
    )

    # THEN each event took effect exactly once between the live cursor and the replay: of
    #   the causal router's, the 6 events a rule acts on (each history's change.planned and
    #   task.completed) once between them; the 144 no rule acts on hold no claim, so each
    #   cursor applies them, to no effect
    assert live.subscriptions[PROJECTOR.value].applied + projector.applied == 150
    assert live.subscriptions[CAUSAL.value].applied + causal.applied == 6 + 2 * 144
    assert projector.failed == causal.failed == 0
    for project in projects:
        rows = view_rows(app, project)
        assert len(rows["project_events"]) == 50
        assert rows["view_project"][0][6] == 50  # events_applied
    # AND a second replay and the rest of the live stream apply nothing more
    again = await rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=False)
    assert counts(again) == {"scanned": 150, "already_applied": 150}
    drained = await app.router().drain()
    # only the subscriptions not replayed: archive, analytics, reactions
    assert drained["applied"] == 150 * 3
    assert [len(view_rows(app, p)["project_events"]) for p in projects] == [50, 50, 50]


async def test_a_dry_run_changes_no_file_and_leaves_no_consumer(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN events on stream 0 that no subscription has read
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, history(project, clock.now()))
    app.router()  # building the router opens the product database: not the dry run's doing
    state_dir = app.settings.state_dir
    before = files_under(state_dir)

    # WHEN every subscription is rewound as a dry run
    reports = [
        await rewind(app, stream_index=0, subscription=s, to_seq=1, dry_run=True)
        for s in Subscription
    ]

    # THEN each would apply every event; no file was created or written; no consumer exists
    assert [counts(r) for r in reports] == [{"scanned": 6, "would_apply": 6}] * 5
    assert files_under(state_dir) == before
    assert not view_store_path(app.settings, stream_index(project)).exists()
    assert await consumer_names(app, 0) == []


async def test_a_rewind_past_the_stream_end_reads_nothing(make_app: AppFactory) -> None:
    app = await make_app()
    heard: list[tuple[int, int | None]] = []
    report = await rewind(
        app,
        stream_index=3,
        subscription=PROJECTOR,
        to_seq=1,
        dry_run=False,
        progress=lambda done, total, line="": heard.append((done, total)),
    )
    assert counts(report) == {}
    assert (report.first_seq, report.last_seq) == (1, 0)
    # nothing was read: no reader was made (nor any consumer yet), and no progress told
    assert heard == []
    assert await consumer_names(app, 3) == []


async def test_a_rewind_of_a_stream_that_does_not_exist_says_how_to_make_it(
    make_app: AppFactory,
) -> None:
    # GIVEN a deployment whose stream 3 was deleted
    app = await make_app()
    await (await app.nats()).jetstream().delete_stream(event_stream_name(3))
    # WHEN it is rewound  THEN the refusal names the stream and how to create it
    with pytest.raises(MessagingError) as refused:
        await rewind(app, stream_index=3, subscription=PROJECTOR, to_seq=1, dry_run=False)
    said = str(refused.value)
    assert said.startswith("stream EVENTS_03 does not exist (")
    assert said.endswith(
        "); create the streams (rhumbatron up, or any runtime's ensure_streams) and replay again"
    )


async def six_events_read_one_per_fetch(make_app: AppFactory, clock: ManualClock) -> Rhumbatron:
    """A runtime whose stream 0 holds one project's six events, read one per fetch that waits
    0.2 s at most: a server that stalls makes a fetch give up at once."""
    app = await make_app(router_fetch_max_records=1, router_fetch_timeout_s=0.2)
    (project,) = projects_on_stream(0, 1)
    await publish(app, history(project, clock.now()))
    return app


async def test_a_rewind_whose_server_stops_answering_fails_instead_of_ending_short(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN six events on stream 0, read one per fetch, a fetch waiting 0.2 s at most
    app = await six_events_read_one_per_fetch(make_app, clock)

    def stall_after_the_first(done: int, total: int | None, note: str = "") -> None:
        if done == 1:
            nats_server.pause()  # a server that stops answering (SIGSTOP), mid-replay

    # WHEN the projector is rewound to sequence 1 and the server stalls after one record
    try:
        with pytest.raises(NatsUnavailableError) as stalled:
            await rewind(
                app,
                stream_index=0,
                subscription=PROJECTOR,
                to_seq=1,
                dry_run=True,
                progress=stall_after_the_first,
            )
    finally:
        nats_server.resume()
    # THEN the fetch that found nothing is not taken for the stream's end: the replay fails,
    #   saying it could not reach JetStream and that a repeat is harmless, instead of
    #   reporting one record of six as a whole replay
    assert str(stalled.value).startswith("cannot reach JetStream to replay EVENTS_00: ")
    assert str(stalled.value).endswith(
        "replay again once NATS answers (the claims make a repeat harmless)"
    )


@pytest.mark.parametrize("stalled_after", [1, 4, 5])
async def test_a_rewind_rides_out_a_server_that_stalls_past_a_fetch(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess, stalled_after: int
) -> None:
    # GIVEN six events on stream 0, read one per fetch, a fetch waiting 0.2 s at most
    app = await six_events_read_one_per_fetch(make_app, clock)
    outages: list[asyncio.Task[None]] = []

    async def outage() -> None:
        await asyncio.sleep(0.6)  # the outage's length (three fetches' wait), not a sync
        nats_server.resume()

    def stall(done: int, total: int | None, note: str = "") -> None:
        if done == stalled_after:
            nats_server.pause()
            outages.append(asyncio.get_running_loop().create_task(outage()))

    # WHEN the projector is rewound to sequence 1 and the server stalls for a moment after
    #   one record, four or five (the next fetch gives up before it answers)
    try:
        report = await rewind(
            app,
            stream_index=0,
            subscription=PROJECTOR,
            to_seq=1,
            dry_run=True,
            progress=stall,
        )
    finally:
        nats_server.resume()
        await asyncio.gather(*outages)
    # THEN the replay goes on once the server answers, and reads the stream whole
    assert counts(report) == {"scanned": 6, "would_apply": 6}
    assert (report.first_seq, report.last_seq) == (1, 6)


async def test_a_rewind_of_a_stream_whose_last_records_were_deleted_reads_the_rest_and_ends(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN six events on stream 0, read one per fetch, and its last two deleted (the
    #   stream's last sequence is still 6: nothing will ever come at 5 or 6)
    app = await six_events_read_one_per_fetch(make_app, clock)
    js = (await app.nats()).jetstream()
    for seq in (5, 6):
        await js.delete_msg(event_stream_name(0), seq)
    # WHEN the projector is rewound to sequence 1 (bounded: a reader waiting for records
    #   that are gone would wait for ever)
    report = await asyncio.wait_for(
        rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=True), 10
    )
    # THEN it read the four left and ended: the empty fetch with nothing undelivered is
    #   the end of what the stream holds
    assert counts(report) == {"scanned": 4, "would_apply": 4}
    assert (report.first_seq, report.last_seq) == (1, 6)


async def test_a_rewind_to_the_last_record_of_a_stream_of_one_reads_that_record(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a stream holding one event
    app = await make_app()
    (project,) = projects_on_stream(3, 1)
    await publish(app, history(project, clock.now())[:1])
    # WHEN the projector is rewound to it, THEN it is read and applied, and nothing past it
    report = await rewind(app, stream_index=3, subscription=PROJECTOR, to_seq=1, dry_run=False)
    assert counts(report) == {"scanned": 1, "applied": 1}
    assert (report.first_seq, report.last_seq) == (1, 1)
    past = await rewind(app, stream_index=3, subscription=PROJECTOR, to_seq=2, dry_run=False)
    assert counts(past) == {}


# -- archive -----------------------------------------------------------------------------------


async def test_an_archive_range_replayed_into_fresh_state_applies_all_then_nothing(
    make_app: AppFactory, clock: ManualClock, tmp_path: Path
) -> None:
    # GIVEN two projects' histories (on two streams) and a third project's three days later,
    # all applied and archived by a runtime
    app = await make_app()
    inside = [projects_on_stream(1, 1)[0], projects_on_stream(5, 1)[0]]
    (outside,) = projects_on_stream(2, 1)
    await publish(app, [e for p in inside for e in history(p, START)])
    await publish(app, history(outside, START + timedelta(days=3)))
    await app.router().drain()
    # AND a runtime on a fresh state directory (same bucket): no view, no claim, no metric;
    # only the project roots restored, as before any rebuild (the router checks each event's
    # tenant against its project's root)
    fresh = await make_app(state_dir=tmp_path / "fresh")
    restore_project_roots(app, fresh, [*inside, outside])
    views = tmp_path / "fresh" / "views"
    day = {"start": START - timedelta(hours=1), "end": START + timedelta(days=1)}

    # WHEN the first day of the archive is replayed into the fresh projector: dry, then real
    dry = await replay_archive(
        fresh, stream_index=None, subscription=PROJECTOR, dry_run=True, **day
    )
    assert list(views.rglob("*.sqlite")) == []
    real = await replay_archive(
        fresh, stream_index=None, subscription=PROJECTOR, dry_run=False, **day
    )

    # THEN the dry run counted the range's 12 events, the real run applied them all ...
    assert counts(dry) == {"scanned": 12, "would_apply": 12}
    assert counts(real) == {"scanned": 12, "applied": 12}
    # ... rebuilding the same views the live router built (the feed's sequences aside: an
    # archived event carries none), and nothing of the project outside the range
    for project in inside:
        rebuilt, live = view_rows(fresh, project), view_rows(app, project)
        assert rebuilt["view_project"] == live["view_project"]
        for table in ("view_changes", "view_tasks", "view_agents"):  # their first 4 columns
            assert [r[:4] for r in rebuilt[table]] == [r[:4] for r in live[table]]
        assert {r[0] for r in rebuilt["project_events"]} == {r[0] for r in live["project_events"]}
    assert view_rows(fresh, outside)["view_project"] == []

    # WHEN the same range is replayed again
    again = await replay_archive(
        fresh, stream_index=None, subscription=PROJECTOR, dry_run=False, **day
    )
    # THEN nothing applies a second time
    assert counts(again) == {"scanned": 12, "already_applied": 12}

    # AND the fresh analytics projector gets one data point per archived event of one stream
    one_stream = await replay_archive(
        fresh, stream_index=1, subscription=ANALYTICS, dry_run=False, **day
    )
    assert counts(one_stream) == {"scanned": 6, "applied": 6}
    points = metric_counts(fresh.product().connection, MetricBinding.EVENT_METRICS)
    assert sum(points.values()) == 6


async def test_the_archive_replay_goes_through_run_replay_as_the_cli_calls_it(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN an archived history, applied (and another stream's, archived too); fetches of 2
    app = await make_app(router_fetch_max_records=2)
    (project,) = projects_on_stream(4, 1)
    await publish(app, history(project, START))
    await publish(app, history(projects_on_stream(6, 1)[0], START))
    await app.router().drain()
    heard: list[tuple[int, int | None]] = []
    # WHEN the CLI's entry point replays stream 4's archive, then rewinds the stream
    archived = await run_replay(
        app,
        source="archive",
        subscription="project-view-projector",
        dry_run=True,
        stream=4,
        start=START,
        end=START + timedelta(minutes=1),
        progress=lambda done, total, line="": heard.append((done, total)),
    )
    rewound = await run_replay(
        app, source="stream", subscription="causal-router", dry_run=True, stream=4, to_seq=1
    )
    # THEN both find everything applied that holds a claim: the causal router claims only
    #   the 2 events a rule acts on, and would apply the other 4 again, to no effect
    assert (archived.source, archived.stream_index, counts(archived)) == (
        ReplaySource.ARCHIVE,
        4,
        {"scanned": 6, "already_applied": 6},
    )
    # (a batch at a time; the archive's size is not known ahead)
    assert heard == [(2, None), (4, None), (6, None)]
    assert (archived.start, archived.end) == (START, START + timedelta(minutes=1))
    # AND a range that starts on the calendar's first day reads the same archive
    from_the_first_day = await run_replay(
        app,
        source="archive",
        subscription="project-view-projector",
        dry_run=True,
        stream=4,
        start=datetime(1, 1, 1, tzinfo=UTC),
        end=START + timedelta(minutes=1),
    )
    assert counts(from_the_first_day) == {"scanned": 6, "already_applied": 6}
    # AND a range ends before its end: the history's own instant is outside [.., START)
    before = await run_replay(
        app,
        source="archive",
        subscription="project-view-projector",
        dry_run=True,
        stream=4,
        start=START - timedelta(minutes=1),
        end=START,
    )
    assert counts(before) == {}
    assert (rewound.source, rewound.stream_index, counts(rewound)) == (
        ReplaySource.STREAM,
        4,
        {"scanned": 6, "already_applied": 2, "would_apply": 4},
    )


# -- arguments ---------------------------------------------------------------------------------


NAIVE = START.replace(tzinfo=None)


class _NoOffset(tzinfo):
    """A tzinfo that knows no offset: a time with it is as naive as one without."""

    def utcoffset(self, dt: datetime | None) -> None:
        return None


UNPLACED = START.replace(tzinfo=_NoOffset())
EARLIEST = datetime(1, 1, 1, tzinfo=EAST)  # 0001-01-01T00:00 at +05:00: no UTC day
SUBSCRIPTIONS = ", ".join(s.value for s in Subscription)
REPLAYABLE = ", ".join(s.value for s in Subscription if s is not Subscription.AUDIT_ARCHIVER)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            {"source": "stream", "stream": 0, "to_seq": 1, "to_time": START},
            f"a rewind needs exactly one start point, got to_seq=1 and to_time={START!r}; "
            "pass a stream sequence (to_seq >= 1) or a time (to_time)",
        ),
        (
            {"source": "stream", "stream": 0},
            "a rewind needs exactly one start point, got to_seq=None and to_time=None; "
            "pass a stream sequence (to_seq >= 1) or a time (to_time)",
        ),
        (
            {"source": "stream", "stream": 0, "to_seq": 0},
            "to_seq=0 is not a stream sequence; sequences start at 1",
        ),
        (
            {"source": "stream", "stream": 8, "to_seq": 1},
            "stream 8 is outside 0..7; pass the index of an event stream (EVENTS_00 … EVENTS_07)",
        ),
        ({"source": "stream", "to_seq": 1}, "a stream replay needs the stream (0..7) to rewind"),
        (
            {"source": "stream", "stream": 0, "to_time": NAIVE},
            f"to_time={NAIVE.isoformat()} has no timezone; pass a timezone-aware time (UTC)",
        ),
        (
            {"source": "stream", "stream": 0, "to_time": UNPLACED},
            f"to_time={UNPLACED.isoformat()} has no timezone; pass a timezone-aware time (UTC)",
        ),
        (
            {"source": "stream", "stream": 0, "to_seq": 1, "start": START},
            "start and end select an archive range; a stream replay takes to_seq or to_time",
        ),
        (
            {"source": "stream", "stream": 0, "to_seq": 1, "end": START},
            "start and end select an archive range; a stream replay takes to_seq or to_time",
        ),
        (
            {"source": "archive", "start": START},
            f"an archive replay needs start and end, got start={START!r}, end=None",
        ),
        (
            {"source": "archive", "end": START},
            f"an archive replay needs start and end, got start=None, end={START!r}",
        ),
        (
            {"source": "archive", "start": START, "end": START},
            f"start {START.isoformat()} is not before end {START.isoformat()}; the range is "
            "[start, end): pass an end after the start",
        ),
        (
            {"source": "archive", "start": START, "end": START, "to_seq": 1},
            "to_seq and to_time rewind a stream; an archive replay takes start and end",
        ),
        (
            {"source": "archive", "start": START, "end": START, "to_time": START},
            "to_seq and to_time rewind a stream; an archive replay takes start and end",
        ),
        (
            {"source": "archive", "start": NAIVE, "end": START},
            f"start={NAIVE.isoformat()} has no timezone; pass a timezone-aware time (UTC)",
        ),
        (
            {"source": "archive", "start": START, "end": NAIVE},
            f"end={NAIVE.isoformat()} has no timezone; pass a timezone-aware time (UTC)",
        ),
        (
            {"source": "archive", "stream": 8, "start": START, "end": START},
            "stream 8 is outside 0..7; pass the index of an event stream (EVENTS_00 … EVENTS_07)",
        ),
        (
            {"source": "tape", "start": START},
            "replay source 'tape' is unknown; pass one of stream, archive",
        ),
        (
            {"source": "archive", "start": EARLIEST, "end": START},
            f"start={EARLIEST.isoformat()} has no UTC day (it is outside the calendar's range); "
            "pass a time between the years 1 and 9999 in UTC",
        ),
        (
            {"source": "archive", "start": START, "end": EARLIEST},
            f"end={EARLIEST.isoformat()} has no UTC day (it is outside the calendar's range); "
            "pass a time between the years 1 and 9999 in UTC",
        ),
        (
            {"source": "stream", "stream": 0, "to_seq": 1, "subscription": "nope"},
            f"subscription 'nope' is unknown; pass one of {SUBSCRIPTIONS}",
        ),
        (
            {
                "source": "archive",
                "start": START,
                "end": START + timedelta(days=1),
                "subscription": "audit-archiver",
            },
            f"the archive is the audit-archiver's own output: replay it into {REPLAYABLE}",
        ),
    ],
)
async def test_a_replay_that_cannot_work_is_refused_before_reading_anything(
    offline_settings: Settings, options: dict[str, Any], says: str
) -> None:
    # GIVEN a runtime whose NATS and S3 are unreachable: a refusal must come first
    app = bootstrap(offline_settings, clock=ManualClock(START), alarms=RecordingAlarmSink())
    options = {"subscription": PROJECTOR.value, "dry_run": True, **options}
    try:
        # WHEN the replay is asked; THEN it is refused with a message naming the problem
        with pytest.raises(ReplayError) as refused:
            await run_replay(app, **options)
        assert str(refused.value) == says
    finally:
        await app.close()


async def test_a_replay_into_a_busy_view_file_retries_every_record_and_reports_twenty_errors(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN four projects' histories (24 events) and two messages that are no event, on a
    # stream; and the stream's view file held by another writer (no busy wait here)
    app = await make_app(sqlite_busy_timeout_ms=0, router_fetch_max_records=100)
    for project in projects_on_stream(0, 4):
        await publish(app, history(project, clock.now()))
    for n in (1, 2):
        await router_tests.publish_raw(app, 0, b"not an event", f"junk-{n}")
    store = app.router().projector.views(0)
    assert store.connection is not None  # opening makes the file
    progress: list[tuple[int, int | None]] = []
    with router_tests.held_by_another_writer(store.path):
        # WHEN the projector is replayed from sequence 1, as the CLI asks
        report = await run_replay(
            app,
            source="stream",
            subscription=PROJECTOR,
            stream=0,
            to_seq=1,
            dry_run=False,
            progress=lambda done, total, line="": progress.append((done, total)),
        )

    # THEN every event is counted to retry and each message that is no event as failed;
    # the report keeps the first twenty reasons, and the progress heard all 26 records
    assert counts(report) == {"scanned": 26, "retried": 24, "failed": 2}
    assert report.stream_index == 0
    assert len(report.errors) == 20
    undecodable = "undecodable record: invalid Event: not JSON"
    assert report.errors[0].startswith(f"junk-1: {undecodable}")
    assert report.errors[1].startswith(f"junk-2: {undecodable}")
    held = f"SQLite file {store.path} is held by another writer past the busy timeout"
    assert all(e.startswith("evt_") and held in e for e in report.errors[2:])
    assert progress[-1] == (26, 26)


async def test_a_dry_run_tells_live_leases_from_expired_ones_and_from_done_claims(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN six events of stream 0 whose archiver claims a crashed run left behind: two
    # leases still live, two expired (one a second ago, one at this very instant: a claim
    # takes over a lease whose time is up, not only one past it), two done; and six more
    # with no claim at all
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    events = [*history(project, clock.now()), *history(project, clock.now(), change="chg-2")]
    await publish(app, events)
    now_s = clock.now().timestamp()
    state = app.router().stream_state(0).connection
    leases = [("claimed", now_s + 60)] * 2 + [("claimed", now_s - 1), ("claimed", now_s)]
    leases += [("done", None)] * 2
    with state:
        state.executemany(
            "INSERT INTO processed_events (consumer, event_id, status, lease_until_s, "
            "processed_at_s) VALUES (?, ?, ?, ?, ?)",
            [
                ("audit-archiver", e.event_id, status, until, now_s)
                for e, (status, until) in zip(events, leases, strict=False)
            ],
        )

    # WHEN the archiver is replayed as a dry run
    report = await rewind(app, stream_index=0, subscription=ARCHIVER, to_seq=1, dry_run=True)

    # THEN a live lease is in flight (its run may still finish it), an expired one and no
    # claim would apply (the next claim takes it over), a done one is applied already
    assert counts(report) == {"scanned": 12, "in_flight": 2, "would_apply": 8, "already_applied": 2}


async def test_a_replay_goes_again_with_a_fresh_budget_for_the_projects_it_deferred(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN five projects' histories on stream 0, and two apply calls per run
    app = await make_app(router_apply_calls_per_run=2)
    projects = projects_on_stream(0, 5)
    for project in projects:
        await publish(app, history(project, clock.now()))
    # WHEN the projector is replayed: the first pass applies two projects, defers three
    report = await rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=False)
    # THEN it went again until every project applied, and nothing was left to retry
    assert counts(report) == {"scanned": 30, "applied": 30}
    assert [view_rows(app, p)["view_project"][0][6] for p in projects] == [6] * 5


async def test_an_event_stored_twice_counts_its_second_copy_as_applied_already(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a history on stream 0, two of its events published again under other message IDs
    # (a publisher that lost its duplicate window)
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    events = history(project, clock.now())
    await publish(app, events)
    for event in events[1:3]:
        await router_tests.publish_raw(app, 0, event.to_json(), f"{event.event_id}-again")
    # WHEN the projector is replayed
    report = await rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=False)
    # THEN each event applied once; each second copy counts as applied already
    assert counts(report) == {"scanned": 8, "applied": 6, "already_applied": 2}


async def test_a_replay_into_a_busy_product_file_retries_each_event_naming_the_file(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a history on stream 0 and the product database (analytics' claims and points)
    # held by another writer
    app = await make_app(sqlite_busy_timeout_ms=0)
    (project,) = projects_on_stream(0, 1)
    await publish(app, history(project, clock.now()))
    product = app.product()
    with router_tests.held_by_another_writer(product.path):
        # WHEN analytics is replayed
        report = await rewind(app, stream_index=0, subscription=ANALYTICS, to_seq=1, dry_run=False)
    # THEN every event is to retry, each naming the file held
    assert counts(report) == {"scanned": 6, "retried": 6}
    held = f"SQLite file {product.path} is held by another writer past the busy timeout"
    assert all(e.startswith("evt_") and held in e for e in report.errors)


async def test_a_replay_whose_project_root_cannot_be_read_retries_each_event_saying_why(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a history on stream 0, and its project's root file damaged since (a fresh
    # process: no tenant of it remembered)
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    events = history(project, clock.now())
    await publish(app, events)
    root = ProjectRoot.ref_for(project).path(app.settings.state_dir)
    await app.close()  # its files closed and checkpointed
    root.write_bytes(b"not a database file" * 512)
    fresh = await make_app()
    # WHEN the projector is rewound
    report = await rewind(fresh, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=False)
    # THEN every event is to retry (not failed: the root may be read again), each saying why
    assert counts(report) == {"scanned": 6, "retried": 6}
    why = f"cannot read the root of project {project} to check the tenant of event"
    assert [e.partition(": ")[0] for e in report.errors] == [e.event_id for e in events]
    # ... naming the error met, by its type
    assert all(
        f"{why} {event.event_id}: ActorError: " in error
        for error, event in zip(report.errors, events, strict=True)
    )


async def test_an_event_the_view_refuses_in_a_replay_fails_alone_with_its_reason(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN two histories on stream 0, and a view that refuses two of their tasks
    app = await make_app()
    projects = projects_on_stream(0, 2)
    for project in projects:
        await publish(app, history(project, clock.now()))
    app.router().projector.views(0).connection.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON view_tasks WHEN NEW.task_id = 't1' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    # WHEN the projector is replayed
    report = await rewind(app, stream_index=0, subscription=PROJECTOR, to_seq=1, dry_run=False)
    # THEN only the events that write the task (its plan, ready, assigned, completed) failed,
    # each named with why; the rest applied
    assert counts(report) == {"scanned": 12, "applied": 4, "failed": 8}
    assert all(
        e.startswith("evt_") and e.endswith("to the view failed: refused") for e in report.errors
    )


async def test_a_replay_whose_claims_file_is_busy_retries_the_whole_batch(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a history on stream 0, and the stream's state file (the causal router's claims)
    # held by another writer
    app = await make_app(sqlite_busy_timeout_ms=0)
    (project,) = projects_on_stream(0, 1)
    await publish(app, history(project, clock.now()))
    state = app.router().stream_state(0)
    assert state.connection is not None  # opening makes the file
    with router_tests.held_by_another_writer(state.path):
        # WHEN the causal router is replayed
        report = await rewind(app, stream_index=0, subscription=CAUSAL, to_seq=1, dry_run=False)
    # THEN nothing of the batch took effect: each event is to retry, naming the error
    assert counts(report) == {"scanned": 6, "retried": 6}
    assert all(
        e.startswith("evt_") and ": ActorBusyError: SQLite file " in e for e in report.errors
    )


async def test_a_rewind_reads_through_a_consumer_of_its_own_that_the_server_removes_if_idle(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN 30 events on stream 0, read one per fetch, and at most 7 records unacked
    app = await make_app(router_fetch_max_records=1, router_max_ack_pending=7)
    for project in projects_on_stream(0, 5):
        await publish(app, history(project, clock.now()))
    js = (await app.nats()).jetstream()
    seen: list[Any] = []

    async def watch() -> None:
        while not seen:
            seen.extend(
                c for c in await js.consumers_info("EVENTS_00") if c.name.startswith("replay-")
            )

    # WHEN the projector is rewound to sequence 4, its consumer watched while it reads
    watcher = asyncio.create_task(watch())
    heard: list[tuple[int, int | None]] = []
    report = await rewind(
        app,
        stream_index=0,
        subscription=PROJECTOR,
        to_seq=4,
        dry_run=True,
        progress=lambda done, total, line="": heard.append((done, total)),
    )
    await asyncio.wait_for(watcher, timeout=10)

    # THEN it read from there through a consumer of its own: named for the subscription,
    # each record delivered once and acked by batch, removed by the server once idle for the
    # ack wait (if the replay dies), and gone when the replay ended
    assert counts(report) == {"scanned": 27, "would_apply": 27}
    assert (report.first_seq, report.last_seq) == (4, 30)
    assert heard == [(n, 27) for n in range(1, 28)]  # a record at a time, of the 27
    [info] = seen
    config = info.config
    assert re.fullmatch(r"replay-project-view-projector-[0-9a-f]{12}", info.name)
    assert config.description == "replay of project-view-projector (deleted when the replay ends)"
    assert (config.opt_start_seq, config.ack_policy, config.max_deliver) == (4, "all", 1)
    assert (config.ack_wait, config.inactive_threshold) == (300.0, 300.0)
    assert config.max_ack_pending == 7
    assert not [c for c in await js.consumers_info("EVENTS_00") if c.name == info.name]
