"""``OutboxPublisher.publish_due`` against a real nats-server (spec "Transactional outbox to the
event log", "Outbox row states", idempotency rows "Event publish" and "Event stream publish")."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.js.client import JetStreamContext

from outbox_rows import append_ready_tasks
from rhumbatron.actors.actor import Actor
from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.publisher import OutboxPublisher, republish_rows
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.actors.storage import write_transaction
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import BatchRejectedError, SendRefusedError
from rhumbatron.messaging.nudge import RecordingNudge
from rhumbatron.messaging.sender import JetStreamSender, OutgoingMessage, StoredMessage
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import stream_index
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.testing import SenderWrapper

pytestmark = pytest.mark.integration

CALLER = Caller("acme", "system:test", correlation_id="corr-publisher")
WEB = "acme-web"  # fnv1a32 0xc8d18fd0 -> stream 0 (computed with bash)
BILLING = "acme-billing"  # fnv1a32 0x142a9fd9 -> stream 1


@dataclass(frozen=True)
class Stored:
    seq: int
    subject: str
    msg_id: str | None
    data: bytes


@pytest.fixture
def settings(tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    """Atomic batches: these tests inject faults into the publisher's atomic batches and
    read the per-row stream positions they record. Fast-ingest batches have their own tests
    (tests/integration/test_fast_batches.py, and every mode in tests/faults F5-F7)."""
    return load_settings(
        state_dir=tmp_path / "state", nats_url=nats_server.url, publish_batch_mode="atomic"
    )


@pytest_asyncio.fixture
async def reader(nats_server: NatsServerProcess) -> AsyncIterator[JetStreamContext]:
    """A second client that reads the streams back, as the event router would."""
    nc = await nats.connect(nats_server.url, name="test-reader")
    yield nc.jetstream()
    await nc.close()


async def stored(js: JetStreamContext, stream: str) -> list[Stored]:
    info = await js.stream_info(stream)
    if info.state.messages == 0:
        return []
    messages = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await js.get_msg(stream, seq)
        msg_id = (raw.headers or {}).get("Nats-Msg-Id")
        messages.append(Stored(seq, raw.subject or "", msg_id, raw.data or b""))
    return messages


def outbox(connection: sqlite3.Connection) -> list[sqlite3.Row]:
    return list(connection.execute("SELECT * FROM outbox ORDER BY seq"))


def task_facts(count: int, prefix: str = "tsk") -> tuple[ChangeFact, ...]:
    return tuple(ChangeFact("task.ready", {}, task_id=f"{prefix}-{i:03d}") for i in range(count))


async def eventually(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    """Wait for a condition another task makes true (a reconnect), bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.01)


def billing_with_three_rows(app: Rhumbatron) -> ProjectRoot:
    """acme-billing (stream 1) created and promoted: three outbox rows to publish."""
    root = app.project_root(BILLING)
    root.create_project(CALLER, name="Billing")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    return root


# --------------------------------------------------------------------------- where events go


async def test_events_arrive_on_their_projects_stream_with_the_event_id_as_msg_id(
    app: Rhumbatron, reader: JetStreamContext
) -> None:
    # GIVEN acme-billing (stream 1) created and promoted: three outbox rows
    root = billing_with_three_rows(app)
    assert stream_index(BILLING) == 1
    # WHEN the publisher runs
    report = await (await app.publisher()).publish_due(root)
    # THEN EVENTS_01 holds the three envelopes on events.01, Nats-Msg-Id = eventId, in order
    rows = outbox(root.connection)
    assert report.published == 3
    assert await stored(reader, "EVENTS_01") == [
        Stored(i + 1, "events.01", row["event_id"], bytes(row["envelope"]))
        for i, row in enumerate(rows)
    ]
    assert [Event.parse(bytes(r["envelope"])).event_id for r in rows] == [
        r["event_id"] for r in rows
    ]
    # AND the rows are published with the stream sequence they got; no other stream moved
    assert [(r["state"], r["stream_seq"]) for r in rows] == [
        (RowState.PUBLISHED, 1),
        (RowState.PUBLISHED, 2),
        (RowState.PUBLISHED, 3),
    ]
    for other in (0, 2, 3, 4, 5, 6, 7):
        assert (await reader.stream_info(f"EVENTS_0{other}")).state.messages == 0


