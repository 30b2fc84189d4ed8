"""Faults of the outbox publisher, against a real nats-server (RELIABILITY F5-F9, bindings).

Every test drives time with a :class:`ManualClock`; the server is SIGKILLed and restarted on
the same port and store; a crashing publisher is a separate process that kills itself at a
named point (``RHUMBATRON_CRASH_AT``).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from rhumbatron.actors.outbox import backoff_s
from rhumbatron.actors.publisher import OutboxPublisher, requeue_failed_rows
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.errors import SendRefusedError
from rhumbatron.messaging.connection import connect_nats
from rhumbatron.messaging.nudge import RecordingNudge
from rhumbatron.messaging.sender import (
    FastBatchAck,
    JetStreamSender,
    OutgoingMessage,
    StoredMessage,
)
from rhumbatron.messaging.streams import ensure_streams
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.testing import RefusingSender, SenderWrapper

from .worker import (
    CALLER,
    outbox_rows,
    projects_on_distinct_streams,
    read_project_stream,
    read_stream,
    run_worker,
    start_worker,
    wait_until,
    worker_env,
    write_change_events,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

#: The publisher's three ways to send a project's rows (``publish_batch_mode``).
MODES = pytest.mark.parametrize(
    "mode", ["atomic", "fast", "off"], ids=["atomic-batches", "fast-batches", "one-by-one"]
)


# --------------------------------------------------------------------------- injected senders


class KillingSender(SenderWrapper):
    """SIGKILLs the nats-server just before the ``kill_before_call``-th send (or batch)."""

    def __init__(
        self, inner: JetStreamSender, server: NatsServerProcess, kill_before_call: int
    ) -> None:
        super().__init__(inner)
        self._server = server
        self._kill_before_call = kill_before_call
        self.calls = 0

    def _tick(self) -> None:
        self.calls += 1
        if self.calls == self._kill_before_call:
            self._server.kill()

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        self._tick()
        return await super().send(stream, message)

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        self._tick()
        return await super().send_batch(stream, messages)

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        self._tick()
        return await super().send_fast_batch(stream, messages)


class RefuseOnceSender(SenderWrapper):
    """The server refuses one Event once on its own and once inside any batch (F7).

    In a fast batch the Event is lost on the way instead: it goes to a subject no stream
    binds, so the real server sees a gap behind it and stores only the rows before it.
    """

    def __init__(self, inner: JetStreamSender, event_id: str) -> None:
        super().__init__(inner)
        self._event_id = event_id
        self.refused_single = False
        self.refused_batch = False
        #: Event IDs that reached the server, in the order they were sent.
        self.delivered: list[str] = []

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        if message.message_id == self._event_id and not self.refused_single:
            self.refused_single = True
            raise SendRefusedError(f"test: server refused {message.message_id} (transient)")
        stored = await super().send(stream, message)
        self.delivered.append(message.message_id)
        return stored

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        if not self.refused_batch and any(m.message_id == self._event_id for m in messages):
            self.refused_batch = True
            raise SendRefusedError("test: server refused a batch holding the transient row")
        stored = await super().send_batch(stream, messages)
        self.delivered.extend(m.message_id for m in messages)
        return stored

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        if not self.refused_batch and any(m.message_id == self._event_id for m in messages):
            self.refused_batch = True
            messages = [
                replace(m, subject="lost.in.transit") if m.message_id == self._event_id else m
                for m in messages
            ]
        ack = await super().send_fast_batch(stream, messages)
        self.delivered.extend(m.message_id for m in messages[: ack.stored])
        return ack


def _settings(tmp_path: Path, server: NatsServerProcess, **overrides: object) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url=server.url, **overrides)


async def _assert_stream_matches_outbox(js: object, shard: ResourceShard) -> None:
    """The project's Events are on its stream exactly once, in outbox order, at the stream
    sequences the outbox recorded (a fast batch records only its last row's)."""
    rows = outbox_rows(shard)
    project = shard.ref.project_id
    on_stream = await read_project_stream(js, project)
    assert on_stream == [r["event_id"] for r in rows]
    seq_of = {e.message_id: e.seq for e in await read_stream(js, stream_index(project))}
    recorded = [r for r in rows if r["stream_seq"] is not None]
    assert recorded, "no row recorded where it was stored"
    assert [r["stream_seq"] for r in recorded] == [seq_of[r["event_id"]] for r in recorded]


# --------------------------------------------------------------------------- F6


@pytest.mark.parametrize(
    ("mode", "kill_before_call"),
    [("atomic", 2), ("fast", 2), ("off", 150)],
    ids=["atomic-batches", "fast-batches", "one-by-one"],
)
async def test_nats_down_past_the_backoff_budget_loses_nothing_and_keeps_order(
    tmp_path: Path, durable_nats: NatsServerProcess, mode: str, kill_before_call: int
) -> None:
    # GIVEN three projects (three actors) with 250 outbox rows each, on a manual clock
    settings = _settings(tmp_path, durable_nats, publish_batch_mode=mode, publish_ack_timeout_s=1.0)
    clock = ManualClock()
    nc = await connect_nats(settings)
    await ensure_streams(nc.jetstream(), settings)
    inner = JetStreamSender(nc, ack_timeout_s=settings.publish_ack_timeout_s)
    sender = KillingSender(inner, durable_nats, kill_before_call)
    app = bootstrap(settings, clock=clock, sender=sender)
    try:
        projects = ["proj-a", "proj-b", "proj-c"]
        shards = [app.resource_shard(p, f"change:c-{p}") for p in projects]
        total = {
            s.ref.key: len(write_change_events(s, f"c-{s.ref.project_id}", 250)) for s in shards
        }

        # WHEN the every-minute scan publishes and nats-server is SIGKILLed in the middle of it
        first_scan = (await app.fire_due_alarms()).reports
        assert not durable_nats.running
        assert any(r.unavailable for r in first_scan)

        # ... and it stays down for 30 minutes (far past the ~511 s backoff budget) while the
        # scan and direct publishes keep running and the actors keep writing events
        publisher = await app.publisher()
        for minute in range(30):
            clock.advance(minutes=1)
            if minute == 10:
                for s in shards:
                    write_change_events(s, f"c-{s.ref.project_id}", 20, start=250)
                    total[s.ref.key] += 20
            for report in (await app.fire_due_alarms()).reports:
                assert (report.published, report.retry_wait, report.failed) == (0, 0, 0)
            for s in shards:
                report = await publisher.publish_due(s)
                assert report.unavailable
                assert (report.published, report.retry_wait, report.failed) == (0, 0, 0)

        # THEN no row failed or waits for a retry, and no attempt was counted while down
        for s in shards:
            rows = outbox_rows(s)
            assert len(rows) == total[s.ref.key]
            assert {r["state"] for r in rows} <= {"pending", "published"}
            assert [r for r in rows if r["attempts"] != 0] == []
            assert any(r["state"] == "pending" for r in rows)

        # WHEN nats-server restarts on the same port and store, and the scan keeps running
        durable_nats.start()
        await wait_until(lambda: nc.is_connected, timeout_s=15, what="the client to reconnect")
        for _ in range(20):
            clock.advance(minutes=1)
            await app.fire_due_alarms()
            if all(r["state"] == "published" for s in shards for r in outbox_rows(s)):
                break

        # THEN every row is published, and each project's Events are on its stream exactly
        # once, in outbox order
        js = nc.jetstream()
        for s in shards:
            assert {r["state"] for r in outbox_rows(s)} == {"published"}
            await _assert_stream_matches_outbox(js, s)
    finally:
        await app.close()
        await nc.close()


async def test_rows_stored_before_nats_dies_mid_call_are_reported_and_nudged(
    tmp_path: Path, durable_nats: NatsServerProcess
) -> None:
    # GIVEN ten rows sent one by one, and nats-server SIGKILLed just before the 5th send
    project = "proj-partial"
    settings = _settings(
        tmp_path, durable_nats, publish_batch_mode="off", publish_ack_timeout_s=1.0
    )
    clock = ManualClock()
    nc = await connect_nats(settings)
    await ensure_streams(nc.jetstream(), settings)
    app = bootstrap(settings, clock=clock)
    try:
        shard = app.resource_shard(project, "change:c1")
        write_change_events(shard, "c1", 10)
        inner = JetStreamSender(nc, ack_timeout_s=settings.publish_ack_timeout_s)
        nudge = RecordingNudge()
        publisher = OutboxPublisher(
            KillingSender(inner, durable_nats, kill_before_call=5),
            settings,
            clock=clock,
            nudge=nudge,
        )

        # WHEN the publisher runs
        report = await publisher.publish_due(shard)

        # THEN the four stored rows are marked published, the rest stay pending untouched
        rows = outbox_rows(shard)
        assert [r["state"] for r in rows] == ["published"] * 4 + ["pending"] * 6
        assert [r["attempts"] for r in rows] == [0] * 10
        assert report.unavailable

        # ... and the report counts the four, and the router is nudged for their stream
        # (DECISIONS: a nudge per stream per publish_due run that sent at least one row)
        assert report.published == 4
        assert nudge.nudged == [stream_index(project)]
    finally:
        await app.close()
        await nc.close()


# --------------------------------------------------------------------------- F5


@MODES
async def test_publisher_killed_after_the_puback_is_deduplicated_on_resend(
    tmp_path: Path, nats_server: NatsServerProcess, mode: str
) -> None:
    # GIVEN an actor with 30 outbox rows
    settings = _settings(tmp_path, nats_server, publish_batch_mode=mode)
    clock = ManualClock()
    app = bootstrap(settings, clock=clock)
    try:
        await app.ensure_streams()
        shard = app.resource_shard("proj-f5", "change:c1")
        sent_by_worker = write_change_events(shard, "c1", 30)

        # WHEN a publisher process gets the PubAcks and dies before marking the rows
        crashed = run_worker(
            ["publish", shard.ref.key], worker_env(settings, crash_at="after_puback")
        )
        assert crashed.returncode == 137, crashed.stderr

        # THEN the rows are still pending, with no attempt counted; the stream has them once
        rows = outbox_rows(shard)
        assert [(r["state"], r["attempts"]) for r in rows] == [("pending", 0)] * 30
        js = (await app.nats()).jetstream()
        assert await read_project_stream(js, "proj-f5") == sent_by_worker

        # WHEN more events arrive and a publisher runs again
        later = write_change_events(shard, "c1", 5, start=30)
        report = await (await app.publisher()).publish_due(shard)

        # THEN the re-sends are dropped by the duplicate window: one copy of each event (a
        # fast batch's PubAck does not say which rows the window dropped, so none is counted)
        assert report.duplicates == (0 if mode == "fast" else 30)
        assert report.published == 35
        assert (report.retry_wait, report.failed) == (0, 0)
        info = await js.stream_info(event_stream_name(stream_index("proj-f5")))
        assert info.state.messages == 35
        assert await read_project_stream(js, "proj-f5") == sent_by_worker + later
        assert {r["state"] for r in outbox_rows(shard)} == {"published"}
        await _assert_stream_matches_outbox(js, shard)
    finally:
        await app.close()


# --------------------------------------------------------------------------- F7


@MODES
async def test_transient_failure_of_row_k_holds_back_later_rows_until_its_retry(
    tmp_path: Path, nats_server: NatsServerProcess, mode: str
) -> None:
    # GIVEN ten rows of one project, and a server that refuses row k once (alone or in a batch)
    k = 4
    settings = _settings(tmp_path, nats_server, publish_batch_mode=mode)
    clock = ManualClock()
    app = bootstrap(settings, clock=clock)
    nc = await connect_nats(settings)
    try:
        await app.ensure_streams()
        shard = app.resource_shard("proj-f7", "change:c1")
        ids = write_change_events(shard, "c1", 10)
        sender = RefuseOnceSender(
            JetStreamSender(nc, ack_timeout_s=settings.publish_ack_timeout_s), ids[k]
        )
        publisher = OutboxPublisher(sender, settings, clock=clock, rng=random.Random(7))

        # WHEN the publisher runs
        first = await publisher.publish_due(shard)

        # THEN rows before k are published, row k waits with one attempt and its error, and
        # rows after k were not sent at all
        assert (first.published, first.retry_wait, first.failed) == (k, 1, 0)
        assert sender.delivered == ids[:k]
        rows = outbox_rows(shard)
        assert [r["state"] for r in rows[:k]] == ["published"] * k
        assert rows[k]["state"] == "retry_wait"
        assert rows[k]["attempts"] == 1
        assert "attempt 1 of 10" in rows[k]["last_error"]
        assert "refused" in rows[k]["last_error"]
        assert [(r["state"], r["attempts"]) for r in rows[k + 1 :]] == [("pending", 0)] * 5
        delay = rows[k]["next_attempt_at"] - clock.now().timestamp()
        assert 0.8 <= delay <= 1.2

        # WHEN more events arrive and the publisher runs again inside the backoff
        more = write_change_events(shard, "c1", 3, start=10)
        waiting = await publisher.publish_due(shard)

        # THEN nothing is sent: row k still blocks the rows behind it, its error kept
        assert waiting.published == 0
        assert sender.delivered == ids[:k]
        row_k = outbox_rows(shard)[k]
        assert (row_k["state"], row_k["attempts"]) == ("retry_wait", 1)
        assert row_k["last_error"] == rows[k]["last_error"]
        assert waiting.next_alarm_at == pytest.approx(rows[k]["next_attempt_at"])

        # WHEN the clock passes the backoff and the publisher runs
        clock.advance(seconds=1.5)
        retried = await publisher.publish_due(shard)

        # THEN the rest go, and the project's order on its stream is the outbox order
        assert (retried.published, retried.retry_wait, retried.failed) == (13 - k, 0, 0)
        assert sender.delivered == ids + more
        assert {r["state"] for r in outbox_rows(shard)} == {"published"}
        await _assert_stream_matches_outbox(nc.jetstream(), shard)
    finally:
        await app.close()
        await nc.close()


# --------------------------------------------------------------------------- backoff schedule


async def test_refused_row_backs_off_exponentially_then_fails_and_requeue_publishes_it(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    # GIVEN two rows of one project and a server that refuses every send
    settings = _settings(tmp_path, nats_server)
    clock = ManualClock()
    app = bootstrap(settings, clock=clock)
    nc = await connect_nats(settings)
    try:
        await app.ensure_streams()
        shard = app.resource_shard("proj-backoff", "change:c1")
        ids = write_change_events(shard, "c1", 2)
        sender = RefusingSender(reason="test: insufficient resources")
        publisher = OutboxPublisher(sender, settings, clock=clock, rng=random.Random(1234))
        expected_rng = random.Random(1234)
        delays: list[float] = []

        for attempt in range(1, 11):
            # WHEN the publisher runs once the row is due
            started = clock.now().timestamp()
            report = await publisher.publish_due(shard)
            first, second = outbox_rows(shard)

            # THEN one more attempt is counted on the first row; the second never moves
            assert first["attempts"] == attempt
            assert (second["state"], second["attempts"]) == ("pending", 0)
            assert second["event_id"] not in sender.attempted
            assert f"attempt {attempt} of 10" in first["last_error"]
            if attempt == 10:
                break

            # ... and it waits 1 s, 2 s, 4 s ... with at most 20 % jitter
            assert report.retry_wait == 1
            assert first["state"] == "retry_wait"
            delay = first["next_attempt_at"] - started
            nominal = 2.0 ** (attempt - 1)
            assert nominal * 0.8 - 1e-6 <= delay <= nominal * 1.2 + 1e-6
            assert delay == pytest.approx(
                backoff_s(attempt, initial_s=1.0, max_s=300.0, jitter=0.2, rng=expected_rng)
            )
            assert report.next_alarm_at == pytest.approx(first["next_attempt_at"])
            delays.append(delay)

            # ... during which a publish attempts nothing
            attempted = len(sender.attempted)
            clock.advance(seconds=delay / 2)
            await publisher.publish_due(shard)
            assert len(sender.attempted) == attempted
            clock.advance(seconds=delay / 2 + 0.01)

        # THEN the 10th failed attempt makes the row failed, its error kept
        assert (report.failed, report.retry_wait) == (1, 0)
        first, second = outbox_rows(shard)
        assert first["state"] == "failed"
        assert first["next_attempt_at"] is None
        assert "attempt 10 of 10" in first["last_error"]
        assert "insufficient resources" in first["last_error"]
        assert 511 * 0.8 <= sum(delays) <= 511 * 1.2

        # WHEN an operator requeues failed rows
        assert requeue_failed_rows(shard) == 1

        # THEN the row is pending with attempts reset, and a working publisher sends both rows
        # in order
        first = outbox_rows(shard)[0]
        assert (first["state"], first["attempts"]) == ("pending", 0)
        working = OutboxPublisher(
            JetStreamSender(nc, ack_timeout_s=settings.publish_ack_timeout_s),
            settings,
            clock=clock,
        )
        report = await working.publish_due(shard)
        assert report.published == 2
        assert await read_project_stream(nc.jetstream(), "proj-backoff") == ids
        await _assert_stream_matches_outbox(nc.jetstream(), shard)
    finally:
        await app.close()
        await nc.close()


# --------------------------------------------------------------------------- F8


async def test_two_publishers_at_once_on_one_actor_send_each_event_once_in_order(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    # GIVEN one actor with 250 rows, opened by two publishers with their own connections
    settings = _settings(tmp_path, nats_server)
    clock = ManualClock()
    app = bootstrap(settings, clock=clock)
    nc1 = await connect_nats(settings)
    nc2 = await connect_nats(settings)
    try:
        await app.ensure_streams()
        shard = app.resource_shard("proj-f8", "change:c1")
        write_change_events(shard, "c1", 250)
        other = ResourceShard(shard.ref, settings, clock=clock)  # a second file handle
        p1 = OutboxPublisher(JetStreamSender(nc1, ack_timeout_s=5), settings, clock=clock)
        p2 = OutboxPublisher(JetStreamSender(nc2, ack_timeout_s=5), settings, clock=clock)

        # WHEN both run publish_due at the same time, again and again until the rows are out
        rounds = []
        for _ in range(10):
            r1, r2 = await asyncio.gather(p1.publish_due(shard), p2.publish_due(other))
            rounds.append((r1, r2))
            if all(r["state"] == "published" for r in outbox_rows(shard)):
                break
        other.close()

        # THEN while one publishes the other is told the actor is busy, never both at once
        for r1, r2 in rounds:
            assert [r1.busy, r2.busy].count(True) == 1
        assert sum(r.published for pair in rounds for r in pair) == 250
        assert sum(r.duplicates for pair in rounds for r in pair) == 0

        # ... and every event is on the stream once, in outbox order
        assert {r["state"] for r in outbox_rows(shard)} == {"published"}
        await _assert_stream_matches_outbox(nc1.jetstream(), shard)
    finally:
        await app.close()
        await nc1.close()
        await nc2.close()


async def test_two_publisher_processes_at_once_on_one_actor_lose_and_repeat_nothing(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    # GIVEN one actor with 250 rows
    settings = _settings(tmp_path, nats_server, publish_max_rows_per_project=20)
    app = bootstrap(settings, clock=ManualClock())
    try:
        await app.ensure_streams()
        shard = app.resource_shard("proj-f8p", "change:c1")
        write_change_events(shard, "c1", 250)

        # WHEN two publisher processes run on it at the same time, each until nothing is left
        env = worker_env(settings, publish_max_rows_per_project="20")
        workers = [start_worker(["publish", shard.ref.key, "200"], env) for _ in range(2)]
        outputs = [w.communicate(timeout=45) for w in workers]

        # THEN both finish; between them every row was published once, with no re-send
        assert [w.returncode for w in workers] == [0, 0], [err for _, err in outputs]
        reports = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
        assert sum(r["published"] for r in reports) == 250
        assert sum(r["duplicates"] for r in reports) == 0
        assert {r["state"] for r in outbox_rows(shard)} == {"published"}

        # ... and the stream holds each event once, in outbox order
        await _assert_stream_matches_outbox((await app.nats()).jetstream(), shard)
    finally:
        await app.close()


# --------------------------------------------------------------------------- F9


@MODES
async def test_oversize_and_unserialisable_rows_fail_fast_while_the_others_flow(
    tmp_path: Path, mode: str
) -> None:
    # GIVEN a nats-server whose max_payload is 4 KiB
    server = NatsServerProcess(store_dir=tmp_path / "nats-small", max_payload=4096)
    server.start()
    settings = _settings(tmp_path, server, publish_batch_mode=mode)
    clock = ManualClock()
    app = bootstrap(settings, clock=clock)
    try:
        await app.ensure_streams()
        project = "proj-f9"
        shard = app.resource_shard(project, "change:c1")
        good = write_change_events(shard, "c1", 2)
        # ... an Event of ~6 KB: above max_payload, far below RHUMBATRON_MAX_EVENT_BYTES
        oversize = shard.apply(
            CALLER,
            AppendChangeEvents(change_id="c1", status="running", facts=(_big_fact(6000),)),
        ).transition.facts[0]
        assert 4096 < len(oversize.to_json()) < settings.max_event_bytes
        good += write_change_events(shard, "c1", 2, start=2)
        # ... a row whose stored envelope is not JSON, and one that is JSON but not an Event
        # (a corrupted file: raw SQL, as no API can write such a row)
        _insert_raw_row(shard, "evt_" + "a" * 32, project, b'{"eventId": "evt_', clock)
        good += write_change_events(shard, "c1", 2, start=4)
        _insert_raw_row(shard, "evt_" + "b" * 32, project, b'{"eventId": "x"}', clock)
        good += write_change_events(shard, "c1", 2, start=6)

        # WHEN the publisher runs
        report = await (await app.publisher()).publish_due(shard)

        # THEN the three bad rows fail at once, without an attempt, each with a clear error
        assert (report.failed, report.published, report.retry_wait) == (3, 8, 0)
        by_id = {r["event_id"]: r for r in outbox_rows(shard)}
        too_big = by_id[oversize.event_id]
        not_json = by_id["evt_" + "a" * 32]
        not_event = by_id["evt_" + "b" * 32]
        for row in (too_big, not_json, not_event):
            assert (row["state"], row["attempts"]) == ("failed", 0)
        assert "max_payload of 4096" in too_big["last_error"]
        assert "not a JSON object" in not_json["last_error"]
        assert "damaged" in not_json["last_error"]
        assert "lacks this row's" in not_event["last_error"]
        assert "eventId" in not_event["last_error"]

        # ... and the rows before and after them are published, in order
        assert [by_id[i]["state"] for i in good] == ["published"] * 8
        js = (await app.nats()).jetstream()
        assert await read_project_stream(js, project) == good

        # WHEN the publisher runs again THEN the failed rows stay failed and nothing is re-sent
        again = await (await app.publisher()).publish_due(shard)
        assert (again.published, again.failed) == (0, 0)
        assert await read_project_stream(js, project) == good
    finally:
        await app.close()
        server.stop()


@MODES
async def test_an_event_just_under_max_payload_fails_fast_and_the_connection_survives(
    tmp_path: Path, mode: str
) -> None:
    # GIVEN a 4 KiB max_payload, and an Event whose body fits but body plus headers do not
    # (the server answers such a message by closing the connection)
    server = NatsServerProcess(store_dir=tmp_path / "nats-small", max_payload=4096)
    server.start()
    settings = _settings(tmp_path, server, publish_batch_mode=mode)
    app = bootstrap(settings, clock=ManualClock())
    try:
        await app.ensure_streams()
        project = "proj-edge"
        shard = app.resource_shard(project, "change:c1")
        good = write_change_events(shard, "c1", 2)
        edge = shard.apply(
            CALLER, AppendChangeEvents(change_id="c1", status="running", facts=(_big_fact(3600),))
        ).transition.facts[0]
        assert 4096 - 256 < len(edge.to_json()) < 4096
        good += write_change_events(shard, "c1", 2, start=2)

        # WHEN the publisher runs twice
        first = await (await app.publisher()).publish_due(shard)
        second = await (await app.publisher()).publish_due(shard)

        # THEN the edge row fails at once, the others are published, nothing is left
        # unavailable, and the connection is the one we started with
        assert (first.failed, first.published, first.unavailable) == (1, 4, False)
        assert (second.published, second.unavailable) == (0, False)
        row = {r["event_id"]: r for r in outbox_rows(shard)}[edge.event_id]
        assert row["state"] == "failed"
        assert "with its headers" in row["last_error"]
        assert (await app.nats()).is_connected
        assert await read_project_stream((await app.nats()).jetstream(), project) == good
    finally:
        await app.close()
        server.stop()


def _big_fact(size: int) -> ChangeFact:
    return ChangeFact(
        "change.status_changed",
        {"fromStatus": "running", "toStatus": "verifying", "reason": "x" * size},
        key="big",
    )


def _insert_raw_row(
    shard: ResourceShard, event_id: str, project: str, envelope: bytes, clock: ManualClock
) -> None:
    shard.connection.execute(
        "INSERT INTO outbox (event_id, project_id, event_type, stream_index, envelope, "
        "created_at) VALUES (?, ?, 'agent.woke', ?, ?, ?)",
        (event_id, project, stream_index(project), envelope, clock.now().timestamp()),
    )


# --------------------------------------------------------------------------- producer bindings


async def test_row_for_an_unbound_stream_fails_at_once_while_bound_projects_publish(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    # GIVEN two projects on different streams, and a publisher bound to only the first stream
    bound, unbound = projects_on_distinct_streams(2, prefix="bind")
    settings = _settings(tmp_path, nats_server, producer_bindings=(stream_index(bound),))
    app = bootstrap(settings, clock=ManualClock())
    try:
        await app.ensure_streams()
        bound_shard = app.resource_shard(bound, "change:c1")
        unbound_shard = app.resource_shard(unbound, "change:c1")
        bound_ids = write_change_events(bound_shard, "c1", 3)
        write_change_events(unbound_shard, "c1", 3)
        publisher = await app.publisher()

        # WHEN the publisher runs on both actors
        unbound_report = await publisher.publish_due(unbound_shard)
        bound_report = await publisher.publish_due(bound_shard)

        # THEN the unbound project's rows fail at once, naming the stream and the setting
        assert (unbound_report.failed, unbound_report.published) == (3, 0)
        unbound_stream = event_stream_name(stream_index(unbound))
        for row in outbox_rows(unbound_shard):
            assert (row["state"], row["attempts"]) == ("failed", 0)
            assert unbound_stream in row["last_error"]
            assert "RHUMBATRON_PRODUCER_BINDINGS" in row["last_error"]

        # ... and the bound project publishes as usual
        assert (bound_report.published, bound_report.failed) == (3, 0)
        js = (await app.nats()).jetstream()
        assert await read_project_stream(js, bound) == bound_ids
        assert (await js.stream_info(unbound_stream)).state.messages == 0
    finally:
        await app.close()
