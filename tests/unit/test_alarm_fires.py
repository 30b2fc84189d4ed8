"""What one alarm fire does to an actor, through the composition root (the local invoker and
the every-minute scan), with an in-memory sender where the server's answers are the point."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from outbox_rows import append_ready_tasks
from rhumbatron.actors.alarms import AlarmGuard, FireDecision, RecordingAlarmSink
from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.publisher import PublishReport
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.clock import ManualClock, utc_day
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import create_project
from rhumbatron.domain.transition import Transition
from rhumbatron.errors import ActorError, NatsUnavailableError, SendRefusedError
from rhumbatron.messaging.nudge import RecordingNudge
from rhumbatron.messaging.sender import FastBatchAck, OutgoingMessage, StoredMessage
from rhumbatron.protocol.ids import stream_index
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.testing import MemorySender, RefuseFirstRowOnce, SenderWrapper

CALLER = Caller("acme", "system:test", "corr-fires")


def runtime(
    tmp_path: Path, clock: ManualClock, sender: object, nudge: RecordingNudge | None = None
) -> Rhumbatron:
    settings = load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")
    return bootstrap(
        settings,
        clock=clock,
        alarms=RecordingAlarmSink(),
        sender=sender,  # type: ignore[arg-type]
        nudge=nudge,
    )


def write_tasks(app: Rhumbatron, project: str, change: str, count: int) -> None:
    shard = app.resource_shard(project, change_resource_key(change))
    for start in range(0, count, 50):
        facts = tuple(
            ChangeFact("task.ready", {}, task_id=f"t-{i:04d}")
            for i in range(start, min(start + 50, count))
        )
        shard.apply(CALLER, AppendChangeEvents(change_id=change, status="planned", facts=facts))


async def test_a_row_waiting_out_its_backoff_does_not_make_its_alarm_fire_in_a_loop(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor whose first row is refused once, with rows pending behind it
    memory = MemorySender()
    app = runtime(tmp_path, clock, RefuseFirstRowOnce(memory))
    write_tasks(app, "loop-p", "chg-1", 3)
    shard = app.resource_shard("loop-p", change_resource_key("chg-1"))

    # WHEN the local invoker drains the announced alarms
    await app.drain_alarms()

    # THEN the refused row waits, the rows behind it wait too, the alarm waits for the
    # retry time, and one fire was counted, not the whole day's budget
    counts = counts_by_state(shard.connection)
    assert (counts[RowState.RETRY_WAIT], counts[RowState.PENDING]) == (1, 2)
    assert AlarmGuard.fires_on(shard.connection, utc_day(clock.now())) == (1, 0)
    assert memory.sent == []

    # AND once the backoff is over, the scan publishes all three in order
    clock.advance(seconds=5)
    scan = await app.fire_due_alarms()
    assert [r.published for r in scan.reports] == [3]
    assert [m.message_id for m in memory.sent] == [
        r["event_id"] for r in shard.connection.execute("SELECT event_id FROM outbox ORDER BY seq")
    ]
    await app.close()


class LosesConnectionAfter(SenderWrapper):
    """Refuses batches (so rows go one by one) and loses the connection after ``stores``
    single sends were stored."""

    def __init__(self, inner: MemorySender, stores: int) -> None:
        super().__init__(inner)
        self.stores_left = stores

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        if not self.stores_left:
            raise NatsUnavailableError("the connection was lost by the test server")
        self.stores_left -= 1
        return await self.inner.send(stream, message)

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        raise SendRefusedError("batch refused by the test server")

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        raise SendRefusedError("fast batch refused by the test server")


async def test_rows_stored_before_the_connection_is_lost_are_marked_and_the_rest_wait(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor with three due rows, and a server that stores two and then goes away
    memory = MemorySender()
    app = runtime(tmp_path, clock, LosesConnectionAfter(memory, stores=2))
    write_tasks(app, "lost-p", "chg-1", 3)
    shard = app.resource_shard("lost-p", change_resource_key("chg-1"))

    # WHEN its alarm fires
    [report] = await app.drain_alarms()

    # THEN the two stored rows are published at their stream places, and the third waits
    # pending with no attempt counted (an unreachable server is no refusal)
    assert report.unavailable and report.published == 2
    rows = shard.connection.execute("SELECT state, attempts, stream_seq FROM outbox ORDER BY seq")
    assert [tuple(row) for row in rows] == [
        (RowState.PUBLISHED, 0, 1),
        (RowState.PUBLISHED, 0, 2),
        (RowState.PENDING, 0, None),
    ]
    await app.close()


async def test_a_projects_rows_stored_before_another_project_lost_the_connection_are_marked(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN one outbox holding a row of each of two projects, and a server that stores one
    #   send and then goes away
    memory = MemorySender()
    app = runtime(tmp_path, clock, LosesConnectionAfter(memory, stores=1))
    shard = app.resource_shard("lost-p", change_resource_key("chg-1"))
    for project in ("lost-p", "other-p"):
        append_ready_tasks(shard, CALLER, project, ["t-1"], clock)
    # WHEN the publisher runs: the first project's row is stored, the second's send is lost
    report = await (await app.publisher()).publish_due(shard)
    # THEN the stored row is marked published, and the other waits with no attempt counted
    assert (report.published, report.unavailable) == (1, True)
    rows = shard.connection.execute("SELECT project_id, state, attempts FROM outbox ORDER BY seq")
    assert [tuple(row) for row in rows] == [
        ("lost-p", RowState.PUBLISHED, 0),
        ("other-p", RowState.PENDING, 0),
    ]
    await app.close()


@pytest.mark.parametrize("path", ["local invoker", "every-minute scan"])
async def test_one_alarm_fire_publishes_past_the_per_call_cap(
    tmp_path: Path, clock: ManualClock, path: str
) -> None:
    # GIVEN an actor with 350 due rows (the per-call cap is 100 per project)
    memory = MemorySender()
    app = runtime(tmp_path, clock, memory)
    write_tasks(app, "cap-p", "chg-1", 350)
    shard = app.resource_shard("cap-p", change_resource_key("chg-1"))

    # WHEN its alarm fires once
    if path == "local invoker":
        reports = await app.drain_alarms()
    else:
        reports = (await app.fire_due_alarms()).reports

    # THEN all 350 go out in that one fire (four calls), counted as one fire
    assert [r.published for r in reports] == [350]
    assert len(memory.sent) == 350
    assert AlarmGuard.fires_on(shard.connection, utc_day(clock.now())) == (1, 0)
    await app.close()


@pytest.mark.parametrize("path", ["local invoker", "every-minute scan", "one actor's alarm"])
async def test_a_run_nudges_each_stream_it_moved_once_when_it_ends(
    tmp_path: Path, clock: ManualClock, path: str
) -> None:
    # GIVEN three changes of one project (three shard actors, one stream), 250 due rows in one
    # of them (three publishes past the per-call cap), and a second project
    memory, nudge = MemorySender(), RecordingNudge()
    app = runtime(tmp_path, clock, memory, nudge)
    write_tasks(app, "nudge-p", "chg-1", 250)
    for change in ("chg-2", "chg-3"):
        write_tasks(app, "nudge-p", change, 2)
    write_tasks(app, "nudge-q", "chg-1", 2)
    streams = {stream_index("nudge-p"), stream_index("nudge-q")}

    # WHEN the run publishes them
    if path == "local invoker":
        published = sum(r.published for r in await app.drain_alarms())
    elif path == "every-minute scan":
        published = sum(r.published for r in (await app.fire_due_alarms()).reports)
    else:
        key = app.resource_shard("nudge-p", change_resource_key("chg-1")).ref.key
        published = (await app.fire_alarm(key)).published
        streams = {stream_index("nudge-p")}

    # THEN every row went out, and the router was nudged once per stream the run moved,
    # not once per actor or per 100-row publish
    assert published == len(memory.sent) == (250 if path == "one actor's alarm" else 256)
    assert sorted(nudge.nudged) == sorted(streams)
    await app.close()


async def test_a_fire_called_on_its_own_nudges_the_streams_it_moved_unless_told_to_leave_them(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor with due rows, and a publisher that can nudge the router
    memory, nudge = MemorySender(), RecordingNudge()
    app = runtime(tmp_path, clock, memory, nudge)
    write_tasks(app, "own-p", "chg-1", 2)
    shard = app.resource_shard("own-p", change_resource_key("chg-1"))
    publisher = await app.publisher()
    # WHEN a fire is told to leave the nudges to its caller (as a run's drain does)
    left = await publisher.fire_alarm(shard, nudge=False)
    # THEN it names the stream it moved and nudges nobody
    assert (left.published, left.nudged, nudge.nudged) == (2, [stream_index("own-p")], [])
    # WHEN another change is written and its actor's fire is called on its own
    write_tasks(app, "own-p", "chg-2", 1)
    fired = await publisher.fire_alarm(app.resource_shard("own-p", change_resource_key("chg-2")))
    # THEN it nudges the router for that stream itself
    assert fired.published == 1
    assert nudge.nudged == [stream_index("own-p")]
    await app.close()


async def test_a_write_committed_between_the_guards_read_and_its_write_is_published_by_that_fire(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The guard decides first from reads alone, then again inside its write transaction: a
    write another process commits in between (after a read that saw no due work) must not
    lose its alarm, and the fire publishes it."""
    # GIVEN an actor file with nothing written yet (a fire would find nothing due)
    memory = MemorySender()
    app = runtime(tmp_path, clock, memory)
    root = app.project_root("race-p")
    assert sum(counts_by_state(root.connection).values()) == 0
    publisher = await app.publisher()
    # AND another handle on the file (another process's writer) holding the write lock over
    #   a project.created it has not committed yet
    holding, go = threading.Event(), threading.Event()

    def write_elsewhere() -> None:
        other = ProjectRoot(root.ref, app.settings, clock=clock)

        def decide(db: sqlite3.Connection) -> Transition:
            holding.set()
            if not go.wait(timeout=30):
                raise AssertionError("the fire never started its write transaction")
            return create_project(None, FactContext(CALLER, "race-p", clock.now()), name="Race")

        try:
            other.transact(decide)
        finally:
            other.close()

    writer = threading.Thread(target=write_elsewhere)
    writer.start()
    assert await asyncio.to_thread(holding.wait, 30)
    # WHEN the alarm fires, and the writer commits as the fire begins its write transaction
    #   (after its read-only decision, which saw no due row)
    statements: list[str] = []

    def on_statement(sql: str) -> None:
        statements.append(sql)
        if sql.startswith("BEGIN IMMEDIATE"):
            go.set()

    root.connection.set_trace_callback(on_statement)
    try:
        report = await publisher.fire_alarm(root)
    finally:
        root.connection.set_trace_callback(None)
        go.set()
        await asyncio.to_thread(writer.join, 30)
    # THEN the guard, deciding again inside its write, admitted the fire, counted it once,
    #   and the fire published the row written meanwhile
    assert any(s.startswith("SELECT") for s in statements[: statements.index("BEGIN IMMEDIATE")])
    assert (report.alarm, report.published) == (FireDecision.FIRE, 1)
    assert [m.message_id for m in memory.sent] == [
        row[0] for row in root.connection.execute("SELECT event_id FROM outbox")
    ]
    assert counts_by_state(root.connection)[RowState.PUBLISHED] == 1
    assert AlarmGuard.fires_on(root.connection, utc_day(clock.now())) == (1, 0)
    await app.close()