async def test_an_alarm_drives_the_outbox_to_the_stream(
    app: Rhumbatron, reader: JetStreamContext
) -> None:
    # GIVEN writes on two actors of one project (their alarms announced)
    app.project_root(WEB).create_project(CALLER, name="Web")
    shard = app.resource_shard(WEB, change_resource_key("chg-1"))
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(2))
    )
    # WHEN the local invoker fires the announced alarms
    reports = await app.drain_alarms()
    # THEN every row was published through an admitted fire
    assert sum(r.published for r in reports) == 3
    assert len(await stored(reader, "EVENTS_00")) == 3
    for ref in app.actor_refs():
        assert counts_by_state(app.actor(ref).connection)[RowState.PUBLISHED] > 0


# --------------------------------------------------------------------------- the marks' commit


async def test_the_publish_marks_commit_without_an_fsync_and_the_actor_stays_durable(
    app: Rhumbatron, reader: JetStreamContext
) -> None:
    # GIVEN a project root with three rows to publish, its statements traced
    root = billing_with_three_rows(app)
    statements: list[str] = []
    root.connection.set_trace_callback(statements.append)
    # WHEN the publisher sends them and marks them published
    report = await (await app.publisher()).publish_due(root)
    root.connection.set_trace_callback(None)
    # THEN the marks' one transaction committed at NORMAL (the WAL written, no fsync: a
    #   crash that loses it sends the rows again, and the duplicate window drops them)
    assert report.published == 3
    assert statements.count("COMMIT") == 1
    commit = statements.index("COMMIT")
    levels = [(n, s) for n, s in enumerate(statements) if s.startswith("PRAGMA synchronous=")]
    assert [s for n, s in levels if n < commit][-1:] == ["PRAGMA synchronous=NORMAL"]
    assert [s for n, s in levels if n > commit][:1] == ["PRAGMA synchronous=FULL"]
    assert [r["state"] for r in outbox(root.connection)] == [RowState.PUBLISHED] * 3
    # AND the actor's own transactions keep their fsync
    assert root.connection.execute("PRAGMA synchronous").fetchone()[0] == 2


async def test_a_publish_whose_actor_file_another_writer_holds_marks_it_off_the_event_loop(
    app: Rhumbatron, reader: JetStreamContext
) -> None:
    # GIVEN a project root with three rows to publish, and its file's write lock held by
    #   another connection (another process's writer)
    root = billing_with_three_rows(app)
    holder = sqlite3.connect(root.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        # WHEN the publisher runs, THEN it sends the rows, and while their marks wait for the
        #   file the event loop keeps serving (the wait is on a worker thread)
        publishing = asyncio.create_task((await app.publisher()).publish_due(root))
        for _ in range(1_500):  # about 15 s at most
            if (await reader.stream_info("EVENTS_01")).state.messages == 3:
                break
            await asyncio.sleep(0.01)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not publishing.done()
        assert (await reader.stream_info("EVENTS_01")).state.messages == 3
        # AND once the lock is let go, the rows are marked published
        holder.execute("COMMIT")
        report = await asyncio.wait_for(publishing, 15)
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
    assert report.published == 3
    assert [r["state"] for r in outbox(root.connection)] == [RowState.PUBLISHED] * 3


# --------------------------------------------------------------------------- 100 rows per project


async def test_publish_due_sends_at_most_100_rows_per_project_per_call_in_outbox_order(
    app: Rhumbatron, reader: JetStreamContext, nudge: RecordingNudge
) -> None:
    # GIVEN 250 rows in one outbox
    shard = app.resource_shard(WEB, change_resource_key("chg-1"))
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(250))
    )
    publisher = await app.publisher()
    # WHEN publish_due runs four times
    sent = [(await publisher.publish_due(shard)).published for _ in range(4)]
    # THEN it sends 100, 100, 50, then nothing
    assert sent == [100, 100, 50, 0]
    # AND the stream holds them in outbox order
    ids_in_outbox = [r["event_id"] for r in outbox(shard.connection)]
    assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == ids_in_outbox
    # AND the router was nudged once per run that sent rows, not by the empty run
    assert nudge.nudged == [0, 0, 0]


