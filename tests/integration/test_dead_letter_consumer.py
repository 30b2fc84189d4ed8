"""The dead-letter queue's consumer against a real nats-server and real SQLite files (spec
"Dead-letter path", the router notes on dead-letter closure; RELIABILITY F13).

Commands reach the dead-letter queue the real way: a handler that fails on every delivery of
its origin queue, with the retry delay set to 0 so the runtime's nak redelivers at once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents, RecordTaskStatus
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.tasks import DEAD_LETTER_LIMIT, TaskStatus
from rhumbatron.messaging.commands import DELIVERIES_HEADER, LAST_ERROR_HEADER, ORIGIN_QUEUE_HEADER
from rhumbatron.messaging.nudge import RecordingNudge
from rhumbatron.messaging.queue_consumer import Delivery, QueueConsumerRuntime, Retry
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.product.dead_letters import (
    DeadLetter,
    DeadLetterKind,
    DeadLetterStatus,
    command_dead_letter_id,
    dismiss_dead_letter,
    list_dead_letters,
    record_command_dead_letter,
    record_poison_event,
)
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.queue_consumers import DEAD_LETTER_QUEUE, consumer_name
from rhumbatron.queues import (
    DeadLetterConsumer,
    close_letters_of_ended_changes,
    run_dead_letter_consumer,
    supersede_letters_of_change,
)
from rhumbatron.queues.dead_letter import (
    record_undecodable_command,
    undecodable_dead_letter_id,
)
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron.runtime.product_schema import open_product_database
from rhumbatron_dev.local.nats_server import NatsServerProcess
from server_counts import settles_to

from .test_queue_consumer import poll_until

pytestmark = pytest.mark.integration

PROJECT = "acme-web"
CHANGE = "chg-1"
TASK = "tsk-1"
CALLER = Caller("acme", "system:test", correlation_id="corr-dead-letters")


@pytest.fixture
def settings(tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    """The shared settings, with every retry delay 0: a nak redelivers at once."""
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        queue_retry_delay_s={"integration": 0.0, "agent-wakeups": 0.0, DEAD_LETTER_QUEUE: 0.0},
    )


@pytest_asyncio.fixture
async def app(
    settings: Settings, clock: ManualClock, nudge: RecordingNudge
) -> AsyncIterator[Rhumbatron]:
    runtime = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink(), nudge=nudge)
    await runtime.ensure_streams()
    yield runtime
    await runtime.close()


# --------------------------------------------------------------------------- helpers


def wake(clock: ManualClock, *, task_id: str | None = TASK, attempt: int = 1) -> Command:
    """The dispatcher's wake of a Task (``cmd_<task>_ready``) on agent-wakeups."""
    return Command.create(
        command_id=f"cmd_{task_id or 'none'}_ready",
        command_type="agent.wake",
        project_id=PROJECT,
        change_id=CHANGE,
        task_id=task_id,
        attempt=attempt,
        created_at=clock.now(),
        payload={"agentId": "agent-7", "reason": "task_ready"},
    )


def settle(clock: ManualClock, *, change_id: str = CHANGE, attempt: int = 1) -> Command:
    return Command.create(
        command_id=f"cmd_settle_{change_id}",
        command_type="change.settle",
        project_id=PROJECT,
        change_id=change_id,
        attempt=attempt,
        created_at=clock.now(),
        payload={"reason": "quiet"},
    )


def given_project(app: Rhumbatron) -> None:
    app.project_root(PROJECT).create_project(CALLER, name="Acme web")


def given_change(app: Rhumbatron, change_id: str = CHANGE, status: str = "running") -> None:
    shard(app, change_id).apply(
        CALLER, AppendChangeEvents(change_id=change_id, status=status, facts=())
    )


def given_task(app: Rhumbatron, status: TaskStatus) -> None:
    """A Task of CHANGE in ``status``, through the moves the lifecycle makes."""
    path = [TaskStatus.READY, TaskStatus.ASSIGNED, TaskStatus.RUNNING]
    for step in path[: path.index(status) + 1]:
        shard(app).apply(
            CALLER,
            RecordTaskStatus(change_id=CHANGE, task_id=TASK, status=step, agent_id="agent-7"),
        )


def shard(app: Rhumbatron, change_id: str = CHANGE) -> ResourceShard:
    return app.resource_shard(PROJECT, change_resource_key(change_id))


def task_failed_rows(app: Rhumbatron) -> list[Any]:
    query = "SELECT * FROM outbox WHERE event_type = 'task.failed'"
    return list(shard(app).connection.execute(query))