async def test_a_publish_while_another_publisher_holds_the_actor_is_busy_and_sends_nothing(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor with due rows, whose publish lock another publisher holds
    memory = MemorySender()
    app = runtime(tmp_path, clock, memory)
    write_tasks(app, "busy-p", "chg-1", 2)
    shard = app.resource_shard("busy-p", change_resource_key("chg-1"))
    publisher = await app.publisher()
    with shard.publish_lock() as held:
        assert held
        # WHEN a publish and an alarm fire come for it meanwhile
        published = await publisher.publish_due(shard)
        fired = await publisher.fire_alarm(shard)
    # THEN each reports the actor busy, with nothing else done, and nothing was sent
    assert published == fired == PublishReport(shard.ref.key, busy=True)
    assert memory.sent == []
    assert counts_by_state(shard.connection)[RowState.PENDING] == 2
    await app.close()


async def test_a_publish_counts_every_row_it_failed_the_unsendable_and_the_refused_alike(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor whose first row is too big for the server to ever take, and whose next
    #   is refused at its last allowed attempt
    memory = MemorySender(max_payload=2_000)
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", outbox_max_attempts=1
    )
    app = bootstrap(
        settings, clock=clock, alarms=RecordingAlarmSink(), sender=RefuseFirstRowOnce(memory)
    )
    shard = app.resource_shard("fail-p", change_resource_key("chg-1"))
    for task_id, role in (("t-big", "x" * 2_500), ("t-small", "builder")):
        shard.apply(
            CALLER,
            AppendChangeEvents(
                change_id="chg-1",
                status="planned",
                facts=(ChangeFact("task.ready", {"agent_role": role}, task_id=task_id),),
            ),
        )

    # WHEN one publish runs
    report = await (await app.publisher()).publish_due(shard)

    # THEN the report counts both failed rows: the one failed unsent and the refused one
    assert (report.failed, report.retry_wait, report.published) == (2, 0, 0)
    assert counts_by_state(shard.connection)[RowState.FAILED] == 2
    assert memory.sent == []
    await app.close()


class _WritingNudge(RecordingNudge):
    """A router whose first nudge makes an actor write again: as a reaction does, or as the
    actors' steady writes do while the local invoker drains."""

    def __init__(self, write_again: Callable[[], None]) -> None:
        super().__init__()
        self._write_again: Callable[[], None] | None = write_again

    async def nudge(self, stream_index: int) -> None:
        await super().nudge(stream_index)
        if self._write_again is not None:
            write, self._write_again = self._write_again, None
            write()


async def test_the_local_invoker_nudges_after_each_round_not_only_when_the_drain_ends(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an announced alarm, and a router whose nudge makes the actor write once more
    memory = MemorySender()
    app: Rhumbatron | None = None

    def write_again() -> None:
        assert app is not None
        write_tasks(app, "round-p", "chg-2", 1)

    nudge = _WritingNudge(write_again)
    app = runtime(tmp_path, clock, memory, nudge)
    write_tasks(app, "round-p", "chg-1", 3)

    # WHEN the local invoker drains
    reports = await app.drain_alarms()

    # THEN the router heard of the first round's rows as that round ended (before the row
    #   written meanwhile was fired), and of the second round's as it ended
    assert [r.published for r in reports] == [3, 1]
    assert nudge.nudged == [stream_index("round-p")] * 2
    assert len(memory.sent) == 4
    await app.close()


async def test_an_alarm_for_an_actor_that_has_no_file_is_refused_and_creates_nothing(
    tmp_path: Path, clock: ManualClock
) -> None:
    app = runtime(tmp_path, clock, MemorySender())
    with pytest.raises(ActorError, match="no actor file for project_root:typo-project"):
        await app.fire_alarm("project_root:typo-project")
    with pytest.raises(ActorError, match="shard 99, but projects have 16 shards"):
        await app.fire_alarm("resource_shard:p1:99")
    with pytest.raises(ActorError, match="shard 16, but projects have 16 shards"):
        await app.fire_alarm("resource_shard:p1:16")  # shards are numbered 0 to 15
    with pytest.raises(ActorError, match="no actor file for resource_shard:p1:15"):
        await app.fire_alarm("resource_shard:p1:15")
    with pytest.raises(ActorError, match="resource_shard:p1:-3"):
        await app.fire_alarm("resource_shard:p1:-3")
    assert list(app.actor_refs()) == []
    assert not (tmp_path / "state" / "projects").exists()
    await app.close()


async def test_a_damaged_actor_file_is_reported_and_the_scan_publishes_the_others(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN three projects with due rows, one of whose root files is garbage
    memory = MemorySender()
    app = runtime(tmp_path, clock, memory)
    for project in ("ok-a", "bad-b", "ok-c"):
        app.project_root(project).create_project(CALLER, name=project)
    await app.close()
    damaged = ProjectRoot.ref_for("bad-b").path(app.settings.state_dir)
    damaged.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        damaged.with_name(damaged.name + suffix).unlink(missing_ok=True)

    # WHEN the every-minute scan runs
    scan = await app.fire_due_alarms()

    # THEN the damaged actor gets a report naming its error, and the others are published
    by_actor = {r.actor_key: r for r in scan.reports}
    assert by_actor["project_root:bad-b"].error is not None
    assert "not a database" in by_actor["project_root:bad-b"].error
    assert (by_actor["project_root:ok-a"].published, by_actor["project_root:ok-c"].published) == (
        1,
        1,
    )
    assert app.open_actor_count == 0
    await app.close()