async def test_two_projects_in_one_outbox_are_capped_separately(
    app: Rhumbatron, reader: JetStreamContext, nudge: RecordingNudge, clock: ManualClock
) -> None:
    # GIVEN one outbox holding 150 rows of acme-web and 150 of acme-billing
    #   (appended with the outbox's own append_facts, as a multi-project owner would)
    shard = app.resource_shard(WEB, change_resource_key("chg-1"))
    for project in (WEB, BILLING):
        append_ready_tasks(shard, CALLER, project, [f"tsk-{i:03d}" for i in range(150)], clock)
    publisher = await app.publisher()
    # WHEN publish_due runs
    first = await publisher.publish_due(shard)
    # THEN each project got its own 100 rows, on its own stream, and each stream one nudge
    assert first.published == 200
    assert len(await stored(reader, "EVENTS_00")) == 100
    assert len(await stored(reader, "EVENTS_01")) == 100
    assert sorted(nudge.nudged) == [0, 1]
    # AND the next run sends the remaining 50 + 50
    assert (await publisher.publish_due(shard)).published == 100
    assert sorted(nudge.nudged) == [0, 0, 1, 1]


# --------------------------------------------------------------------------- order across a retry


class RefuseRowOnce(SenderWrapper):
    """Wraps the real sender; the server refuses one row once (an injected failure of row k).

    A batch holding that row is refused whole, as JetStream's atomic batch is all or nothing.
    """

    def __init__(self, inner: JetStreamSender, refused_id: str) -> None:
        super().__init__(inner)
        self._refused_id = refused_id
        self.refusals_left = 1

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        if message.message_id == self._refused_id and self.refusals_left:
            self.refusals_left -= 1
            raise SendRefusedError(f"{message.message_id}: injected refusal")
        return await self.inner.send(stream, message)

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        if self.refusals_left and any(m.message_id == self._refused_id for m in messages):
            raise BatchRejectedError("injected refusal of the batch", None)
        return await self.inner.send_batch(stream, messages)


async def test_a_refused_row_k_holds_back_row_k_plus_1_and_order_survives_the_retry(
    app: Rhumbatron, reader: JetStreamContext, clock: ManualClock, nudge: RecordingNudge
) -> None:
    # GIVEN five rows, and a server that refuses row 3 once while row 4 would succeed
    shard = app.resource_shard(WEB, change_resource_key("chg-1"))
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(5))
    )
    ids = [r["event_id"] for r in outbox(shard.connection)]
    sender = RefuseRowOnce(JetStreamSender(await app.nats(), ack_timeout_s=5), ids[2])
    publisher = OutboxPublisher(
        sender, app.settings, clock=clock, nudge=nudge, rng=random.Random(7)
    )
    # WHEN publish_due runs
    first = await publisher.publish_due(shard)
    # THEN rows 1-2 are stored, row 3 waits to retry, and rows 4-5 were not sent
    assert (first.published, first.retry_wait) == (2, 1)
    assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == ids[:2]
    assert [r["state"] for r in outbox(shard.connection)] == [
        RowState.PUBLISHED,
        RowState.PUBLISHED,
        RowState.RETRY_WAIT,
        RowState.PENDING,
        RowState.PENDING,
    ]
    assert "injected refusal" in outbox(shard.connection)[2]["last_error"]
    # AND before the backoff (1 s ± 20 %) ends nothing more goes out
    assert (await publisher.publish_due(shard)).published == 0
    # WHEN the backoff has passed
    clock.advance(seconds=1.2)
    second = await publisher.publish_due(shard)
    # THEN rows 3-5 follow, and the stream holds all five in outbox order
    assert second.published == 3
    assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == ids
    assert counts_by_state(shard.connection)[RowState.PUBLISHED] == 5