def letters(app: Rhumbatron) -> list[DeadLetter]:
    return list_dead_letters(app.product().connection, status=None)


async def always_fails(command: Command, delivery: Delivery) -> Retry | None:
    raise RuntimeError(f"boom on delivery {delivery.delivered}")


async def drive_to_dead_letter(app: Rhumbatron, command: Command, queue: str) -> None:
    """Send ``command`` to ``queue`` and fail every delivery until the runtime moves it to
    the dead-letter queue (1 + 3 retries)."""
    await (await app.command_bus()).send(queue, command)
    runtime = await app.queue_runtime()
    totals = {"fetched": 0, "retried": 0, "dead_lettered": 0}
    # JetStream handles a nak on a queue of its own: right after one, a no-wait pull can
    # come back empty. Poll (a bounded number of times) until the 4th delivery is done.
    for _ in range(500):
        report = await runtime.poll(queue, always_fails)
        for name in totals:
            totals[name] += getattr(report, name)
        if totals["dead_lettered"]:
            break
    assert totals == {"fetched": 4, "retried": 3, "dead_lettered": 1}


async def commands_state(app: Rhumbatron) -> tuple[int, int]:
    """``(messages held, last sequence)`` of the COMMANDS stream."""
    info = await (await app.nats()).jetstream().stream_info(COMMAND_STREAM)
    assert info.state.messages is not None and info.state.last_seq is not None
    return info.state.messages, info.state.last_seq


async def held_by_subject(app: Rhumbatron) -> dict[str, int]:
    """Messages the COMMANDS stream holds, by subject."""
    js = (await app.nats()).jetstream()
    info = await js.stream_info(COMMAND_STREAM, subjects_filter="cmd.>")
    return dict(info.state.subjects or {})


async def pending_of(app: Rhumbatron, queue: str) -> tuple[int, int]:
    """``(pending, waiting for an ack)`` of the queue's durable consumer."""
    info = await (await app.nats()).jetstream().consumer_info(COMMAND_STREAM, consumer_name(queue))
    return info.num_pending or 0, info.num_ack_pending or 0


def bare_runtime(app: Rhumbatron, nc: Any, bus: Any) -> QueueConsumerRuntime:
    return QueueConsumerRuntime(nc, app.settings, app.clock, bus)


def dead_letter_delivery(headers: dict[str, str] | None = None, seq: int = 9) -> Delivery:
    """A delivery of the dead-letter queue, for calling the consumer directly."""
    return Delivery(DEAD_LETTER_QUEUE, seq, delivered=1, max_deliveries=5, headers=headers or {})


