"""Reconciliation on one node, as an operator runs it: ``rhumbatron reconcile`` proves the log
holds every event the outbox marked published, and names each one it does not (the cluster
case, a replica that lost events, is in tests/faults/test_cluster_faults.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.request import urlopen

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.cli import EXIT_GAP
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.project import project_admin_key
from rhumbatron.errors import MessagingError
from rhumbatron.messaging.log_state import (
    CATCH_UP_S,
    SCAN_BATCH,
    ReplicaState,
    ScanStopped,
    StreamIds,
    _consumer_on,
    _scan,
    read_replica_states,
    read_stream_ids,
)
from rhumbatron.messaging.sender import JetStreamSender
from rhumbatron.metrics import LOG_GAP_METRIC, recent_points
from rhumbatron.operator.log_repair import Republished, Republisher
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.router.ticks import log_proof_due
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration

PROJECT = "reconciled"
CLOCK_PROJECT = "rhumbatron-clock"  # ScheduleSettings.clock_project_id's default
CALLER = Caller("acme", "system:test", correlation_id="corr-reconcile")


def gap_facts(shard: ResourceShard) -> list[dict[str, object]]:
    """The log.gap_detected facts in ``shard``'s outbox."""
    rows = shard.connection.execute(
        "SELECT envelope FROM outbox WHERE event_type = 'log.gap_detected' ORDER BY seq"
    )
    return [json.loads(envelope) for (envelope,) in rows]


def write_change_events(shard: ResourceShard, change_id: str, count: int) -> list[str]:
    """Append ``count`` task.ready facts; return their event IDs in outbox order."""
    facts = tuple(ChangeFact("task.ready", {}, task_id=f"tsk-{i:03d}") for i in range(count))
    shard.apply(CALLER, AppendChangeEvents(change_id=change_id, status="planned", facts=facts))
    return [row[0] for row in shard.connection.execute("SELECT event_id FROM outbox ORDER BY seq")]


async def published_events(app: Rhumbatron, count: int) -> tuple[ResourceShard, list[str]]:
    """``count`` task.ready facts of one Change, published to streams that exist: the shard
    that wrote them, and their event IDs in outbox order."""
    await app.ensure_streams()
    shard = app.resource_shard(PROJECT, change_resource_key("chg-1"))
    written = write_change_events(shard, "chg-1", count)
    await app.fire_due_alarms()
    return shard, written


@pytest.fixture
def settings(tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        nats_monitor_urls=f"http://127.0.0.1:{nats_server.http_port}",
    )