async def test_a_project_waiting_to_retry_holds_back_no_other_project_of_its_outbox(
    app: Rhumbatron, reader: JetStreamContext, clock: ManualClock, nudge: RecordingNudge
) -> None:
    # GIVEN one outbox holding a row of acme-billing, then one of acme-web, and a server that
    #   refuses acme-billing's row once (order holds per project, not across projects: S2-042)
    shard = app.resource_shard(WEB, change_resource_key("chg-1"))
    append_ready_tasks(shard, CALLER, BILLING, ["tsk-b1"], clock)
    append_ready_tasks(shard, CALLER, WEB, ["tsk-w1"], clock)
    billing_id, web_id = [r["event_id"] for r in outbox(shard.connection)]
    sender = RefuseRowOnce(JetStreamSender(await app.nats(), ack_timeout_s=5), billing_id)
    publisher = OutboxPublisher(
        sender, app.settings, clock=clock, nudge=nudge, rng=random.Random(7)
    )
    # WHEN publish_due runs
    first = await publisher.publish_due(shard)
    # THEN acme-billing's row waits to retry, and acme-web's went out all the same
    assert (first.published, first.retry_wait) == (1, 1)
    assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == [web_id]
    assert await stored(reader, "EVENTS_01") == []
    # WHEN acme-web appends another row and publish_due runs inside acme-billing's backoff
    append_ready_tasks(shard, CALLER, WEB, ["tsk-w2"], clock)
    later_id = outbox(shard.connection)[-1]["event_id"]
    second = await publisher.publish_due(shard)
    # THEN acme-web's new row goes out while acme-billing's still waits, not attempted again
    assert second.published == 1
    assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == [web_id, later_id]
    waiting = outbox(shard.connection)[0]
    assert (waiting["event_id"], waiting["state"], waiting["attempts"]) == (
        billing_id,
        RowState.RETRY_WAIT,
        1,
    )
    # AND once the backoff (1 s ± 20 %) has passed, acme-billing's row follows on its stream
    clock.advance(seconds=1.2)
    assert (await publisher.publish_due(shard)).published == 1
    assert [m.msg_id for m in await stored(reader, "EVENTS_01")] == [billing_id]


async def test_a_send_the_stream_refuses_counts_an_attempt_and_retries(
    app: Rhumbatron, reader: JetStreamContext, clock: ManualClock, nudge: RecordingNudge
) -> None:
    # GIVEN EVENTS_00 takes no message over 64 bytes, so JetStream refuses the row (10054)
    root = app.project_root(WEB)
    root.create_project(CALLER, name="Web")
    config = (await reader.stream_info("EVENTS_00")).config
    config.max_msg_size = 64
    await reader.update_stream(config)
    publisher = await app.publisher()
    # WHEN the publisher runs
    report = await publisher.publish_due(root)
    # THEN the row is in retry_wait with one attempt and the stream's reason, and nobody was
    # nudged
    [row] = outbox(root.connection)
    assert report.retry_wait == 1
    assert (row["state"], row["attempts"]) == (RowState.RETRY_WAIT, 1)
    assert "maximum" in row["last_error"]
    assert nudge.nudged == []
    # WHEN the stream takes it again and the backoff has passed
    config.max_msg_size = -1
    await reader.update_stream(config)
    clock.advance(seconds=2)
    report = await publisher.publish_due(root)
    # THEN the row is published
    assert report.published == 1
    assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == [row["event_id"]]
    assert nudge.nudged == [0]


@pytest.mark.parametrize(
    ("mode", "rows"),
    [("atomic", 1), ("atomic", 2), ("atomic", 3), ("fast", 2), ("fast", 3)],
    ids=["one row alone", "an atomic batch of 2", "of 3", "a fast batch of 2", "of 3"],
)
async def test_a_row_is_never_stored_by_a_stream_other_than_its_projects(
    tmp_path: Path,
    nats_server: NatsServerProcess,
    reader: JetStreamContext,
    clock: ManualClock,
    mode: str,
    rows: int,
) -> None:
    # GIVEN a server whose EVENTS_00 is gone and whose stray stream binds its subject and
    #   takes batches of both kinds (a stream layout other than the one the publisher serves)
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url=nats_server.url, publish_batch_mode=mode
    )
    nudge = RecordingNudge()
    app = bootstrap(settings, clock=clock, nudge=nudge)
    try:
        await app.ensure_streams()
        shard = app.resource_shard(WEB, change_resource_key("chg-1"))
        shard.apply(
            CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(rows))
        )
        await reader.delete_stream("EVENTS_00")
        await reader.add_stream(
            name="STRAY", subjects=["events.00"], allow_atomic=True, allow_batched=True
        )
        # WHEN the publisher sends the project's rows
        report = await (await app.publisher()).publish_due(shard)
        # THEN JetStream refuses them (the stream that would store them is not EVENTS_00):
        #   the first row counts an attempt and waits for its retry, the rows behind it wait
        #   with it, and the stray stream stores nothing
        first, *behind = outbox(shard.connection)
        assert (report.published, report.retry_wait) == (0, 1)
        assert (first["state"], first["attempts"]) == (RowState.RETRY_WAIT, 1)
        assert "expected stream" in first["last_error"]
        assert [(r["state"], r["attempts"]) for r in behind] == [(RowState.PENDING, 0)] * len(
            behind
        )
        assert (await reader.stream_info("STRAY")).state.messages == 0
        assert nudge.nudged == []
    finally:
        await app.close()