def consumer_log(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """What the dead-letter consumer told the operator, in order."""
    return [
        (record.levelno, record.getMessage())
        for record in caplog.records
        if record.name == "rhumbatron.queues.dead_letter"
    ]


def shard_path(settings: Settings, change_id: str) -> Path:
    return ResourceShard.ref_for(
        PROJECT, change_resource_key(change_id), settings.resource_shard_count
    ).path(settings.state_dir)


# --------------------------------------------------------------------------- F13


async def test_a_command_failing_every_delivery_becomes_exactly_one_open_dead_letter(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a project with an open Change, and a change.settle that fails on every delivery
    given_project(app)
    given_change(app)
    command = settle(clock)
    # WHEN its 4th delivery fails
    await drive_to_dead_letter(app, command, "integration")
    # THEN the work-queue message is gone and the command waits on the dead-letter queue
    assert await pending_of(app, "integration") == (0, 0)
    assert await held_by_subject(app) == {"cmd.dead-letter": 1}
    _, last_seq = await commands_state(app)
    # WHEN the dead-letter consumer runs
    report = await run_dead_letter_consumer(app)
    # THEN it wrote exactly one letter, from the origin queue's headers (F13, S0-201)
    assert report.done == 1
    (letter,) = letters(app)
    assert letter.dead_letter_id == command_dead_letter_id(command.command_id)
    assert letter.kind is DeadLetterKind.COMMAND
    assert letter.command_id == command.command_id
    assert letter.command_type == "change.settle"
    assert letter.queue == "integration"
    assert letter.attempt == 1
    assert (letter.tenant_id, letter.project_id, letter.change_id) == ("acme", PROJECT, CHANGE)
    assert letter.task_id is None
    assert "after 4 deliveries" in letter.reason
    assert "RuntimeError: boom on delivery 4" in letter.reason
    assert Command.parse(letter.body) == command
    # AND the letter stays open: writing it is not the command succeeding
    assert letter.status is DeadLetterStatus.OPEN
    # AND COMMANDS holds nothing, and nothing new was sent: the consumer never re-sends
    await settles_to(lambda: commands_state(app), (0, last_seq))
    assert await pending_of(app, DEAD_LETTER_QUEUE) == (0, 0)


# --------------------------------------------------------------------------- Task outcomes


@pytest.mark.parametrize("status", [TaskStatus.READY, TaskStatus.ASSIGNED])
async def test_a_redelivered_dead_letter_blocks_a_ready_or_assigned_task_once(
    app: Rhumbatron, clock: ManualClock, status: TaskStatus
) -> None:
    # GIVEN a ready (or assigned) Task whose wake failed on every delivery
    given_project(app)
    given_change(app)
    given_task(app, status)
    command = wake(clock)
    await drive_to_dead_letter(app, command, "agent-wakeups")
    # WHEN the dead-letter message is delivered twice (the first ack is lost: nak instead)
    bus = await app.command_bus()
    consumer = DeadLetterConsumer(app)
    seen: list[int] = []

    async def lose_first_ack(command: Command, delivery: Delivery) -> Retry | None:
        await consumer(command, delivery)
        seen.append(delivery.delivered)
        return Retry(0.0, "ack lost") if delivery.delivered == 1 else None

    runtime = bare_runtime(app, bus.nc, bus)
    try:
        # The server handles a nak asynchronously: the redelivery may trail the next fetch.
        async def delivered_twice() -> bool:
            return len(seen) == 2

        await poll_until(runtime, DEAD_LETTER_QUEUE, lose_first_ack, delivered_twice)
    finally:
        await runtime.close()
    # THEN both deliveries ran, and wrote one letter
    assert seen == [1, 2]
    (letter,) = letters(app)
    assert letter.task_id == TASK
    assert letter.queue == "agent-wakeups"
    # AND the Task is blocked by the dead_letter limit with the letter's reason (S0-202)
    task = shard(app).task_state(TASK)
    assert task is not None
    assert task.status is TaskStatus.BLOCKED
    assert task.blocked_limit == DEAD_LETTER_LIMIT
    assert task.reason == letter.reason
    # AND task.failed is in the shard's outbox exactly once (S0-203)
    (row,) = task_failed_rows(app)
    fact = row["envelope"]
    assert b'"blockedLimit":"dead_letter"' in fact
    assert b'"agentId":"agent-7"' in fact
    # AND the Change carries no reason: the Task does (S0-208)
    assert shard(app).change_reason(CHANGE) == ""


async def test_a_running_task_is_left_running_and_the_change_gets_the_reason(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a running Task whose wake failed on every delivery
    given_project(app)
    given_change(app)
    given_task(app, TaskStatus.RUNNING)
    await drive_to_dead_letter(app, wake(clock), "agent-wakeups")
    # WHEN the dead-letter consumer runs
    await run_dead_letter_consumer(app)
    # THEN the reason is on the Change; the Task still runs; no task.failed (S0-207, S0-208)
    (letter,) = letters(app)
    assert shard(app).change_reason(CHANGE) == letter.reason
    task = shard(app).task_state(TASK)
    assert task is not None
    assert (task.status, task.blocked_limit, task.reason) == (TaskStatus.RUNNING, None, "")
    assert task_failed_rows(app) == []


async def test_a_command_without_a_task_puts_the_reason_on_the_change(
    app: Rhumbatron, clock: ManualClock
) -> None:
    given_project(app)
    given_change(app)
    await drive_to_dead_letter(app, settle(clock), "integration")
    await run_dead_letter_consumer(app)
    # THEN the Change carries the letter's reason, its status unchanged (S0-206)
    (letter,) = letters(app)
    assert shard(app).change_reason(CHANGE) == letter.reason
    state = shard(app).change_state(CHANGE)
    assert state is not None and state.status == "running"
    assert task_failed_rows(app) == []


async def test_a_command_without_a_change_gets_only_the_letter(
    app: Rhumbatron, clock: ManualClock, settings: Settings
) -> None:
    # GIVEN a project.provision (no Change, no project root yet) that fails every delivery
    command = Command.create(
        command_id="cmd_provision_acme-web",
        command_type="project.provision",
        project_id=PROJECT,
        created_at=clock.now(),
        payload={"name": "Acme web", "tenantId": "acme"},
    )
    await drive_to_dead_letter(app, command, "integration")
    # WHEN the dead-letter consumer runs
    await run_dead_letter_consumer(app)
    # THEN there is its letter, without a tenant (no root to ask) …
    (letter,) = letters(app)
    assert (letter.command_id, letter.tenant_id, letter.change_id) == (
        command.command_id,
        None,
        None,
    )
    # … and no actor file was created to find that out
    assert not (settings.state_dir / "projects" / PROJECT).exists()


async def test_an_undecodable_body_gets_one_letter_even_when_redelivered(
    app: Rhumbatron,
) -> None:
    # GIVEN a body that is not a Command on the integration queue
    bus = await app.command_bus()
    sent = await bus.send_raw("integration", b"\xffnot a command", message_id="integration:junk")
    runtime = await app.queue_runtime()
    report = await runtime.poll("integration", always_fails)
    # (the runtime moves it to the dead-letter queue at once: it can never succeed)
    assert report.dead_lettered == 1
    # WHEN the dead-letter consumer records it, and the first delivery fails after writing
    consumer = DeadLetterConsumer(app)
    calls: list[int] = []

    async def fail_first(body: bytes, delivery: Delivery, reason: str) -> None:
        await consumer.on_undecodable(body, delivery, reason)
        calls.append(delivery.delivered)
        if delivery.delivered == 1:
            raise RuntimeError("crashed after the letter")

    dl_runtime = bare_runtime(app, bus.nc, bus)
    try:
        # The nak's redelivery can trail the first poll by a moment on a loaded machine:
        # poll a bounded number of times for it instead of sleeping a guessed time.
        for _ in range(50):
            await dl_runtime.poll(DEAD_LETTER_QUEUE, always_fails, on_undecodable=fail_first)
            if len(calls) >= 2:
                break
    finally:
        await dl_runtime.close()
    # THEN one letter, keyed by the origin queue and its stream sequence
    assert calls == [1, 2]
    (letter,) = letters(app)
    assert letter.dead_letter_id == undecodable_dead_letter_id("integration", sent.stream_seq)
    assert (letter.kind, letter.command_id, letter.status) == (
        DeadLetterKind.COMMAND,
        None,
        DeadLetterStatus.OPEN,
    )
    assert (letter.queue, letter.stream, letter.stream_seq) == (
        "integration",
        COMMAND_STREAM,
        sent.stream_seq,
    )
    assert letter.body == "\\xffnot a command"
    assert "not a valid Command" in letter.reason
    await settles_to(lambda: commands_state(app), (0, sent.stream_seq + 1))


async def test_a_retry_that_fails_again_updates_and_reopens_the_same_letter(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN the letter of attempt 1, dismissed by an operator
    given_project(app)
    given_change(app)
    await drive_to_dead_letter(app, settle(clock), "integration")
    await run_dead_letter_consumer(app)
    (first,) = letters(app)
    with app.product().transaction() as db:
        dismiss_dead_letter(db, first.dead_letter_id, now_s=clock.now().timestamp())
    # WHEN attempt 2 of the same command fails on every delivery too
    clock.advance(60)
    await drive_to_dead_letter(app, settle(clock, attempt=2), "integration")
    _, last_seq = await commands_state(app)
    await run_dead_letter_consumer(app)
    # THEN it is the same letter, at attempt 2, open again
    (second,) = letters(app)
    assert second.dead_letter_id == first.dead_letter_id
    assert second.attempt == 2
    assert (second.status, second.resolution, second.closed_at_s) == (
        DeadLetterStatus.OPEN,
        None,
        None,
    )
    assert second.updated_at_s == clock.now().timestamp()
    assert Command.parse(second.body).attempt == 2
    # AND nothing was sent again
    await settles_to(lambda: commands_state(app), (0, last_seq))


async def test_a_redelivered_letter_an_operator_dismissed_meanwhile_stays_dismissed(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a change.settle that failed on every delivery, on the dead-letter queue
    given_project(app)
    given_change(app)
    await drive_to_dead_letter(app, settle(clock), "integration")
    bus = await app.command_bus()
    consumer = DeadLetterConsumer(app)

    async def dismissed_before_the_redelivery(command: Command, delivery: Delivery) -> Retry | None:
        await consumer(command, delivery)
        if delivery.delivered > 1:
            return None
        # The first ack is lost, and an operator dismisses the letter before it comes back
        (letter,) = letters(app)
        with app.product().transaction() as db:
            dismiss_dead_letter(db, letter.dead_letter_id, now_s=clock.now().timestamp())
        clock.advance(60)
        return Retry(0.0, "ack lost")

    # WHEN the same dead-letter message (the same attempt) is delivered again
    runtime = bare_runtime(app, bus.nc, bus)
    try:
        await runtime.poll(DEAD_LETTER_QUEUE, dismissed_before_the_redelivery)
        await runtime.poll(DEAD_LETTER_QUEUE, dismissed_before_the_redelivery)
    finally:
        await runtime.close()

    # THEN the letter is written once, keyed by its command: the redelivery changes nothing,
    # and the letter stays dismissed (only a later attempt opens it again)
    (letter,) = letters(app)
    assert letter.attempt == 1
    assert letter.status is DeadLetterStatus.CLOSED
    assert letter.resolution == "dismissed"
    assert letter.updated_at_s == clock.now().timestamp() - 60


async def test_a_letter_that_cannot_be_written_is_retried_not_lost(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a dead-lettered command, and another writer holding the product database
    given_project(app)
    given_change(app)
    await drive_to_dead_letter(app, settle(clock), "integration")
    blocker = load_settings(**(app.settings.model_dump() | {"sqlite_busy_timeout_ms": 1}))
    holder = open_product_database(blocker)
    holder.connection.execute("BEGIN IMMEDIATE")
    busy_app = bootstrap(blocker, clock=clock, alarms=RecordingAlarmSink())
    try:
        # WHEN the consumer runs while the database is busy
        report = await run_dead_letter_consumer(busy_app)
        # THEN the message is nacked for a redelivery, not acked without a letter
        assert (report.failed, report.retried, report.done) == (1, 1, 0)
    finally:
        holder.connection.execute("ROLLBACK")
        holder.close()
        await busy_app.close()
    # AND once the database is free, the redelivery writes it
    report = await run_dead_letter_consumer(app)
    assert report.done == 1
    assert len(letters(app)) == 1


# --------------------------------------------------------------------------- closure


def given_letter(app: Rhumbatron, clock: ManualClock, change_id: str, command_id: str) -> None:
    with app.product().transaction() as db:
        record_command_dead_letter(
            db,
            command_id=command_id,
            command_type="change.settle",
            queue="integration",
            attempt=1,
            reason="boom",
            body="{}",
            now_s=clock.now().timestamp(),
            tenant_id="acme",
            project_id=PROJECT,
            change_id=change_id,
        )


def status_by_change(app: Rhumbatron) -> dict[str | None, set[tuple[str, str | None]]]:
    out: dict[str | None, set[tuple[str, str | None]]] = {}
    for letter in letters(app):
        out.setdefault(letter.change_id, set()).add((letter.status.value, letter.resolution))
    return out


def closed_at(app: Rhumbatron) -> set[float | None]:
    """When the closed letters were closed."""
    return {
        letter.closed_at_s for letter in letters(app) if letter.status is DeadLetterStatus.CLOSED
    }


async def test_the_sweep_closes_the_command_letters_of_ended_changes(
    app: Rhumbatron, clock: ManualClock, settings: Settings
) -> None:
    # GIVEN open letters of Changes in each ended status, of an open Change, of a Change no
    # shard holds, and a poison-event letter of an ended Change
    given_project(app)
    ended = ["completed", "failed", "cancelled", "not_selected", "declined"]
    for status in [*ended, "running"]:
        given_change(app, f"chg-{status}", status)
        given_letter(app, clock, f"chg-{status}", f"cmd_settle_{status}")
    given_letter(app, clock, "chg-unknown", "cmd_settle_unknown")
    unknown_shard = ResourceShard.ref_for(
        PROJECT, change_resource_key("chg-unknown"), settings.resource_shard_count
    ).path(settings.state_dir)
    shard_existed = unknown_shard.exists()
    with app.product().transaction() as db:
        record_poison_event(
            db,
            consumer="causal-router",
            event_key="evt_x",
            stream="EVENTS_0",
            stream_seq=1,
            reason="boom",
            body="{}",
            now_s=clock.now().timestamp(),
            project_id=PROJECT,
            change_id="chg-completed",
        )
    # WHEN the sweep's closure runs
    clock.advance(300)
    closed = close_letters_of_ended_changes(app, now_s=clock.now().timestamp())
    # THEN the command letters of the 5 ended Changes close as ended (S0-094, DECISIONS)
    assert closed == 5
    statuses = status_by_change(app)
    for status in ended:
        assert statuses[f"chg-{status}"] >= {("closed", "ended")}
    # AND the open Change's, the unknown Change's and the poison letter stay open
    assert statuses["chg-running"] == {("open", None)}
    assert statuses["chg-unknown"] == {("open", None)}
    assert statuses["chg-completed"] == {("closed", "ended"), ("open", None)}
    assert unknown_shard.exists() is shard_existed
    # AND each closed at the sweep's time
    assert closed_at(app) == {clock.now().timestamp()}
    # AND a second pass has nothing left to close
    assert close_letters_of_ended_changes(app, now_s=clock.now().timestamp()) == 0


async def test_the_ended_change_closure_looks_up_at_most_limit_changes_per_pass(
    app: Rhumbatron, clock: ManualClock
) -> None:
    given_project(app)
    for change_id in ("chg-a", "chg-b"):
        given_change(app, change_id, "completed")
        given_letter(app, clock, change_id, f"cmd_settle_{change_id}")
    now_s = clock.now().timestamp()
    assert close_letters_of_ended_changes(app, now_s=now_s, limit=1) == 1
    assert close_letters_of_ended_changes(app, now_s=now_s, limit=1) == 1
    assert close_letters_of_ended_changes(app, now_s=now_s, limit=1) == 0


async def test_the_ended_change_closure_looks_up_100_changes_per_pass_by_default(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN 101 ended Changes with an open letter each
    given_project(app)
    for n in range(101):
        given_change(app, f"chg-{n}", "completed")
        given_letter(app, clock, f"chg-{n}", f"cmd_settle_{n}")
    now_s = clock.now().timestamp()
    # THEN a pass closes 100 of them, and the next the last one
    assert close_letters_of_ended_changes(app, now_s=now_s) == 100
    assert close_letters_of_ended_changes(app, now_s=now_s) == 1


async def test_a_letter_of_a_change_its_shard_does_not_hold_stays_open(
    app: Rhumbatron, clock: ManualClock, settings: Settings
) -> None:
    # GIVEN an ended Change, and a letter of another Change that would live in the same
    # shard file but was never recorded there
    given_project(app)
    given_change(app, CHANGE, "completed")
    sibling = next(
        f"chg-{n}"
        for n in range(1000)
        if f"chg-{n}" != CHANGE and shard_path(settings, f"chg-{n}") == shard_path(settings, CHANGE)
    )
    given_letter(app, clock, sibling, "cmd_settle_sibling")
    # WHEN the closure runs
    closed = close_letters_of_ended_changes(app, now_s=clock.now().timestamp())
    # THEN the sibling's letter stays open: a Change the shard does not know has not ended
    assert closed == 0
    assert status_by_change(app) == {sibling: {("open", None)}}


async def test_a_change_whose_shard_cannot_be_read_keeps_its_letter_open_and_is_logged(
    app: Rhumbatron, clock: ManualClock, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a letter of a Change whose shard file is not a database, next to an ended one
    given_project(app)
    given_change(app, "chg-ended", "completed")
    given_letter(app, clock, "chg-ended", "cmd_settle_ended")
    garbled = next(
        f"chg-g{n}"
        for n in range(1000)
        if shard_path(settings, f"chg-g{n}") != shard_path(settings, "chg-ended")
    )
    shard_path(settings, garbled).parent.mkdir(parents=True, exist_ok=True)
    shard_path(settings, garbled).write_bytes(b"this is not a database" * 100)
    given_letter(app, clock, garbled, "cmd_settle_garbled")
    caplog.set_level(logging.ERROR, logger="rhumbatron.queues.dead_letter")
    # WHEN the closure runs
    closed = close_letters_of_ended_changes(app, now_s=clock.now().timestamp())
    # THEN the ended Change's letter closed; the unreadable one waits for the next pass
    assert closed == 1
    assert status_by_change(app)[garbled] == {("open", None)}
    # AND the log names the Change, its project and the error
    assert consumer_log(caplog) == [
        (
            logging.ERROR,
            f"cannot read change {garbled} of acme-web: cannot open the file on "
            f"{shard_path(settings, garbled)}: file is not a database",
        )
    ]


async def test_a_later_settle_supersedes_the_open_command_letters_of_its_change(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN two open letters of one Change and one of another
    given_letter(app, clock, CHANGE, "cmd_wake_1")
    given_letter(app, clock, CHANGE, "cmd_wake_2")
    given_letter(app, clock, "chg-other", "cmd_wake_3")
    # WHEN a later change.settle of CHANGE completes
    clock.advance(10)
    closed = supersede_letters_of_change(app.product(), CHANGE, clock.now().timestamp())
    # THEN both of its letters close as superseded; the other Change's stays open (S0-093)
    assert closed == 2
    statuses = status_by_change(app)
    assert statuses[CHANGE] == {("closed", "superseded")}
    assert statuses["chg-other"] == {("open", None)}
    assert closed_at(app) == {clock.now().timestamp()}
    assert supersede_letters_of_change(app.product(), CHANGE, clock.now().timestamp()) == 0


async def test_headers_of_the_origin_queue_name_the_letter(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a command put on the dead-letter queue with the origin's headers
    given_project(app)
    given_change(app)
    bus = await app.command_bus()
    await bus.send(
        DEAD_LETTER_QUEUE,
        settle(clock),
        headers={
            ORIGIN_QUEUE_HEADER: "verification",
            DELIVERIES_HEADER: "4",
            LAST_ERROR_HEADER: "TimeoutError: workflow start",
        },
    )
    # WHEN the consumer runs
    await run_dead_letter_consumer(app)
    # THEN the letter names the origin queue and the origin's last error
    (letter,) = letters(app)
    assert letter.queue == "verification"
    assert letter.reason == (
        "change.settle cmd_settle_chg-1 failed on verification after 4 deliveries: "
        "TimeoutError: workflow start"
    )


async def test_a_command_put_here_without_origin_headers_is_named_by_its_own_queue(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a change.settle put on the dead-letter queue with none of the origin's headers
    given_project(app)
    given_change(app)
    await (await app.command_bus()).send(DEAD_LETTER_QUEUE, settle(clock))
    # WHEN the consumer runs
    await run_dead_letter_consumer(app)
    # THEN the letter names the command's own queue, and says no error and no count is known
    (letter,) = letters(app)
    assert letter.queue == "integration"
    assert letter.reason == (
        "change.settle cmd_settle_chg-1 failed on integration: no error was recorded"
    )


# --------------------------------------------------------------------------- the operator's log


async def test_the_log_says_once_a_letter_is_recorded_and_its_task_blocked(
    app: Rhumbatron, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a ready Task, and its wake's letter delivered twice (the first ack lost)
    given_project(app)
    given_change(app)
    given_task(app, TaskStatus.READY)
    delivery = dead_letter_delivery(
        {
            ORIGIN_QUEUE_HEADER: "agent-wakeups",
            DELIVERIES_HEADER: "4",
            LAST_ERROR_HEADER: "RuntimeError: boom",
        }
    )
    caplog.set_level(logging.INFO, logger="rhumbatron.queues.dead_letter")
    consumer = DeadLetterConsumer(app)
    # WHEN the consumer handles both deliveries
    await consumer(wake(clock), delivery)
    await consumer(wake(clock), delivery)
    # THEN the log tells the letter recorded, the Task blocked, then the letter already there
    reason = (
        "agent.wake cmd_tsk-1_ready failed on agent-wakeups after 4 deliveries: RuntimeError: boom"
    )
    assert consumer_log(caplog) == [
        (logging.WARNING, f"dead letter of cmd_tsk-1_ready (attempt 1) recorded: {reason}"),
        (logging.WARNING, "task tsk-1 of change chg-1 blocked (dead_letter) by cmd_tsk-1_ready"),
        (logging.WARNING, f"dead letter of cmd_tsk-1_ready (attempt 1) already recorded: {reason}"),
    ]


async def test_a_letter_of_a_change_no_shard_holds_is_all_there_is_and_the_log_says_so(
    app: Rhumbatron, clock: ManualClock, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a project whose shards never held chg-nowhere
    given_project(app)
    assert not shard_path(settings, "chg-nowhere").exists()
    caplog.set_level(logging.WARNING, logger="rhumbatron.queues.dead_letter")
    # WHEN the letter of its change.settle arrives
    await DeadLetterConsumer(app)(settle(clock, change_id="chg-nowhere"), dead_letter_delivery())
    # THEN the letter is written, no shard file is created to find that out, and the log says
    # the letter alone records the failure
    assert [letter.change_id for letter in letters(app)] == ["chg-nowhere"]
    assert not shard_path(settings, "chg-nowhere").exists()
    assert consumer_log(caplog)[1:] == [
        (
            logging.WARNING,
            "dead letter of cmd_settle_chg-nowhere: change chg-nowhere of acme-web is not in "
            "any shard; the letter alone records it",
        )
    ]


async def test_a_change_whose_project_has_no_root_is_not_marked_and_the_log_says_why(
    app: Rhumbatron, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a Change in a shard of a project whose root actor is gone
    given_change(app)
    caplog.set_level(logging.WARNING, logger="rhumbatron.queues.dead_letter")
    # WHEN the letter of its change.settle arrives
    await DeadLetterConsumer(app)(settle(clock), dead_letter_delivery())
    # THEN the letter is written without a tenant, the Change is left as it was (a fact needs
    # its tenant), and the log says why
    (letter,) = letters(app)
    assert letter.tenant_id is None
    assert shard(app).change_reason(CHANGE) == ""
    assert consumer_log(caplog)[1:] == [
        (
            logging.ERROR,
            "dead letter of cmd_settle_chg-1: project acme-web has no root actor, so change "
            "chg-1 cannot be marked; the letter alone records it",
        )
    ]


# --------------------------------------------------------------------------- undecodable bodies


def test_an_undecodable_letter_is_keyed_by_24_hex_digits_of_its_origin() -> None:
    # The key is dl_ + 24 hex digits of SHA-256 over where the body was first seen
    key = undecodable_dead_letter_id("integration", 7)
    assert re.fullmatch(r"dl_[0-9a-f]{24}", key)
    assert key == undecodable_dead_letter_id("integration", 7)
    assert len({key, undecodable_dead_letter_id("integration", 8)}) == 2
    assert len({key, undecodable_dead_letter_id("release", 7)}) == 2


async def test_an_undecodable_letter_is_written_once_and_the_second_write_says_so(
    app: Rhumbatron, clock: ManualClock
) -> None:
    def record() -> bool:
        with app.product().transaction() as db:
            return record_undecodable_command(
                db,
                queue="integration",
                stream_seq=7,
                reason="not a Command",
                body="junk",
                now_s=clock.now().timestamp(),
            )

    assert record() is True
    assert record() is False
    assert len(letters(app)) == 1


async def test_a_body_put_here_some_other_way_is_keyed_by_its_place_on_the_dead_letter_queue(
    app: Rhumbatron, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a body that is not a Command, published on the dead-letter subject without the
    # runtime's message ID, with the error its sender saw
    js = (await app.nats()).jetstream()
    ack = await js.publish(
        command_subject(DEAD_LETTER_QUEUE),
        b"junk \xfe",
        headers={LAST_ERROR_HEADER: "ValueError: cannot parse"},
    )
    caplog.set_level(logging.INFO, logger="rhumbatron.queues.dead_letter")
    # WHEN the dead-letter consumer runs
    report = await run_dead_letter_consumer(app)
    # THEN it recorded a letter keyed by the dead-letter queue and its sequence there, with
    # the sender's error, and acked it
    assert report.done == 1
    (letter,) = letters(app)
    assert letter.dead_letter_id == undecodable_dead_letter_id(DEAD_LETTER_QUEUE, ack.seq)
    assert (letter.queue, letter.stream_seq, letter.body) == (
        DEAD_LETTER_QUEUE,
        ack.seq,
        "junk \\xfe",
    )
    assert letter.reason == (
        f"undecodable body from {DEAD_LETTER_QUEUE} (seq {ack.seq}): ValueError: cannot parse"
    )
    await settles_to(lambda: commands_state(app), (0, ack.seq))
    # AND a second delivery of the same body finds the letter already there
    delivery = dead_letter_delivery({LAST_ERROR_HEADER: "ValueError: cannot parse"}, ack.seq)
    await DeadLetterConsumer(app).on_undecodable(b"junk \xfe", delivery, "decode failed")
    assert len(letters(app)) == 1
    assert consumer_log(caplog) == [
        (
            logging.WARNING,
            f"dead letter of an undecodable body from {DEAD_LETTER_QUEUE} seq {ack.seq} {outcome}",
        )
        for outcome in ("recorded", "already recorded")
    ]


async def test_the_dead_letter_consumer_takes_nothing_once_time_is_up(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a command waiting on the dead-letter queue
    given_project(app)
    given_change(app)
    await (await app.command_bus()).send(DEAD_LETTER_QUEUE, settle(clock))
    # WHEN the consumer runs with no time left
    report = await run_dead_letter_consumer(app, should_stop=lambda: True)
    # THEN it fetched nothing, and the command still waits for the next run
    assert (report.fetched, report.done) == (0, 0)
    assert letters(app) == []
    assert await held_by_subject(app) == {command_subject(DEAD_LETTER_QUEUE): 1}