def _reconcile_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env |= {
        "RHUMBATRON_STATE_DIR": str(settings.state_dir),
        "RHUMBATRON_NATS_URL": settings.nats_url,
        "RHUMBATRON_NATS_MONITOR_URLS": settings.nats_monitor_urls or "",
    }
    return subprocess.run(
        [sys.executable, "-m", "rhumbatron.cli", "reconcile", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_the_log_holding_every_published_event_is_proven_and_a_lost_one_named(
    settings: Settings,
) -> None:
    # GIVEN 20 events published from one actor
    app = bootstrap(settings)
    try:
        _, written = await published_events(app, 20)
        index = stream_index(PROJECT)
        stream = event_stream_name(index)

        # WHEN reconciliation runs over that stream, THEN every event is proven held
        done = _reconcile_cli(settings, "--stream", str(index), "--json")
        assert done.returncode == 0, done.stderr
        [clean] = json.loads(done.stdout)["streams"]
        assert clean["stream"] == stream
        assert (clean["expected"], clean["gap"], clean["missingEverywhere"]) == (20, False, [])
        [replica] = clean["replicas"]
        assert (replica["found"], replica["missing"], replica["holes"]) == (20, [], 0)
        assert (replica["messages"], replica["firstSeq"], replica["lastSeq"]) == (20, 1, 20)

        # WHEN the log loses the 5th event (its message deleted behind the outbox's back)
        js = (await app.nats()).jetstream()
        await js.delete_msg(stream, 5)

        # THEN reconciliation exits 6 and names exactly that event, on the one copy there is;
        # no copy holds it, so it is the one event that may be published again
        done = _reconcile_cli(settings, "--stream", str(index), "--json")
        assert done.returncode == EXIT_GAP, done.stderr
        [gap] = json.loads(done.stdout)["streams"]
        assert gap["gap"] is True
        assert gap["missingEverywhere"] == [written[4]]
        [replica] = gap["replicas"]
        assert (replica["found"], replica["missing"], replica["holes"]) == (19, [written[4]], 1)
        # AND the table says the same to a person
        table = _reconcile_cli(settings, "--stream", str(index))
        assert table.returncode == EXIT_GAP
        assert f"{stream}: GAP: 20 events published" in table.stdout
        assert f"    missing {written[4]}" in table.stdout
    finally:
        await app.close()


async def test_a_scan_whose_consumer_answers_late_reads_every_event_and_one_never_answered_fails(
    settings: Settings,
) -> None:
    # GIVEN 20 published events, and a scan consumer that does not answer yet (as one placed on
    # another node does until its interest reaches the client's server: JetStream answers 503)
    app = bootstrap(settings)
    try:
        _, written = await published_events(app, 20)
        stream = event_stream_name(stream_index(PROJECT))
        js = (await app.nats()).jetstream()
        headers_only = ConsumerConfig(
            name="late-scan",
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            headers_only=True,
        )

        # WHEN the scan starts, and its consumer comes half a second later (the fault)
        scan = asyncio.create_task(_scan(js, stream, "late-scan", 20, SCAN_BATCH, caught_up=False))
        await asyncio.sleep(0.5)  # the fault's delay, not a wait for the scan
        await js.add_consumer(stream, headers_only)
        sequence_of, requests = await scan

        # THEN the unanswered fetches were asked again, and the scan read every event
        assert sorted(sequence_of, key=sequence_of.__getitem__) == written
        assert requests > 1, "the scan never met an unanswered fetch: the fault did not happen"

        # AND a consumer that never answers ends the scan with an error that says so, within
        # its bound (a read error is reported per replica, not taken for a lost copy)
        with pytest.raises(MessagingError, match=f"nobody answered the scan of {stream}"):
            await asyncio.wait_for(
                _scan(js, stream, "never-made", 20, SCAN_BATCH, caught_up=False), 30
            )
    finally:
        await app.close()


async def test_a_copy_that_lost_its_newest_event_is_reported_without_waiting_for_a_catch_up(
    settings: Settings,
) -> None:
    # GIVEN 20 published events, the newest of which the log loses (its copy's own last
    # sequence, in its /jsz, stays 20: the copy is not behind, it lost the event)
    app = bootstrap(settings)
    try:
        _, written = await published_events(app, 20)
        index = stream_index(PROJECT)
        await (await app.nats()).jetstream().delete_msg(event_stream_name(index), 20)

        # WHEN reconciliation runs over that stream
        report = await app.reconcile([index])

        # THEN it names the lost event, and its scan ended where the copy's messages do: it
        # did not wait the catch-up time a follower behind its leader is given
        [stream] = report.streams
        [replica] = stream.replicas
        assert (replica.missing, replica.holes, replica.behind) == ((written[-1],), 1, 0)
        assert report.seconds < CATCH_UP_S, f"the scan waited {report.seconds:.1f} s"

        # AND the scan of that copy counts each request it made: the stream's info, its
        # consumer, the fetch of the 19 events, the fetch that timed out and the consumer's
        # info that showed nothing pending, the consumer's delete
        js = (await app.nats()).jetstream()
        ids = await read_stream_ids(
            js, event_stream_name(index), since=datetime(2000, 1, 1, tzinfo=UTC), copy_last_seq=20
        )
        assert ids.sequence_of == {event_id: n + 1 for n, event_id in enumerate(written[:-1])}
        assert ids.requests == 6

        # AND a scan that does not know the copy's own last sequence gives it the catch-up
        # time (a follower behind its leader gets the rest) before it ends where it stops
        started = time.monotonic()
        waited = await read_stream_ids(
            js, event_stream_name(index), since=datetime(2000, 1, 1, tzinfo=UTC)
        )
        assert time.monotonic() - started >= CATCH_UP_S
        assert waited.sequence_of == ids.sequence_of
    finally:
        await app.close()


async def test_events_published_before_the_window_are_not_expected(
    settings: Settings, clock: ManualClock
) -> None:
    # GIVEN 3 events published, and a clock 7 days later: beyond the window (the stream's
    # retention), where the stream may have dropped them
    app = bootstrap(settings, clock=clock)
    try:
        await published_events(app, 3)
        index = stream_index(PROJECT)
        [now] = (await app.reconcile([index])).streams
        assert now.expected == 3
        # WHEN the window has passed them
        clock.advance(days=7)
        # THEN none is expected any more, and nothing is a gap
        [later] = (await app.reconcile([index])).streams
        assert (later.expected, later.has_gap) == (0, False)
    finally:
        await app.close()


async def test_a_sweep_tick_finds_a_replica_short_of_its_range_and_records_the_loss(
    settings: Settings, nats_server: NatsServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN 10 events published, then the 4th lost from the stream's one copy
    index = stream_index(PROJECT)
    # the tick at minute m sweeps stream m mod 8: this one sweeps the project's stream
    tick_at = datetime(2026, 12, 3, 10, 0, tzinfo=UTC) + timedelta(minutes=index)
    app = bootstrap(settings, clock=ManualClock(tick_at))
    try:
        await published_events(app, 10)
        clean = await app.sweep_tick(tick_at)
        assert clean.log_gaps == {}
        js = (await app.nats()).jetstream()
        await js.delete_msg(event_stream_name(index), 4)

        # WHEN the next tick of that stream runs
        later = tick_at + timedelta(minutes=8)
        tick = await app.sweep_tick(later)

        # THEN it names the node and the one event lost, warns with the way to the proof,
        # and records the loss as the log_gap_events metric
        assert tick.log_gaps == {nats_server.name: 1}
        assert f"run `rhumbatron reconcile --stream {index}`" in caplog.text
        [point] = recent_points(app.product().connection, LOG_GAP_METRIC)
        assert point.value == 1.0
        # AND a log.gap_detected fact on the clock project's stream, naming stream and node
        clock = app.resource_shard(CLOCK_PROJECT, project_admin_key(CLOCK_PROJECT))
        [fact] = gap_facts(clock)
        assert fact["payload"] == {
            "stream": event_stream_name(index),
            "node": nats_server.name,
            "lostEvents": 1,
            "messages": 9,
            "firstSeq": 1,
            "lastSeq": 10,
        }
        # AND the same loss seen by the stream's next tick that day is not a second fact
        again = await app.sweep_tick(later + timedelta(minutes=8))
        assert again.log_gaps == {nats_server.name: 1}
        assert len(gap_facts(clock)) == 1
    finally:
        await app.close()


def _visit(stream: int, at_or_after: datetime) -> datetime:
    """The first sweep tick at or after ``at_or_after`` that visits ``stream`` (minute of the
    day mod 8)."""
    tick = at_or_after.replace(second=0, microsecond=0)
    while (tick.hour * 60 + tick.minute) % 8 != stream:
        tick += timedelta(minutes=1)
    return tick


async def test_the_sweep_proves_each_stream_by_event_id_once_an_hour_and_records_a_loss(
    settings: Settings, nats_server: NatsServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN 10 events published at 10:30, then every message of the stream purged: the copy's
    # range moves past them, so its own counts show no hole, and only a proof by ID sees it
    index = stream_index(PROJECT)
    clock = ManualClock(datetime(2026, 12, 3, 10, 30, tzinfo=UTC))
    app = bootstrap(settings, clock=clock)
    try:
        _, written = await published_events(app, 10)
        stream = event_stream_name(index)
        await (await app.nats()).jetstream().purge_stream(stream)

        # WHEN the stream's next tick runs within the hour (not its first visit of the hour)
        within = await app.sweep_tick(_visit(index, clock.now()))
        # THEN it runs only the cheap check, which sees nothing wrong
        assert (within.log_proof, within.log_gaps) == (None, {})

        # WHEN the stream's first tick of the next hour runs out of time before the proof
        proof_tick = _visit(index, datetime(2026, 12, 3, 11, 0, tzinfo=UTC))
        late = await app.sweep_tick(proof_tick, should_stop=lambda: True)
        # THEN it skips the proof (the tick's time is the router's first)
        assert (late.out_of_time, late.log_proof) == (True, None)

        # WHEN that tick runs with time to spare (the hourly proof's default)
        hourly = await app.sweep_tick(proof_tick)

        # THEN it proves the stream by event ID, finds all ten lacking on the one copy (and on
        # every copy), warns with the way to the repair, and records the loss: the metric
        # and a log.gap_detected fact with the count
        assert hourly.log_proof is not None
        assert {k: hourly.log_proof[k] for k in ("stream", "expected", "gap")} == {
            "stream": stream,
            "expected": 10,
            "gap": True,
        }
        assert hourly.log_proof["missingEverywhere"] == 10
        assert hourly.log_gaps == {nats_server.name: 10}
        assert f"lacks 10 event(s) the outbox published (first {written[0]})" in caplog.text
        [point] = recent_points(app.product().connection, LOG_GAP_METRIC)
        assert point.value == 10.0
        clock_shard = app.resource_shard(CLOCK_PROJECT, project_admin_key(CLOCK_PROJECT))
        [fact] = gap_facts(clock_shard)
        assert (fact["payload"]["node"], fact["payload"]["lostEvents"]) == (nats_server.name, 10)
    finally:
        await app.close()

    # AND with the schedule off, the same tick proves nothing
    off = settings.model_copy(update={"reconcile_proof_every_hours": 0})
    app = bootstrap(off, clock=clock)
    try:
        quiet = await app.sweep_tick(_visit(index, datetime(2026, 12, 3, 11, 0, tzinfo=UTC)))
        assert (quiet.log_proof, quiet.log_gaps) == (None, {})
    finally:
        await app.close()


def test_the_proof_is_due_on_each_streams_first_tick_of_its_period_and_spans_it() -> None:
    # GIVEN the default schedule (hourly) and a 6-hourly one
    hourly = load_settings()
    six_hourly = load_settings(reconcile_proof_every_hours=6)
    day = datetime(2026, 12, 3, tzinfo=UTC)
    minutes = [day + timedelta(minutes=m) for m in range(24 * 60)]
    # THEN every stream is proven once in each period, on its first visit in it, over the
    # period and two visits more
    for settings, period_min in ((hourly, 60), (six_hourly, 360)):
        due = [(t, log_proof_due(settings, t)) for t in minutes]
        proofs = [(t, span) for t, span in due if span is not None]
        assert len(proofs) == 8 * (24 * 60 // period_min)
        assert {span for _, span in proofs} == {period_min * 60 + 2 * 8 * 60}
        for t, _ in proofs:
            assert (t.hour * 60 + t.minute) % period_min < 8
    # AND 0 turns the schedule off
    off = load_settings(reconcile_proof_every_hours=0)
    assert all(log_proof_due(off, t) is None for t in minutes)


async def _answering_again(app: Rhumbatron, stream: str) -> None:
    """Wait (bounded) until JetStream answers the app's connection again after its server
    restarted (nats-py notices the restart, reconnects, and JetStream recovers the stream)."""
    from nats.errors import Error as NatsError

    deadline = time.monotonic() + 15
    while True:
        try:
            await (await app.nats()).jetstream().stream_info(stream)
            return
        except NatsError:
            assert time.monotonic() < deadline, "the server never answered again"
            await asyncio.sleep(0.1)  # polling the reconnect, with a deadline


async def test_a_repair_publishes_again_only_what_no_copy_holds_and_the_log_is_whole_after(
    settings: Settings, nats_server: NatsServerProcess
) -> None:
    # GIVEN 20 published events, and the server stopped gracefully, its newest block file
    # cut by about three events and started again: it rebuilds without them (and forgets
    # their IDs with them), so no copy holds them
    app = bootstrap(settings)
    try:
        shard, written = await published_events(app, 20)
        index = stream_index(PROJECT)
        stream = event_stream_name(index)
        nats_server.stop()
        [block] = sorted(nats_server.store_dir.rglob(f"streams/{stream}/msgs/*.blk"))[-1:]
        os.truncate(block, block.stat().st_size - 3 * block.stat().st_size // 20)
        nats_server.start()
        await _answering_again(app, stream)
        report = await app.reconcile([index])
        [gap] = report.streams
        lost = gap.missing_everywhere
        assert lost and lost == tuple(written[-len(lost) :]), gap.as_json()

        # WHEN an operator asks for the dry run, then for the repair
        planned = await app.repair_log(report, dry_run=True)
        after_dry_run = (await app.reconcile([index])).streams[0].missing_everywhere
        steps = await app.repair_log(report, dry_run=False)

        # THEN the dry run says what it would publish and publishes nothing; the repair
        # publishes exactly those again (with no copy to rebuild from, none is listed for a
        # rebuild: deleting the only copy would lose the rest)
        assert [(s.action, s.done) for s in planned] == [("republish", False)]
        assert f"{len(lost)} event(s) no replica holds would be published" in planned[0].detail
        assert after_dry_run == lost
        [republished] = steps
        assert (republished.action, republished.done) == ("republish", True)
        assert republished.detail.startswith(f"{len(lost)} of {len(lost)} event(s)")
        assert "repeats" not in republished.detail  # each was stored ...
        assert "no published outbox row" not in republished.detail  # ... from its own row

        # AND the log then holds every event exactly once: the proof finds no gap, the
        # stream holds 20 messages, the lost ones after the others (the order caveat), and
        # each outbox row knows its event's new place
        [whole] = (await app.reconcile([index])).streams
        assert not whole.has_gap, whole.as_json()
        js = (await app.nats()).jetstream()
        ids = await read_stream_ids(js, stream, since=datetime(2000, 1, 1, tzinfo=UTC))
        assert sorted(ids.sequence_of, key=ids.sequence_of.__getitem__) == written
        assert (await js.stream_info(stream)).state.messages == 20
        places = dict(shard.connection.execute("SELECT event_id, stream_seq FROM outbox"))
        assert {event_id: places[event_id] for event_id in lost} == {
            event_id: ids.sequence_of[event_id] for event_id in lost
        }
        assert min(places[event_id] for event_id in lost) > 20

        # AND a second repair finds nothing left to do
        assert await app.repair_log(await app.reconcile([index]), dry_run=False) == []
    finally:
        await app.close()


async def test_a_proof_whose_time_is_up_stops_proves_nothing_and_leaves_no_consumer(
    settings: Settings,
) -> None:
    # GIVEN 5 published events
    app = bootstrap(settings)
    try:
        await published_events(app, 5)
        index = stream_index(PROJECT)
        js = (await app.nats()).jetstream()
        # WHEN a proof runs with its caller's time already up (as a sweep tick's can be)
        # THEN it stops before its first fetch, claims no gap, and deletes its scan consumer
        with pytest.raises(ScanStopped, match="out of time"):
            await app.reconcile([index], should_stop=lambda: True)
        names = [c.name for c in await js.consumers_info(event_stream_name(index))]
        assert not [name for name in names if name.startswith("reconcile-")], names
    finally:
        await app.close()


async def test_a_copys_counts_are_read_from_its_node_and_a_node_that_does_not_answer_is_named(
    settings: Settings,
) -> None:
    # GIVEN 5 published events, the second then deleted from the stream
    app = bootstrap(settings)
    try:
        _, written = await published_events(app, 5)
        stream = event_stream_name(stream_index(PROJECT))
        js = (await app.nats()).jetstream()
        await js.delete_msg(stream, 2)
        monitor = settings.nats_monitor_urls or ""
        varz = await asyncio.to_thread(urlopen, f"{monitor}/varz", timeout=5)
        node = json.load(varz)["server_name"]
        silent = "http://127.0.0.1:9"  # the discard port: nothing listens there

        empty = event_stream_name((stream_index(PROJECT) + 1) % 8)

        # WHEN the copies of that stream, of an empty one and of one that does not exist are
        # read
        states, unread = await asyncio.to_thread(
            read_replica_states, [monitor, silent], [stream, empty, "EVENTS_NONE"], timeout_s=2.0
        )

        # THEN its one copy is read with every count, named by its server, and so is the empty
        # stream's (whose counts the server leaves out: nothing deleted, no sequence); the
        # silent node is named with why, and the unknown stream is simply absent
        assert sorted(states, key=lambda state: state.stream) == sorted(
            [
                ReplicaState(stream, node, 4, 1, 5, 1, node),
                ReplicaState(empty, node, 0, 0, 0, 0, node),
            ],
            key=lambda state: state.stream,
        )
        states = [state for state in states if state.stream == stream]
        assert (states[0].span, states[0].holes, states[0].is_leader) == (5, 1, True)
        assert len(unread) == 1 and unread[0].startswith(f"{silent} (")

        # AND the scan of its event IDs finds each kept event at its sequence, in a
        # counted number of requests; one from after the last event finds none
        ids = await read_stream_ids(js, stream, since=datetime(2000, 1, 1, tzinfo=UTC))
        assert (ids.stream, ids.node) == (stream, None)
        assert ids.sequence_of == {written[i]: i + 1 for i in (0, 2, 3, 4)}
        assert ids.requests == 4  # stream info, consumer, one fetch, consumer deleted
        later = await read_stream_ids(js, stream, since=datetime.now(UTC) + timedelta(hours=1))
        assert later.sequence_of == {}
        # AND neither scan left its consumer behind
        assert [c.name for c in await js.consumers_info(stream) if "reconcile" in c.name] == []
        # AND the empty stream's scan is its one info request, nothing in it, for the node
        # asked; a stream that does not exist is refused naming it (and the node), with the
        # error nats-py raised
        long_ago = datetime(2000, 1, 1, tzinfo=UTC)
        assert await read_stream_ids(js, empty, since=long_ago, on_node=node) == StreamIds(
            empty, node, {}, 1
        )
        for on_node, where in ((node, f" on {node}"), (None, "")):
            with pytest.raises(MessagingError) as refused:
                await read_stream_ids(js, "EVENTS_NONE", since=long_ago, on_node=on_node)
            assert str(refused.value).startswith(
                f"cannot read the event IDs of EVENTS_NONE{where}: NotFoundError: "
            )
    finally:
        await app.close()


async def test_the_scans_consumer_reads_headers_only_from_its_start_time_and_goes_away_idle(
    settings: Settings,
) -> None:
    # GIVEN a stream with events
    app = bootstrap(settings)
    try:
        await published_events(app, 2)
        stream = event_stream_name(stream_index(PROJECT))
        js = (await app.nats()).jetstream()
        since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

        # WHEN the scan's consumer is made (one server: placed at the first try)
        name, requests = await _consumer_on(js, stream, since, None)

        # THEN it is a named, memory-only, one-replica consumer that reads headers only,
        # from the scan's start time, acks nothing and goes away a minute after its last use
        config = (await js.consumer_info(stream, name)).config
        assert name.startswith("reconcile-") and requests == 1
        assert (config.name, config.headers_only, config.mem_storage) == (name, True, True)
        assert (config.num_replicas, config.inactive_threshold) == (1, 60.0)
        assert (config.ack_policy, config.deliver_policy) == (
            AckPolicy.NONE,
            DeliverPolicy.BY_START_TIME,
        )
        assert datetime.fromisoformat(str(config.opt_start_time)) == since
        await js.delete_consumer(stream, name)
    finally:
        await app.close()


async def test_a_republish_inside_the_duplicate_window_names_each_repeat_and_each_unknown_id(
    settings: Settings,
) -> None:
    # GIVEN three published events, still inside the stream's duplicate window
    app = bootstrap(settings)
    try:
        shard, written = await published_events(app, 3)
        stream = event_stream_name(stream_index(PROJECT))
        places = dict(shard.connection.execute("SELECT event_id, stream_seq FROM outbox"))
        js = (await app.nats()).jetstream()
        sender = JetStreamSender(await app.nats(), ack_timeout_s=settings.publish_ack_timeout_s)
        republisher = Republisher(app.actors, sender)

        # WHEN two of them and an ID no outbox holds are published again
        result = await republisher.republish(stream, [written[0], written[2], "evt-unknown"])

        # THEN the window drops the two as repeats, by name; the unknown one is named as such;
        # nothing is stored twice and the rows keep their places
        assert result == Republished(
            stored=(), repeats=(written[0], written[2]), unknown=("evt-unknown",)
        )
        assert (await js.stream_info(stream)).state.messages == 3
        assert dict(shard.connection.execute("SELECT event_id, stream_seq FROM outbox")) == places
    finally:
        await app.close()