async def test_a_repair_never_stores_an_event_in_a_stream_other_than_its_projects(
    app: Rhumbatron, reader: JetStreamContext
) -> None:
    # GIVEN a published row, then a server whose EVENTS_00 is gone and whose stray stream
    #   binds its subject
    root = app.project_root(WEB)
    root.create_project(CALLER, name="Web")
    assert (await (await app.publisher()).publish_due(root)).published == 1
    [row] = outbox(root.connection)
    await reader.delete_stream("EVENTS_00")
    await reader.add_stream(name="STRAY", subjects=["events.00"])
    # WHEN an operator's repair sends the row again
    # THEN JetStream refuses it, the stray stream stores nothing, and the row keeps its place
    sender = JetStreamSender(await app.nats(), ack_timeout_s=5)
    with pytest.raises(SendRefusedError, match="expected stream"):
        await republish_rows(root, sender, [row["event_id"]])
    assert (await reader.stream_info("STRAY")).state.messages == 0
    assert outbox(root.connection)[0]["stream_seq"] == row["stream_seq"] == 1


class StreamBackAfter(ManualClock):
    """The test's clock: the publisher's waits for the log pass at once, and after
    ``waits`` of them the missing stream is made again (the log is back)."""

    def __init__(self, clock: ManualClock, app: Rhumbatron, waits: int) -> None:
        super().__init__(clock.now())
        self.app, self.waits_left = app, waits
        self.waited: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.waited.append(seconds)
        await super().sleep(seconds)
        self.waits_left -= 1
        if self.waits_left == 0:
            await self.app.ensure_streams()


async def test_a_stream_nobody_answers_counts_no_attempt_and_its_row_goes_once_it_answers(
    tmp_path: Path, nats_server: NatsServerProcess, reader: JetStreamContext, clock: ManualClock
) -> None:
    # GIVEN EVENTS_00 is gone (as while no replica leads it): no responder answers a publish
    settings = load_settings(state_dir=tmp_path / "state", nats_url=nats_server.url)
    app = bootstrap(settings, clock=clock)
    try:
        await app.ensure_streams()
        root = app.project_root(WEB)
        root.create_project(CALLER, name="Web")
        await reader.delete_stream("EVENTS_00")
        # WHEN the publisher runs for longer than its wait for the log (30 s by default)
        report = await (await app.publisher()).publish_due(root)
        # THEN it sent again every 0.5 s without counting, then left the row pending
        [row] = outbox(root.connection)
        assert report.unavailable
        assert (report.retry_wait, report.failed) == (0, 0)
        assert (row["state"], row["attempts"], row["last_error"]) == (RowState.PENDING, 0, None)
        assert clock.now().timestamp() - row["created_at"] == pytest.approx(30.0)
    finally:
        await app.close()
    # WHEN another run finds the log back after three of its waits
    back = StreamBackAfter(clock, app, waits=3)
    app = bootstrap(settings, clock=back)
    try:
        report = await (await app.publisher()).publish_due(app.project_root(WEB))
        # THEN the row went in that run, with no attempt counted, after 3 waits of 0.5 s
        [row] = outbox(app.project_root(WEB).connection)
        assert (report.published, report.unavailable) == (1, False)
        assert (row["state"], row["attempts"]) == (RowState.PUBLISHED, 0)
        assert back.waited == [0.5, 0.5, 0.5]
        assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == [row["event_id"]]
    finally:
        await app.close()


async def test_a_batch_the_log_cannot_take_goes_one_by_one_once_the_log_is_back(
    tmp_path: Path, nats_server: NatsServerProcess, reader: JetStreamContext, clock: ManualClock
) -> None:
    # GIVEN three rows of a project, and EVENTS_00 gone (no responder answers their batch)
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url=nats_server.url, publish_batch_mode="atomic"
    )
    first = bootstrap(settings, clock=clock)
    try:
        await first.ensure_streams()
        root = first.project_root(WEB)
        root.create_project(CALLER, name="Web")
        root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    finally:
        await first.close()
    await reader.delete_stream("EVENTS_00")
    # WHEN the publisher runs, and the log is back after two of its waits
    back = StreamBackAfter(clock, first, waits=2)
    app = bootstrap(settings, clock=back)
    try:
        report = await (await app.publisher()).publish_due(app.project_root(WEB))
        # THEN the rows went one by one in that run, in order, with no attempt counted
        rows = outbox(app.project_root(WEB).connection)
        assert (report.published, report.unavailable, report.retry_wait) == (3, False, 0)
        assert [(r["state"], r["attempts"]) for r in rows] == [(RowState.PUBLISHED, 0)] * 3
        assert back.waited == [0.5, 0.5]
        assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == [
            r["event_id"] for r in rows
        ]
    finally:
        await app.close()


# --------------------------------------------------------------------------- duplicates


def forget_publication(actor: Actor, event_ids: Sequence[str] | None = None) -> None:
    """What a publisher killed after the PubAck and before marking leaves behind."""
    with write_transaction(actor.connection, actor.path) as db:
        where = (
            "" if event_ids is None else f" WHERE event_id IN ({','.join('?' * len(event_ids))})"
        )
        db.execute(
            "UPDATE outbox SET state = 'pending', published_at = NULL, stream_seq = NULL" + where,
            tuple(event_ids or ()),
        )


@pytest.mark.parametrize("rows", [1, 3])
async def test_a_re_publish_of_stored_events_is_dropped_by_the_duplicate_window(
    app: Rhumbatron, reader: JetStreamContext, rows: int
) -> None:
    # GIVEN rows already stored on the stream but still pending in the outbox
    shard = app.resource_shard(WEB, change_resource_key("chg-1"))
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(rows))
    )
    publisher = await app.publisher()
    assert (await publisher.publish_due(shard)).published == rows
    forget_publication(shard)
    # WHEN they are published again
    report = await publisher.publish_due(shard)
    # THEN JetStream acks each as a duplicate, the rows become published, the stream has 1 copy
    assert (report.published, report.duplicates) == (rows, rows)
    assert len(await stored(reader, "EVENTS_00")) == rows
    assert counts_by_state(shard.connection)[RowState.PUBLISHED] == rows


async def test_a_batch_holding_an_already_stored_row_is_resent_without_a_second_copy(
    app: Rhumbatron, reader: JetStreamContext
) -> None:
    # GIVEN row 1 stored (its mark lost) and rows 2-3 never sent
    root = app.project_root(WEB)
    root.create_project(CALLER, name="Web")
    publisher = await app.publisher()
    await publisher.publish_due(root)
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    ids = [r["event_id"] for r in outbox(root.connection)]
    forget_publication(root, ids[:1])
    # WHEN the three go out together (the atomic batch is refused for the stored ID)
    report = await publisher.publish_due(root)
    # THEN row 1 is acked as a duplicate, rows 2-3 are stored after it, once each, in order
    assert (report.published, report.duplicates) == (3, 1)
    assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == ids


# --------------------------------------------------------------------------- nudge


async def test_the_router_is_nudged_once_per_stream_only_after_a_run_that_sent_rows(
    app: Rhumbatron, nudge: RecordingNudge
) -> None:
    root = app.project_root(BILLING)
    publisher = await app.publisher()
    # GIVEN nothing to send: no nudge
    await publisher.publish_due(root)
    assert nudge.nudged == []
    # WHEN three rows are sent in one run: one nudge, for stream 1
    root.create_project(CALLER, name="Billing")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    report = await publisher.publish_due(root)
    assert report.nudged == [1]
    assert nudge.nudged == [1]
    # AND a run with nothing left sends no nudge
    await publisher.publish_due(root)
    assert nudge.nudged == [1]


async def test_two_projects_of_one_stream_in_one_run_nudge_that_stream_once(
    app: Rhumbatron, reader: JetStreamContext, nudge: RecordingNudge, clock: ManualClock
) -> None:
    # GIVEN one outbox holding rows of two projects that share stream 0
    mobile = "acme-mobile"
    assert stream_index(mobile) == stream_index(WEB) == 0
    shard = app.resource_shard(WEB, change_resource_key("chg-1"))
    for project in (WEB, mobile):
        append_ready_tasks(shard, CALLER, project, ["tsk-1"], clock)
    publisher = await app.publisher()
    # WHEN one publish_due sends both projects' rows
    report = await publisher.publish_due(shard)
    # THEN both rows are on EVENTS_00 and the router was nudged once for stream 0
    assert report.published == 2
    assert len(await stored(reader, "EVENTS_00")) == 2
    assert report.nudged == [0]
    assert nudge.nudged == [0]


# --------------------------------------------------------------------------- NATS down


async def test_with_nats_unreachable_publish_due_reports_unavailable_and_counts_no_attempt(
    app: Rhumbatron, nats_server: NatsServerProcess, nudge: RecordingNudge, clock: ManualClock
) -> None:
    # GIVEN a connected publisher whose server then goes away
    publisher = await app.publisher()
    nc = await app.nats()
    root = app.project_root(WEB)
    root.create_project(CALLER, name="Web")
    nats_server.stop()
    await eventually(lambda: not nc.is_connected)
    try:
        # WHEN the publisher runs again and again over a long outage
        reports = []
        for _ in range(12):
            reports.append(await publisher.publish_due(root))
            clock.advance(minutes=5)
        # THEN each run reports unavailable; the row stays pending with no attempt counted
        assert all(r.unavailable and r.published == 0 for r in reports)
        [row] = outbox(root.connection)
        assert (row["state"], row["attempts"]) == (RowState.PENDING, 0)
        assert nudge.nudged == []
    finally:
        nats_server.start()
        await eventually(lambda: nc.is_connected)


async def test_a_state_change_commits_while_nats_is_down_and_is_published_after(
    app: Rhumbatron, nats_server: NatsServerProcess, reader: JetStreamContext
) -> None:
    publisher = await app.publisher()
    nc = await app.nats()
    nats_server.stop()
    await eventually(lambda: not nc.is_connected)
    try:
        # GIVEN NATS is down
        # WHEN a state change happens
        root = app.project_root(WEB)
        result = root.create_project(CALLER, name="Web")
        # THEN it commits with its outbox row; publishing it waits
        assert root.state() is not None
        assert result.events_added == 1
        assert (await publisher.publish_due(root)).unavailable
    finally:
        nats_server.start()
        await eventually(lambda: nc.is_connected)
    # WHEN NATS is back
    report = await publisher.publish_due(root)
    # THEN the kept row is published (the outbox kept it for later, S0-056)
    assert report.published == 1
    [row] = outbox(root.connection)
    assert [m.msg_id for m in await stored(reader, "EVENTS_00")] == [row["event_id"]]


async def test_shard_writes_are_published_under_their_own_actor_key(app: Rhumbatron) -> None:
    # GIVEN a Change's facts in the shard that owns change:chg-1 (shard 9 of 16)
    shard = app.resource_shard(WEB, change_resource_key("chg-1"))
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(1))
    )
    # WHEN that shard publishes
    report = await (await app.publisher()).publish_due(shard)
    # THEN the report is the shard's and its row went out
    assert report.actor_key == "resource_shard:acme-web:09"
    assert report.published == 1


# --------------------------------------------------------------------------- concurrent drain


async def test_the_local_invoker_drains_many_actors_at_once_without_loss_or_reordering(
    app: Rhumbatron, reader: JetStreamContext
) -> None:
    # GIVEN six actors (three projects, two Changes each) with 250 rows apiece: more than
    # publish_concurrency actors, and more rows than one call's 100-row cap
    caller = Caller("acme", "system:test", "corr-drain")
    shards = []
    for project in ("drain-a", "drain-b", "drain-c"):
        for change in ("c1", "c2"):
            shard = app.resource_shard(project, change_resource_key(f"{project}-{change}"))
            for batch in range(5):
                shard.apply(
                    caller,
                    AppendChangeEvents(
                        change_id=f"{project}-{change}",
                        status="planned",
                        facts=task_facts(50, prefix=f"b{batch}"),
                    ),
                )
            shards.append(shard)

    # WHEN the local invoker fires the announced alarms, up to 4 actors at once
    reports = await app.drain_alarms()

    # THEN every row is published exactly once, no two publishers met on one actor,
    # and each actor's rows sit on its project's stream in outbox order
    assert sum(r.published for r in reports) == 6 * 250
    assert not any(r.busy or r.duplicates or r.failed for r in reports)
    for shard in shards:
        rows = outbox(shard.connection)
        assert {r["state"] for r in rows} == {"published"}
        on_stream = [
            s.msg_id
            for s in await stored(reader, f"EVENTS_{stream_index(shard.ref.project_id):02d}")
        ]
        mine = [r["event_id"] for r in rows]
        assert [m for m in on_stream if m in set(mine)] == mine
