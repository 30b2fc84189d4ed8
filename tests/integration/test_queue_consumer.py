"""The command queues against a real nats-server (spec "Queues", the QUEUE_CONSUMERS table;
RELIABILITY F11, F13, F14, F23; DECISIONS "Commands").

Like the spec's ``dead-letter.critical`` test, the table is checked twice: the data equals the
spec's table row by row, and the runtime does what each row says (its consumer, batch size,
concurrency, retries, retry delay and dead-letter queue). What the runtime tells JetStream is
read off the wire: :class:`AckTap` is a second client subscribed to the consumers' ack
subjects, so a test sees every ``+ACK``, ``-NAK {"delay": …}``, ``+WPI`` and ``+TERM`` as the
server got it, without touching the runtime.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js.api import AckPolicy, DiscardPolicy
from nats.js.client import JetStreamContext

from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.errors import MessagingError
from rhumbatron.messaging.commands import DELIVERIES_HEADER, LAST_ERROR_HEADER, ORIGIN_QUEUE_HEADER
from rhumbatron.messaging.queue_consumer import (
    CommandHandler,
    Delivery,
    PollReport,
    QueueConsumerRuntime,
    Retry,
)
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.protocol.command_types import QUEUES
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.queue_consumers import DEAD_LETTER_QUEUE, QUEUE_CONSUMERS, consumer_name
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration

#: The spec's table ("Queues"), transcribed: queue, consumer, batch, concurrency, retries,
#: retry delay (s), dead-letter queue.
SPEC_TABLE: tuple[tuple[str, str, int, int, int, float, str | None], ...] = (
    ("agent-wakeups", "agents", 10, 2, 3, 30.0, "dead-letter"),
    ("integration", "integration", 10, 2, 3, 30.0, "dead-letter"),
    ("verification", "integration", 5, 2, 3, 30.0, "dead-letter"),
    ("release", "integration", 5, 2, 3, 30.0, "dead-letter"),
    ("indexing", "indexer", 1, 1, 3, 30.0, None),
    ("dead-letter", "event router", 5, 1, 5, 60.0, None),
)

#: How long a test waits for something a server timer (ack wait, nak delay) releases.
SERVER_TIMER_BOUND_S = 15.0


# --------------------------------------------------------------------------- wire tap


@dataclass(frozen=True, slots=True)
class AckSeen:
    """One acknowledgement as nats-server received it."""

    consumer: str
    delivered: int
    stream_seq: int
    kind: str  # "+ACK", "-NAK", "+WPI", "+TERM"
    delay_s: float | None  # a -NAK's delay; None when it asked for redelivery at once


def _parse_ack(subject: str, body: bytes, stream: str = COMMAND_STREAM) -> AckSeen | None:
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending> (v1), or with
    # <domain>.<account hash> after ACK (v2).
    tokens = subject.split(".")
    at = 2 if len(tokens) == 9 else 4
    if tokens[at] != stream:
        return None
    kind, _, rest = body.decode().partition(" ")
    kind = kind or "+ACK"  # nats.py acks with an empty body, which JetStream reads as +ACK
    delay = None
    if kind == "-NAK" and rest.strip():
        delay = json.loads(rest)["delay"] / 1e9
    return AckSeen(tokens[at + 1], int(tokens[at + 2]), int(tokens[at + 3]), kind, delay)


class AckTap:
    """A second client on the ack subjects of one stream's consumers (COMMANDS by default).

    Acks are plain core-NATS publishes to ``$JS.ACK.…`` reply subjects; JetStream's own
    subscription and this one both receive them, so the tap sees exactly what the server got.
    """

    def __init__(self, nc: NATS, sub: NatsSubscription, stream: str = COMMAND_STREAM) -> None:
        self._nc = nc
        self._sub = sub
        self._stream = stream
        self._seen: list[AckSeen] = []

    @classmethod
    async def open(cls, url: str, stream: str = COMMAND_STREAM) -> AckTap:
        nc = await nats.connect(url, name="test-ack-tap")
        sub = await nc.subscribe("$JS.ACK.>")
        await nc.flush()
        return cls(nc, sub, stream)

    async def seen(self, *senders: Rhumbatron, consumer: str | None = None) -> list[AckSeen]:
        """Every ack so far (of ``consumer``, when given). ``senders`` are flushed first, so
        their acks have reached the server; the tap's own flush then brings them here."""
        for app in senders:
            await (await app.nats()).flush()
        await self._nc.flush()
        while self._sub.pending_msgs:
            msg = await self._sub.next_msg(timeout=1)
            ack = _parse_ack(msg.subject, msg.data, self._stream)
            if ack is not None:
                self._seen.append(ack)
        return [a for a in self._seen if consumer is None or a.consumer == consumer]

    async def close(self) -> None:
        await self._nc.close()


# --------------------------------------------------------------------------- fixtures

AppFactory = Callable[..., Awaitable[Rhumbatron]]


@pytest_asyncio.fixture
async def make_app(
    tmp_path: Path, nats_server: NatsServerProcess, clock: ManualClock
) -> AsyncIterator[AppFactory]:
    """Builds composition roots on this test's nats-server and manual clock, with setting
    overrides; each is a separate NATS connection, closed at the end of the test."""
    apps: list[Rhumbatron] = []

    async def make(**overrides: Any) -> Rhumbatron:
        settings = load_settings(
            state_dir=tmp_path / "state", nats_url=nats_server.url, **overrides
        )
        app = bootstrap(settings, clock=clock)
        await app.ensure_streams()
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.close()


@pytest_asyncio.fixture
async def tap(nats_server: NatsServerProcess) -> AsyncIterator[AckTap]:
    wire = await AckTap.open(nats_server.url)
    yield wire
    await wire.close()


# --------------------------------------------------------------------------- helpers


def make_command(
    clock: ManualClock,
    n: int = 0,
    *,
    tag: str | None = None,
    deadline_in: timedelta | None = None,
) -> Command:
    """An agent.wake Command, unique per ``tag`` (a fresh one when not given)."""
    now = clock.now()
    return Command.create(
        command_id=f"cmd_{tag or uuid.uuid4().hex[:8]}_{n}",
        command_type="agent.wake",
        project_id="acme-web",
        change_id="chg-1",
        created_at=now,
        deadline=None if deadline_in is None else now + deadline_in,
        payload={"agentId": f"agent-{n}", "reason": "task.ready"},
    )


async def send_commands(app: Rhumbatron, queue: str, count: int) -> list[Command]:
    """``count`` new commands on ``queue``, each stored once."""
    bus = await app.command_bus()
    assert isinstance(app.clock, ManualClock)
    tag = uuid.uuid4().hex[:8]
    commands = [make_command(app.clock, n, tag=tag) for n in range(count)]
    for command in commands:
        assert not (await bus.send(queue, command)).duplicate
    return commands


async def js_of(app: Rhumbatron) -> JetStreamContext:
    return (await app.nats()).jetstream()


async def subject_counts(app: Rhumbatron) -> dict[str, int]:
    """Messages stored on the COMMANDS stream, by subject (work-queue: not yet acked)."""
    info = await (await js_of(app)).stream_info(COMMAND_STREAM, subjects_filter="cmd.>")
    return dict(info.state.subjects or {})


async def counts_become(
    app: Rhumbatron, expected: dict[str, int], *, timeout_s: float = 5.0
) -> dict[str, int]:
    """The stream's counts by subject once they equal ``expected`` (or the last read after
    ``timeout_s``). JetStream applies acks and terms on a queue of its own, so a work-queue
    message leaves the stream a moment after its ack was sent."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = await subject_counts(app)
        if counts == expected or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.01)  # bounded wait on the server's ack queue


async def poll_until(
    runtime: QueueConsumerRuntime,
    queue: str,
    handler: CommandHandler,
    done: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float = SERVER_TIMER_BOUND_S,
) -> list[PollReport]:
    """Poll ``queue`` until ``done()``; fail after ``timeout_s``. Between polls that fetched
    nothing it waits a moment: a redelivery needs a server timer (a nak delay, the ack wait)
    or the server's asynchronous handling of a nak to pass."""
    reports: list[PollReport] = []
    deadline = time.monotonic() + timeout_s
    while not await done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {timeout_s}s of polling {queue}: {reports}")
        report = await runtime.poll(queue, handler)
        reports.append(report)
        if not report.fetched:
            await asyncio.sleep(0.02)  # a bounded poll of a server timer, not a fixed wait
    return reports


def total(reports: Sequence[PollReport], name: str) -> int:
    return sum(int(getattr(r, name)) for r in reports)


def queue_gone(app: Rhumbatron, queue: str) -> Callable[[], Awaitable[bool]]:
    """True once nothing is left on ``cmd.<queue>`` (acked or terminated)."""

    async def check() -> bool:
        return (await subject_counts(app)).get(command_subject(queue), 0) == 0

    return check


async def noop(command: Command, delivery: Delivery) -> None:
    return None


# =========================================================================== the table


def test_queue_consumers_is_the_spec_table_row_by_row() -> None:
    # GIVEN the spec's table, transcribed
    # WHEN QUEUE_CONSUMERS is read row by row, in the spec's order
    rows = [
        (
            r.queue,
            r.consumer_module,
            r.batch_size,
            r.concurrency,
            r.retries,
            r.retry_delay_s,
            r.dead_letter_queue,
        )
        for r in QUEUE_CONSUMERS.values()
    ]
    # THEN it is the same table, one row per queue of the COMMANDS stream
    assert rows == list(SPEC_TABLE)
    assert tuple(QUEUE_CONSUMERS) == QUEUES
    assert QUEUE_CONSUMERS["indexing"].on_exhausted.startswith("the indexer records the failure")
    assert "terminates" in QUEUE_CONSUMERS["dead-letter"].on_exhausted
    assert {r.queue: r.max_deliveries for r in QUEUE_CONSUMERS.values()} == {
        q: retries + 1 for q, *_, retries, _, _ in SPEC_TABLE
    }


@pytest.mark.parametrize("queue", QUEUES)
async def test_each_queue_is_read_by_its_own_durable_consumer_on_its_subject_only(
    make_app: AppFactory, queue: str
) -> None:
    # GIVEN the runtime
    app = await make_app()
    runtime = await app.queue_runtime()

    # WHEN it polls the queue
    await runtime.poll(queue, noop)

    # THEN the durable consumer q-<queue> exists, explicit ack, filtered to cmd.<queue> only
    js = await js_of(app)
    consumers = await js.consumers_info(COMMAND_STREAM)
    assert [c.name for c in consumers] == [consumer_name(queue)] == [f"q-{queue}"]
    config = consumers[0].config
    assert config.durable_name == f"q-{queue}"
    assert config.filter_subject == f"cmd.{queue}"
    assert not config.filter_subjects
    assert AckPolicy(config.ack_policy) is AckPolicy.EXPLICIT
    assert config.ack_wait == app.settings.command_ack_wait_s
    assert config.max_deliver in (None, -1)  # the runtime counts deliveries, not the server


async def test_a_queue_consumer_takes_its_ack_pending_limit_from_the_settings(
    make_app: AppFactory,
) -> None:
    # GIVEN a limit of 50 messages in flight (the default, 1,000, is also the server's)
    app = await make_app(router_max_ack_pending=50)
    # WHEN the runtime polls a queue, THEN its consumer holds at most 50 unacknowledged
    await (await app.queue_runtime()).poll("integration", noop)
    info = await (await js_of(app)).consumer_info(COMMAND_STREAM, consumer_name("integration"))
    assert info.config.max_ack_pending == 50


async def test_a_warm_runtime_asks_for_its_consumer_once(
    make_app: AppFactory, nats_server: NatsServerProcess
) -> None:
    # GIVEN a tap on the COMMANDS consumers' JetStream API, and a runtime
    tap = await nats.connect(nats_server.url, name="test-api-tap")
    requests = await tap.subscribe(f"$JS.API.CONSUMER.*.{COMMAND_STREAM}.>")
    await tap.flush()
    app = await make_app()
    runtime = await app.queue_runtime()

    async def asked() -> list[str]:
        await (await app.nats()).flush()
        await tap.flush()
        return [m.subject async for m in _drained(requests)]

    try:
        # WHEN it polls a queue for the first time, THEN it looks up (and makes) its consumer
        await runtime.poll("integration", noop)
        first = await asked()
        assert first and all(".q-integration" in subject for subject in first), first
        # WHEN it polls the queue twice more, THEN it pulls at once: no lookup per poll
        for _ in range(2):
            await runtime.poll("integration", noop)
        assert await asked() == []
    finally:
        await tap.close()


async def _drained(sub: NatsSubscription) -> AsyncIterator[Any]:
    """The messages a subscription holds now, without waiting for more."""
    while sub.pending_msgs:
        yield await sub.next_msg(timeout=1)


async def test_a_queue_consumer_deleted_under_a_warm_runtime_is_made_again(
    make_app: AppFactory,
) -> None:
    # GIVEN a warm runtime that has polled its queue, whose consumer an operator then deletes
    app = await make_app()
    runtime = await app.queue_runtime()
    await runtime.poll("integration", noop)
    js = await js_of(app)
    await js.delete_consumer(COMMAND_STREAM, consumer_name("integration"))
    commands = await send_commands(app, "integration", 3)
    handled: list[str] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        handled.append(command.command_id)

    # WHEN it polls again
    report = await runtime.poll("integration", handler)

    # THEN it made the consumer again and handled the whole batch
    assert handled == [c.command_id for c in commands]
    assert (report.fetched, report.done) == (3, 3)
    await js.consumer_info(COMMAND_STREAM, consumer_name("integration"))


async def poll_through_a_stall(
    runtime: QueueConsumerRuntime, nats_server: NatsServerProcess, handler: CommandHandler
) -> PollReport:
    """One poll of the integration queue while its server stalls (SIGSTOP) for 0.6 s, three
    fetches' wait at 0.2 s: its fetch gives up, and its last flush waits for the server."""

    async def outage() -> None:
        await asyncio.sleep(0.6)  # the outage's length, not a synchronisation
        nats_server.resume()

    nats_server.pause()
    resumed = asyncio.create_task(outage())
    try:
        return await runtime.poll("integration", handler)
    finally:
        await resumed


async def test_a_poll_whose_server_stalls_gives_up_its_fetch_and_the_next_poll_takes_it(
    make_app: AppFactory, nats_server: NatsServerProcess
) -> None:
    # GIVEN a warm runtime whose fetches wait 0.2 s at most, and a command on its queue
    app = await make_app(router_fetch_timeout_s=0.2)
    runtime = await app.queue_runtime()
    await runtime.poll("integration", noop)
    [command] = await send_commands(app, "integration", 1)
    seen: list[tuple[str, int]] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        seen.append((command.command_id, delivery.delivered))

    # WHEN the server stalls for 0.6 s (three fetches' wait) as the queue is polled
    stalled = await poll_through_a_stall(runtime, nats_server, handler)
    # THEN that poll gave up its fetch after its wait, with nothing handled
    assert (stalled.fetches, stalled.fetched, seen) == (1, 0, [])

    # AND the command the server sent once it answered is the next poll's, on that delivery
    async def handled() -> bool:
        return bool(seen)

    await poll_until(runtime, "integration", handler, handled)
    assert seen == [(command.command_id, 1)]


async def test_a_final_flush_the_stalled_server_never_answers_ends_the_poll_all_the_same(
    make_app: AppFactory, nats_server: NatsServerProcess
) -> None:
    # GIVEN a warm runtime, a command on its queue, and a handler during which the server
    #   stalls for longer than a flush waits (nats-py's 10 s): the client still thinks it is
    #   connected when the poll flushes its ack
    app = await make_app()
    runtime = await app.queue_runtime()
    await runtime.poll("integration", noop)
    await send_commands(app, "integration", 1)
    outage: list[asyncio.Task[None]] = []

    async def resume_later() -> None:
        await asyncio.sleep(10.5)  # the outage's length: past the flush's 10 s
        nats_server.resume()

    async def stall_the_server(command: Command, delivery: Delivery) -> None:
        nats_server.pause()
        outage.append(asyncio.create_task(resume_later()))

    # WHEN the queue is polled
    try:
        report = await runtime.poll("integration", stall_the_server)
    finally:
        await asyncio.gather(*outage)
    # THEN the poll reports the command done: a flush that times out fails nothing (the ack
    #   leaves in the client's next write)
    assert (report.fetched, report.done) == (1, 1)


@pytest.mark.parametrize(
    ("age_s", "handed_out"),
    [
        # younger than half the ack wait: the next poll hands it out, first delivery
        (1.25, True),
        # older: JetStream redelivers it soon (3 s after sending it), so it is dropped and
        #   the next poll finds nothing yet, instead of a copy the server will send again
        (2.1, False),
    ],
)
async def test_a_command_that_arrived_after_its_fetch_gave_up_is_kept_half_the_ack_wait(
    make_app: AppFactory, nats_server: NatsServerProcess, age_s: float, handed_out: bool
) -> None:
    # GIVEN a warm runtime whose fetches wait 0.2 s at most, a 3 s ack wait (a test override
    #   of the 60 s; in-progress marks come more often), and a command on its queue
    app = await make_app(
        router_fetch_timeout_s=0.2, command_ack_wait_s=3.0, command_in_progress_s=1.0
    )
    runtime = await app.queue_runtime()
    await runtime.poll("integration", noop)
    [command] = await send_commands(app, "integration", 1)
    seen: list[tuple[str, int]] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        seen.append((command.command_id, delivery.delivered))

    # WHEN a poll's fetch gives up on a stalled server, which sends the command once it
    #   answers (the poll's last flush waits for that answer)
    assert (await poll_through_a_stall(runtime, nats_server, handler)).fetched == 0
    # AND the next poll comes `age_s` after the command arrived
    await asyncio.sleep(age_s)  # the late command's age, not a synchronisation
    await runtime.poll("integration", handler)
    # THEN it handed the kept command out, or nothing
    assert seen == ([(command.command_id, 1)] if handed_out else [])


async def test_a_poll_counts_what_each_of_its_fetches_brought(make_app: AppFactory) -> None:
    # GIVEN 25 commands on a queue whose batch is 10
    app = await make_app()
    await send_commands(app, "integration", 25)
    # WHEN it is polled, THEN its three fetches (10, 10, 5) are all counted
    report = await (await app.queue_runtime()).poll("integration", noop)
    assert (report.fetches, report.fetched, report.done) == (3, 25, 25)


@pytest.mark.parametrize("queue", QUEUES)
async def test_one_fetch_takes_at_most_the_rows_batch_size(
    make_app: AppFactory, queue: str
) -> None:
    # GIVEN more commands on the queue than its batch size
    batch = QUEUE_CONSUMERS[queue].batch_size
    app = await make_app()
    await send_commands(app, queue, batch + 3)
    runtime = await app.queue_runtime()

    # WHEN the runtime fetches once
    first = await runtime.poll(queue, noop, max_fetches=1)

    # THEN that fetch took exactly the batch size, and the rest waits for the next fetch
    assert (first.fetches, first.fetched, first.done) == (1, batch, batch)
    left = {command_subject(queue): 3}
    assert await counts_become(app, left) == left
    rest = await poll_until(runtime, queue, noop, queue_gone(app, queue))
    assert total(rest, "done") == 3
    assert all(r.fetched <= batch * r.fetches for r in rest)


@pytest.mark.parametrize(
    ("queue", "concurrency"),
    [
        *((queue, None) for queue in QUEUES),
        # sized by the setting instead of the table's 2
        ("agent-wakeups", 5),
    ],
)
async def test_at_most_the_rows_concurrency_handlers_run_at_once(
    make_app: AppFactory, queue: str, concurrency: int | None
) -> None:
    # GIVEN two batches of commands and a handler that counts how many run at once; the
    # first ones wait until the row's concurrency is reached (a serialising runtime would
    # never get there and time out)
    row = QUEUE_CONSUMERS[queue]
    if concurrency is None:
        app = await make_app()
    else:
        app = await make_app(queue_concurrency={queue: concurrency})
        row = replace(row, concurrency=concurrency)
    await send_commands(app, queue, 2 * row.batch_size)
    runtime = await app.queue_runtime()
    running = peak = handled = 0
    full = asyncio.Event()

    async def handler(command: Command, delivery: Delivery) -> None:
        nonlocal running, peak, handled
        running += 1
        peak = max(peak, running)
        if running == row.concurrency:
            full.set()
        await full.wait()
        # Yield once: a handler the runtime started beside this one, beyond its
        # concurrency, would now count itself.
        await asyncio.sleep(0)
        running -= 1
        handled += 1

    # WHEN the runtime drains the queue
    reports = await asyncio.wait_for(
        poll_until(runtime, queue, handler, queue_gone(app, queue)), timeout=20
    )

    # THEN exactly `concurrency` handlers ran at once, never more
    assert peak == row.concurrency
    assert handled == total(reports, "done") == 2 * row.batch_size


@pytest.mark.parametrize("queue", QUEUES)
async def test_a_failing_command_is_delivered_one_plus_retries_times_then_leaves_the_queue(
    make_app: AppFactory, tap: AckTap, queue: str
) -> None:
    # GIVEN the row's retry delay set to 0 (a test override) and a handler that always fails
    row = QUEUE_CONSUMERS[queue]
    app = await make_app(queue_retry_delay_s={queue: 0.0})
    [command] = await send_commands(app, queue, 1)
    runtime = await app.queue_runtime()
    deliveries: list[int] = []

    async def failing(command: Command, delivery: Delivery) -> None:
        deliveries.append(delivery.delivered)
        raise RuntimeError(f"{command.command_id} cannot be done")

    # WHEN the runtime polls until the command has left its queue
    reports = await poll_until(runtime, queue, failing, queue_gone(app, queue))

    # THEN it was delivered 1 + retries times; naks asked for redelivery, then it was
    # terminated once
    assert deliveries == list(range(1, row.retries + 2))
    assert total(reports, "failed") == row.max_deliveries
    assert total(reports, "retried") == row.retries
    acks = await tap.seen(app, consumer=f"q-{queue}")
    assert [(a.delivered, a.kind) for a in acks] == [
        *((n, "-NAK") for n in range(1, row.max_deliveries)),
        (row.max_deliveries, "+TERM"),
    ]
    expected = {} if row.dead_letter_queue is None else {command_subject(row.dead_letter_queue): 1}
    counts = await counts_become(app, expected)
    if row.dead_letter_queue is not None:
        # AND it landed on the row's dead-letter queue, once, with where it came from
        assert total(reports, "dead_lettered") == 1
        assert counts == {command_subject(row.dead_letter_queue): 1}
        letter = await (await js_of(app)).get_last_msg(
            COMMAND_STREAM, command_subject(DEAD_LETTER_QUEUE)
        )
        headers = letter.headers or {}
        assert Command.parse(letter.data or b"") == command
        assert headers["Nats-Msg-Id"] == f"dead-letter:{command.command_id}"
        assert headers[ORIGIN_QUEUE_HEADER] == queue
        assert headers[DELIVERIES_HEADER] == str(row.max_deliveries)
        assert "cannot be done" in headers[LAST_ERROR_HEADER]
    else:
        # AND a queue without one (indexing, dead-letter) terminated it, sending nothing
        assert total(reports, "terminated") == 1
        assert total(reports, "dead_lettered") == 0
        assert counts == {}


@pytest.mark.parametrize("queue", QUEUES)
async def test_a_failed_command_waits_the_rows_retry_delay(
    make_app: AppFactory, tap: AckTap, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN the table's own retry delay (30 s; 60 s for dead-letter) and a handler that fails
    row = QUEUE_CONSUMERS[queue]
    app = await make_app()
    [command] = await send_commands(app, queue, 1)
    caplog.set_level(logging.WARNING, logger="rhumbatron.messaging.queue_consumer")
    runtime = await app.queue_runtime()
    calls = 0

    async def failing(command: Command, delivery: Delivery) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("transient")

    # WHEN the command fails once and the queue is polled again at once
    first = await runtime.poll(queue, failing)
    again = await runtime.poll(queue, failing)

    # THEN the nak asked for the row's delay, and the immediate re-poll got nothing
    assert (first.failed, first.retried) == (1, 1)
    assert again.fetched == 0
    assert calls == 1
    # AND one warning named the queue, the command, its delivery of the row's and the reason
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{queue} failed {command.command_id} (delivery 1 of {row.max_deliveries}): "
        "RuntimeError: transient"
    ]
    acks = await tap.seen(app, consumer=f"q-{queue}")
    assert [(a.kind, a.delay_s) for a in acks] == [("-NAK", row.retry_delay_s)]
    # AND the command is still on its queue, waiting
    assert await counts_become(app, {command_subject(queue): 1}) == {command_subject(queue): 1}


# =========================================================================== command bus


async def test_a_command_travels_with_the_message_id_queue_colon_command_id(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a command
    app = await make_app()
    bus = await app.command_bus()
    command = make_command(clock)

    # WHEN it is sent to the integration queue
    result = await bus.send("integration", command)

    # THEN it is stored on cmd.integration under Nats-Msg-Id <queue>:<commandId>
    assert result.message_id == f"integration:{command.command_id}"
    assert not result.duplicate
    stored = await (await js_of(app)).get_msg(COMMAND_STREAM, result.stream_seq)
    assert stored.subject == "cmd.integration"
    assert (stored.headers or {})["Nats-Msg-Id"] == f"integration:{command.command_id}"
    assert Command.parse(stored.data or b"") == command


async def test_a_repeat_inside_the_duplicate_window_is_dropped_and_delivered_once(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a command sent twice (an operator's double click, a producer's retry)
    app = await make_app()
    bus = await app.command_bus()
    command = make_command(clock)
    first = await bus.send("integration", command)
    second = await bus.send("integration", command)
    handled: list[str] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        handled.append(command.command_id)

    # WHEN the queue is drained
    runtime = await app.queue_runtime()
    await runtime.poll("integration", handler)

    # THEN JetStream said the second was a duplicate, and the command ran once
    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.stream_seq == first.stream_seq
    assert handled == [command.command_id]

    # AND a repeat after the work-queue message was acked is still dropped (the window
    # outlives the message, F14)
    third = await bus.send("integration", command)
    again = await runtime.poll("integration", handler)
    assert third.duplicate
    assert again.fetched == 0
    assert handled == [command.command_id]


async def test_an_operator_retry_is_sent_once_and_not_swallowed_by_the_window(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a command that was sent and consumed
    app = await make_app()
    bus = await app.command_bus()
    runtime = await app.queue_runtime()
    command = make_command(clock)
    await bus.send("integration", command)
    handled: list[tuple[str, int]] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        handled.append((command.command_id, command.attempt))

    await runtime.poll("integration", handler)

    # WHEN an operator clicks Retry twice (attempt 2 of the same commandId)
    retry = command.model_copy(update={"attempt": 2})
    clicks = [await bus.send("integration", retry), await bus.send("integration", retry)]
    await runtime.poll("integration", handler)

    # THEN attempt 2 has its own message ID, is stored once, and runs once (F14)
    assert [c.message_id for c in clicks] == [f"integration:{command.command_id}:2"] * 2
    assert [c.duplicate for c in clicks] == [False, True]
    assert handled == [(command.command_id, 1), (command.command_id, 2)]


async def test_sending_to_an_unknown_queue_is_refused_naming_the_queues(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN the bus and the runtime
    app = await make_app()
    bus = await app.command_bus()
    runtime = await app.queue_runtime()

    # WHEN a command is sent to, or polled from, a queue that does not exist
    # THEN both refuse with the wrong name and the real ones
    with pytest.raises(MessagingError, match=r"unknown queue 'intergration'; queues are .*"):
        await bus.send("intergration", make_command(clock))
    with pytest.raises(MessagingError, match="agent-wakeups, integration, verification"):
        await bus.send_raw("nope", b"{}", message_id="x")
    with pytest.raises(ValueError) as polled:
        await runtime.poll("intergration", noop)
    assert str(polled.value) == f"unknown queue 'intergration'; queues are {', '.join(QUEUES)}"
    # AND nothing was stored
    assert await counts_become(app, {}) == {}


# =========================================================================== handler contract


async def test_retry_redelivers_after_the_delay_the_handler_set(
    make_app: AppFactory, tap: AckTap
) -> None:
    # GIVEN a handler that asks for another delivery after 1 s, then succeeds
    app = await make_app()
    await send_commands(app, "integration", 1)
    runtime = await app.queue_runtime()
    seen: list[tuple[int, float]] = []

    async def handler(command: Command, delivery: Delivery) -> Retry | None:
        seen.append((delivery.delivered, time.monotonic()))
        return Retry(1.0, "more work left") if delivery.delivered == 1 else None

    # WHEN the queue is polled at once and then until the command is done
    first = await runtime.poll("integration", handler)
    again = await runtime.poll("integration", handler)
    await poll_until(runtime, "integration", handler, queue_gone(app, "integration"))

    # THEN the nak carried the handler's delay, nothing came back before it, and the second
    # delivery came after it
    assert first.retried == 1
    assert again.fetched == 0
    acks = await tap.seen(app)
    assert [(a.delivered, a.kind, a.delay_s) for a in acks] == [
        (1, "-NAK", 1.0),
        (2, "+ACK", None),
    ]
    assert [d for d, _ in seen] == [1, 2]
    assert seen[1][1] - seen[0][1] >= 0.9  # the server's timer, give or take its tick


async def test_a_retry_on_the_last_delivery_goes_to_the_dead_letter_queue(
    make_app: AppFactory,
) -> None:
    # GIVEN a handler that keeps asking for another delivery, at once
    app = await make_app()
    [command] = await send_commands(app, "integration", 1)
    runtime = await app.queue_runtime()

    async def handler(command: Command, delivery: Delivery) -> Retry:
        return Retry(0.0, "still waiting for a review")

    # WHEN the queue is polled until the command leaves it
    reports = await poll_until(runtime, "integration", handler, queue_gone(app, "integration"))

    # THEN after 1 + 3 deliveries it was dead-lettered with the handler's reason, as the
    # command it is (under the dead-letter queue's message ID for it), not as a raw body
    assert total(reports, "fetched") == 4
    assert (total(reports, "retried"), total(reports, "dead_lettered")) == (3, 1)
    letter = await (await js_of(app)).get_last_msg(COMMAND_STREAM, "cmd.dead-letter")
    assert (letter.headers or {})[LAST_ERROR_HEADER] == "still waiting for a review"
    assert (letter.headers or {})["Nats-Msg-Id"] == f"dead-letter:{command.command_id}"
    assert Command.parse(letter.data or b"").command_id == command.command_id


async def test_the_dead_letter_queue_logs_a_message_whose_retries_ran_out_then_terminates_it(
    make_app: AppFactory, tap: AckTap, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a letter on the dead-letter queue, its retry delay set to 0 (a test override),
    # and a handler that cannot record it
    app = await make_app(queue_retry_delay_s={DEAD_LETTER_QUEUE: 0.0})
    [command] = await send_commands(app, DEAD_LETTER_QUEUE, 1)
    runtime = await app.queue_runtime()

    async def failing(command: Command, delivery: Delivery) -> None:
        raise RuntimeError("the letter cannot be written")

    # WHEN the queue is polled until the message has left it
    caplog.set_level(logging.ERROR, logger="rhumbatron.messaging.queue_consumer")
    await poll_until(runtime, DEAD_LETTER_QUEUE, failing, queue_gone(app, DEAD_LETTER_QUEUE))

    # THEN after its last retry (1 + 5 deliveries) one error names the message, its
    # deliveries and the reason, and the message was terminated
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.name == "rhumbatron.messaging.queue_consumer" and r.levelno >= logging.ERROR
    ]
    assert logged == [
        f"dead-letter gives up on {command.command_id} after 6 deliveries: "
        "RuntimeError: the letter cannot be written"
    ]
    acks = await tap.seen(app, consumer="q-dead-letter")
    assert [a.kind for a in acks][-1] == "+TERM"


async def test_each_give_up_is_counted(make_app: AppFactory) -> None:
    # GIVEN two commands on a queue with a dead-letter queue and two on one without, retry
    # delay 0 (a test override), and a handler that always fails
    app = await make_app(queue_retry_delay_s={"integration": 0.0, "indexing": 0.0})
    await send_commands(app, "integration", 2)
    await send_commands(app, "indexing", 2)
    runtime = await app.queue_runtime()

    async def failing(command: Command, delivery: Delivery) -> None:
        raise RuntimeError("broken")

    # WHEN each queue is polled until its commands have left it
    integration = await poll_until(runtime, "integration", failing, queue_gone(app, "integration"))
    indexing = await poll_until(runtime, "indexing", failing, queue_gone(app, "indexing"))

    # THEN every give-up is in the reports: both dead-lettered, both terminated
    assert total(integration, "dead_lettered") == 2
    assert total(indexing, "terminated") == 2


async def test_a_long_error_is_cut_to_1000_characters_in_the_dead_letter(
    make_app: AppFactory,
) -> None:
    # GIVEN a handler whose error runs to 5,000 characters, retry delay 0 (a test override)
    app = await make_app(queue_retry_delay_s={"integration": 0.0})
    await send_commands(app, "integration", 1)

    async def failing(command: Command, delivery: Delivery) -> None:
        raise RuntimeError("x" * 5_000)

    # WHEN it fails until it leaves the queue
    runtime = await app.queue_runtime()
    await poll_until(runtime, "integration", failing, queue_gone(app, "integration"))

    # THEN the letter carries the error's first 1,000 characters
    letter = await (await js_of(app)).get_last_msg(COMMAND_STREAM, "cmd.dead-letter")
    error = (letter.headers or {})[LAST_ERROR_HEADER]
    assert len(error) == 1_000 and error.startswith("RuntimeError: xxx")


async def test_an_empty_body_is_dead_lettered_empty(make_app: AppFactory) -> None:
    # GIVEN an empty message on the integration queue
    app = await make_app()
    await (await app.command_bus()).send_raw("integration", b"", message_id="raw-empty")

    # WHEN the queue is polled
    report = await (await app.queue_runtime()).poll("integration", noop)

    # THEN the letter is the same empty body, not something made up
    assert report.dead_lettered == 1
    letter = await (await js_of(app)).get_last_msg(COMMAND_STREAM, "cmd.dead-letter")
    assert letter.data in (b"", None)


async def test_an_undecodable_body_on_a_queue_without_a_dead_letter_queue_is_logged_by_sequence(
    make_app: AppFactory, tap: AckTap, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN two bodies that are not Commands on the indexing queue, which has no dead-letter
    #   queue
    app = await make_app()
    bus = await app.command_bus()
    sent = [
        await bus.send_raw("indexing", b"not a command", message_id=f"raw-indexing-{n}")
        for n in range(2)
    ]

    # WHEN they are polled (one fetch)
    caplog.set_level(logging.ERROR, logger="rhumbatron.messaging.queue_consumer")
    report = await (await app.queue_runtime()).poll("indexing", noop)

    # THEN both are terminated, counted in the run's report, and each error names its
    #   message by its stream sequence
    assert report.terminated == 2
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.name == "rhumbatron.messaging.queue_consumer" and r.levelno >= logging.ERROR
    ]
    assert sorted(line.split(" after ")[0] for line in logged) == sorted(
        f"indexing gives up on seq {message.stream_seq}" for message in sent
    )
    assert all(" after 1 deliveries: " in line for line in logged)


async def test_a_handler_is_told_where_its_command_came_from(make_app: AppFactory) -> None:
    # GIVEN a command on the integration queue
    app = await make_app()
    [command] = await send_commands(app, "integration", 1)
    seen: list[tuple[str, Delivery]] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        seen.append((command.command_id, delivery))

    # WHEN the queue is polled, THEN its handler hears the queue, the stream position, the
    #   delivery and the row's number of deliveries
    await (await app.queue_runtime()).poll("integration", handler)
    [(command_id, delivery)] = seen
    assert command_id == command.command_id
    row = QUEUE_CONSUMERS["integration"]
    assert (delivery.queue, delivery.delivered, delivery.max_deliveries) == (
        "integration",
        1,
        row.max_deliveries,
    )
    assert delivery.stream_seq >= 1


async def test_each_command_left_for_a_retry_is_counted(make_app: AppFactory) -> None:
    # GIVEN four commands on a queue, and a handler that fails two on their first delivery
    #   and asks for the other two to come again
    app = await make_app()
    commands = await send_commands(app, "integration", 4)
    failing = {c.command_id for c in commands[:2]}

    async def handler(command: Command, delivery: Delivery) -> Retry | None:
        if command.command_id in failing:
            raise RuntimeError("transient")
        return Retry(30.0, "more work left")

    # WHEN the queue is polled, THEN each of the four is counted as left for a retry
    report = await (await app.queue_runtime()).poll("integration", handler)
    assert (report.fetched, report.failed, report.retried, report.done) == (4, 2, 4, 0)


async def test_a_success_hook_that_fails_is_logged_and_the_batch_goes_on(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN two commands, and a success hook that fails for each (a product file busy, say)
    app = await make_app()
    commands = await send_commands(app, "integration", 2)

    async def hook(command: Command) -> None:
        raise RuntimeError(f"cannot close the letters of {command.command_id}")

    async def handler(command: Command, delivery: Delivery) -> None:
        pass

    runtime = QueueConsumerRuntime(
        await app.nats(), app.settings, app.clock, await app.command_bus(), on_success=hook
    )
    caplog.set_level(logging.ERROR, logger="rhumbatron.messaging.queue_consumer")
    # WHEN the queue is polled
    try:
        report = await runtime.poll("integration", handler)
    finally:
        await runtime.close()
    # THEN both are done (acked: the hook's failure is not theirs), each failure logged
    assert report.done == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"after {c.command_id} succeeded: cannot close the letters of {c.command_id}"
        for c in commands
    ]


async def test_an_expired_command_is_acked_without_running(
    make_app: AppFactory, tap: AckTap, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN two commands with a 5-minute deadline, and one without
    app = await make_app()
    bus = await app.command_bus()
    expiring = [make_command(clock, n, deadline_in=timedelta(minutes=5)) for n in (1, 3)]
    lasting = make_command(clock, 2)
    for command in (*expiring, lasting):
        await bus.send("integration", command)
    caplog.set_level(logging.INFO, logger="rhumbatron.messaging.queue_consumer")
    handled: list[str] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        handled.append(command.command_id)

    # WHEN the injected clock passes the deadline and the queue is polled
    clock.advance(minutes=5)
    report = await (await app.queue_runtime()).poll("integration", handler)

    # THEN the expired ones were acked and counted, without running, each saying so; the
    #   other ran
    assert (report.expired, report.done) == (2, 1)
    assert handled == [lasting.command_id]
    assert [a.kind for a in await tap.seen(app)] == ["+ACK", "+ACK", "+ACK"]
    assert [r.getMessage() for r in caplog.records if "expired" in r.getMessage()] == [
        f"command {c.command_id} expired at {c.deadline}: acked" for c in expiring
    ]
    assert await counts_become(app, {}) == {}


async def test_an_undecodable_body_goes_to_the_dead_letter_queue_at_once(
    make_app: AppFactory, tap: AckTap
) -> None:
    # GIVEN a body on the integration queue that is not a Command
    app = await make_app()
    bus = await app.command_bus()
    sent = await bus.send_raw("integration", b'{"commandType": "agent.sleep"', message_id="raw-1")
    handled: list[str] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        handled.append(command.command_id)

    # WHEN the queue is polled
    report = await (await app.queue_runtime()).poll("integration", handler)

    # THEN on its first delivery it went, byte for byte, to the dead-letter queue and was
    # terminated; no handler saw it
    assert (report.fetched, report.dead_lettered, report.retried) == (1, 1, 0)
    assert handled == []
    assert [(a.delivered, a.kind) for a in await tap.seen(app)] == [(1, "+TERM")]
    assert await counts_become(app, {"cmd.dead-letter": 1}) == {"cmd.dead-letter": 1}
    letter = await (await js_of(app)).get_last_msg(COMMAND_STREAM, "cmd.dead-letter")
    headers = letter.headers or {}
    assert letter.data == b'{"commandType": "agent.sleep"'
    assert headers["Nats-Msg-Id"] == f"dead-letter:integration:seq:{sent.stream_seq}"
    assert headers[ORIGIN_QUEUE_HEADER] == "integration"
    assert "not a valid Command" in headers[LAST_ERROR_HEADER]


async def test_an_undecodable_body_goes_to_on_undecodable_when_given(
    make_app: AppFactory,
) -> None:
    # GIVEN two bodies on the dead-letter queue that are not Commands (one empty), and a
    # raw-body handler
    app = await make_app()
    bus = await app.command_bus()
    await bus.send_raw("dead-letter", b"\xff not json", message_id="raw-2")
    await bus.send_raw("dead-letter", b"", message_id="raw-3")
    recorded: list[tuple[bytes, int, str]] = []

    async def record(body: bytes, delivery: Delivery, reason: str) -> None:
        recorded.append((body, delivery.delivered, reason))

    # WHEN the queue is polled with it
    report = await (await app.queue_runtime()).poll("dead-letter", noop, on_undecodable=record)

    # THEN the raw-body handler got each as it is (the empty one empty), they were acked,
    # and nothing was dead-lettered
    assert [(b, d) for b, d, _ in recorded] == [(b"\xff not json", 1), (b"", 1)]
    assert all("not a valid Command" in reason for _, _, reason in recorded)
    assert (report.done, report.dead_lettered, report.terminated) == (2, 0, 0)
    assert await counts_become(app, {}) == {}


async def test_a_raw_body_handler_that_fails_leaves_the_body_for_a_retry(
    make_app: AppFactory, tap: AckTap, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a body on the dead-letter queue that is not a Command, and a raw-body handler
    # that cannot record it (the product file busy, say)
    app = await make_app()
    sent = await (await app.command_bus()).send_raw("dead-letter", b"{", message_id="raw-4")

    async def record(body: bytes, delivery: Delivery, reason: str) -> None:
        raise RuntimeError("the letter cannot be written")

    # WHEN the queue is polled with it
    caplog.set_level(logging.WARNING, logger="rhumbatron.messaging.queue_consumer")
    runtime = await app.queue_runtime()
    report = await runtime.poll("dead-letter", noop, on_undecodable=record)

    # THEN it failed like a command would: a warning naming it by its sequence, and nak'd
    # for the row's retry delay (60 s on the dead-letter queue), not acked or terminated
    assert (report.failed, report.retried, report.done) == (1, 1, 0)
    assert [r.getMessage() for r in caplog.records] == [
        f"dead-letter failed seq {sent.stream_seq} (delivery 1 of 6): "
        "RuntimeError: the letter cannot be written"
    ]
    assert [(a.kind, a.delay_s) for a in await tap.seen(app)] == [("-NAK", 60.0)]
    assert await counts_become(app, {"cmd.dead-letter": 1}) == {"cmd.dead-letter": 1}


async def test_a_dead_letter_send_that_fails_leaves_the_message_for_another_try(
    make_app: AppFactory, tap: AckTap, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN two commands that always fail, a short retry delay (a test override), and the
    # COMMANDS stream full: it may hold two messages (the commands) and refuses new ones,
    # so JetStream refuses the dead-letter sends for real
    app = await make_app(queue_retry_delay_s={"integration": 0.2})
    commands = await send_commands(app, "integration", 2)
    js = await js_of(app)
    info = await js.stream_info(COMMAND_STREAM)
    await js.update_stream(info.config.evolve(max_msgs=2, discard=DiscardPolicy.NEW))
    runtime = await app.queue_runtime()
    deliveries: list[int] = []

    async def failing(command: Command, delivery: Delivery) -> None:
        deliveries.append(delivery.delivered)
        raise RuntimeError("broken")

    async def past_last_delivery() -> bool:
        return len(deliveries) >= 10

    # WHEN they fail on their last delivery (4) and the dead-letter sends are refused
    reports = await poll_until(runtime, "integration", failing, past_last_delivery)

    # THEN neither was terminated: nak'd after the row's delay, delivered again, counted as
    # a retry each time, and still on their queue
    assert total(reports, "dead_lettered") == 0
    assert total(reports, "retried") == len(deliveries)
    acks = await tap.seen(app)
    assert {(a.kind, a.delay_s) for a in acks} == {("-NAK", 0.2)}
    assert await counts_become(app, {"cmd.integration": 2}) == {"cmd.integration": 2}
    # AND each refused send is an error that names why the command gave up, why the send
    # failed, and what happens next
    refusals = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.getMessage().startswith("cannot dead-letter ")
    ]
    assert refusals
    assert all(
        re.fullmatch(
            r"cannot dead-letter .*RuntimeError: broken.*: JetStream refused command \S+ on "
            r"dead-letter: .*; it will be tried again",
            message,
        )
        for message in refusals
    ), refusals

    # WHEN the stream takes messages again
    await js.update_stream(info.config)
    after = await poll_until(runtime, "integration", failing, queue_gone(app, "integration"))

    # THEN the next delivery of each is dead-lettered once and terminated
    assert total(after, "dead_lettered") == 2
    assert await counts_become(app, {"cmd.dead-letter": 2}) == {"cmd.dead-letter": 2}
    letter = await js.get_last_msg(COMMAND_STREAM, "cmd.dead-letter")
    assert Command.parse(letter.data or b"") in commands
    assert int((letter.headers or {})[DELIVERIES_HEADER]) == deliveries[-1] > 4


async def test_a_failing_success_hook_does_not_fail_the_batch(make_app: AppFactory) -> None:
    # GIVEN three commands, and the product database (DELETE journal, no busy wait) locked
    # by another writer, so the success hook's lookup of an open dead letter fails
    app = await make_app(journal_mode="DELETE", sqlite_busy_timeout_ms=0)
    commands = await send_commands(app, "integration", 3)
    _ = app.product().connection
    writer = sqlite3.connect(app.settings.state_dir / "product.sqlite", isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    handled: list[str] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        handled.append(command.command_id)

    # WHEN the queue is polled
    try:
        report = await (await app.queue_runtime()).poll("integration", handler)
    finally:
        writer.execute("ROLLBACK")
        writer.close()

    # THEN every command got its own outcome (done and acked) and the poll reported them
    assert handled == [c.command_id for c in commands]
    assert report.done == 3


# =========================================================================== in progress (F11)


async def test_a_handler_slower_than_the_ack_wait_is_not_redelivered_while_it_runs(
    make_app: AppFactory, tap: AckTap
) -> None:
    # GIVEN a 1 s ack wait, marks every 0.3 s, and a handler that works for 2.5 s
    overrides = {"command_ack_wait_s": 1.0, "command_in_progress_s": 0.3}
    app = await make_app(**overrides)
    other = await make_app(**overrides)  # a second worker, on its own connection
    await send_commands(app, "integration", 1)
    started = asyncio.Event()
    runs = 0

    async def slow(command: Command, delivery: Delivery) -> None:
        nonlocal runs
        runs += 1
        started.set()
        await asyncio.sleep(2.5)  # the slow work under test, not synchronisation

    stolen: list[int] = []

    async def steal(command: Command, delivery: Delivery) -> None:
        stolen.append(delivery.delivered)

    # WHEN it runs, while the other worker polls the queue the whole time
    working = asyncio.create_task((await app.queue_runtime()).poll("integration", slow))
    await started.wait()
    other_runtime = await other.queue_runtime()
    polls = 0
    while not working.done():
        polls += (await other_runtime.poll("integration", steal)).fetches
        await asyncio.sleep(0.05)  # polling across the server's ack-wait timer
    report = await working

    # THEN the other worker never got it, the handler ran once and the message was acked
    assert stolen == []
    assert polls > 10
    assert (runs, report.done) == (1, 1)
    acks = await tap.seen(app)
    marks = [a for a in acks if a.kind == "+WPI"]
    # One mark every 0.3 s: 2.5 s / 0.3 s = 8 (a loaded machine's late timers only lose a
    # few); marks at twice the interval would be 4, at half of it 16.
    assert 6 <= len(marks) <= 8
    assert {a.delivered for a in acks} == {1}
    assert acks[-1].kind == "+ACK"
    assert await counts_become(app, {}) == {}


async def test_messages_waiting_for_a_worker_are_kept_alive_too(
    make_app: AppFactory, tap: AckTap
) -> None:
    # GIVEN a 1 s ack wait, marks every 0.3 s, and a batch of 10 on a queue of concurrency 2
    # whose handler works 0.6 s: the last two only start after about 2.4 s
    overrides = {"command_ack_wait_s": 1.0, "command_in_progress_s": 0.3}
    app = await make_app(**overrides)
    other = await make_app(**overrides)
    await send_commands(app, "integration", 10)
    deliveries: list[int] = []
    started = asyncio.Event()

    async def slow(command: Command, delivery: Delivery) -> None:
        deliveries.append(delivery.delivered)
        started.set()
        await asyncio.sleep(0.6)  # the slow work under test, not synchronisation

    stolen: list[int] = []

    async def steal(command: Command, delivery: Delivery) -> None:
        stolen.append(delivery.delivered)

    # WHEN the batch runs while another worker polls the queue the whole time
    working = asyncio.create_task(
        (await app.queue_runtime()).poll("integration", slow, max_fetches=1)
    )
    await started.wait()  # the first worker holds the whole batch of 10
    other_runtime = await other.queue_runtime()
    while not working.done():
        await other_runtime.poll("integration", steal)
        await asyncio.sleep(0.05)  # polling across the server's ack-wait timer
    report = await working

    # THEN no waiting message outlived its ack wait: each ran once, first delivery, here
    assert stolen == []
    assert deliveries == [1] * 10
    assert report.done == 10
    # AND they were marked every 0.3 s while they waited: the last two, held about 3 s
    #   (2.4 s waiting, 0.6 s running), got about 9 marks each (a loaded machine's late
    #   timers only lose a few); marks at twice the interval would be about 5
    marks = Counter(a.stream_seq for a in await tap.seen(app) if a.kind == "+WPI")
    assert max(marks.values()) >= 7


#: A 1 s ack wait, marks every 0.3 s for at most 0.6 s: the hold limit within a test's time.
SHORT_HOLD = {"command_ack_wait_s": 1.0, "command_in_progress_s": 0.3, "command_max_hold_s": 0.6}


async def test_after_the_hold_limit_the_marks_stop_and_the_message_is_redelivered(
    make_app: AppFactory, tap: AckTap
) -> None:
    # GIVEN a 1 s ack wait, marks every 0.3 s for at most 0.6 s, and a handler that holds
    # the message until the test lets it go
    app = await make_app(**SHORT_HOLD)
    other = await make_app(**SHORT_HOLD)
    await send_commands(app, "integration", 1)
    started = asyncio.Event()
    release = asyncio.Event()
    held_from = 0.0

    async def holding(command: Command, delivery: Delivery) -> None:
        nonlocal held_from
        held_from = time.monotonic()
        started.set()
        await release.wait()

    redelivered: list[tuple[int, float]] = []

    async def second(command: Command, delivery: Delivery) -> None:
        redelivered.append((delivery.delivered, time.monotonic()))

    # WHEN the handler holds it past the hold limit, while another worker polls
    working = asyncio.create_task((await app.queue_runtime()).poll("integration", holding))
    await started.wait()
    other_runtime = await other.queue_runtime()

    async def came_back() -> bool:
        return bool(redelivered)

    await poll_until(other_runtime, "integration", second, came_back)
    release.set()
    await working

    # THEN the marks stopped at the hold limit, and the message came back one ack wait later
    [(delivered, at)] = redelivered
    assert delivered == 2
    assert at - held_from >= 1.0
    marks = [a for a in await tap.seen(app, other) if a.kind == "+WPI"]
    assert 1 <= len(marks) <= 2  # 0.6 s / 0.3 s
    assert await counts_become(app, {}) == {}


async def test_messages_waiting_for_a_worker_are_marked_only_up_to_the_hold_limit(
    make_app: AppFactory, tap: AckTap
) -> None:
    # GIVEN a 1 s ack wait, marks every 0.3 s for at most 0.6 s, and five commands on a
    # queue of concurrency 2 whose handler holds each message until the test lets it go:
    # the last three wait for a worker the whole time
    app = await make_app(**SHORT_HOLD)
    other = await make_app(**SHORT_HOLD)
    await send_commands(app, "integration", 5)
    last = (await (await js_of(app)).stream_info(COMMAND_STREAM)).state.last_seq
    waiting = {last - 2, last - 1, last}
    started = asyncio.Event()
    release = asyncio.Event()

    held: list[int] = []

    async def holding(command: Command, delivery: Delivery) -> None:
        held.append(delivery.stream_seq)
        started.set()
        await release.wait()

    redelivered: list[int] = []

    async def second(command: Command, delivery: Delivery) -> None:
        redelivered.append(delivery.stream_seq)

    # WHEN the batch is held past the hold limit, while another worker polls
    working = asyncio.create_task(
        (await app.queue_runtime()).poll("integration", holding, max_fetches=1)
    )
    await started.wait()
    other_runtime = await other.queue_runtime()

    async def waiting_ones_came_back() -> bool:
        return waiting <= set(redelivered)

    await poll_until(other_runtime, "integration", second, waiting_ones_came_back)
    release.set()
    report = await working

    # THEN each waiting message's marks stopped at the hold limit (0.6 s / 0.3 s: at most
    # 2), and each came back to the other worker
    acks = await tap.seen(app, other)
    for seq in waiting:
        marks = [a for a in acks if a.kind == "+WPI" and a.stream_seq == seq]
        assert 1 <= len(marks) <= 2, seq
    # AND the first worker, free again past the hold limit, started none of them: each was
    # given back (a batch is held no longer than the limit), and each is counted
    assert not waiting & set(held)
    assert report.left_for_redelivery == 3


async def test_a_hold_limit_shorter_than_the_mark_interval_sends_no_mark(
    make_app: AppFactory, tap: AckTap
) -> None:
    # GIVEN marks every 0.3 s but a hold limit of 0.2 s, and a handler that works 0.5 s
    app = await make_app(command_ack_wait_s=1.0, command_in_progress_s=0.3, command_max_hold_s=0.2)
    await send_commands(app, "integration", 1)

    async def slow(command: Command, delivery: Delivery) -> None:
        await asyncio.sleep(0.5)  # the slow work under test, not synchronisation

    # WHEN the queue is polled
    report = await (await app.queue_runtime()).poll("integration", slow)

    # THEN no mark was due inside the limit, so none was sent, and the work was acked
    assert report.done == 1
    assert [a.kind for a in await tap.seen(app)] == ["+ACK"]


async def test_a_mark_that_cannot_be_sent_is_not_an_error_of_the_event_loop(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN marks every 0.1 s, three commands on a queue of concurrency 2 (the third waits
    # for a worker), and a handler whose connection closes under it and who then works on
    # past three marks
    app = await make_app(command_ack_wait_s=1.0, command_in_progress_s=0.1)
    await send_commands(app, "integration", 3)
    nc = await app.nats()

    async def connection_lost(command: Command, delivery: Delivery) -> None:
        if not nc.is_closed:
            await nc.close()
        await asyncio.sleep(0.35)  # the work under test, across three marks

    # WHEN the queue is polled: the messages cannot be acked either
    caplog.set_level(logging.ERROR, logger="asyncio")
    with pytest.raises(nats.errors.ConnectionClosedError):
        await (await app.queue_runtime()).poll("integration", connection_lost)
    gc.collect()  # a future whose error nobody read says so when it is collected

    # THEN each lost mark, of a message worked on or waiting, was only a lost mark (the
    # messages come back after their ack wait): none left an error nobody read, or a failing
    # callback, for asyncio to log
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


# =========================================================================== deadline (F23)


async def test_records_not_started_when_time_runs_out_are_nacked_for_prompt_redelivery(
    make_app: AppFactory, tap: AckTap
) -> None:
    # GIVEN a full batch, and a remaining-time check that says stop once the first record of
    # the batch has run (the default 60 s ack wait: prompt redelivery cannot come from it)
    app = await make_app()
    commands = await send_commands(app, "integration", 10)
    runtime = await app.queue_runtime()
    handled: list[str] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        handled.append(command.command_id)

    # WHEN the batch is polled
    report = await runtime.poll("integration", handler, should_stop=lambda: bool(handled))

    # THEN the first record was done and acked, the other nine nak'd at once (no delay)
    assert handled == [commands[0].command_id]
    assert (report.fetched, report.done, report.left_for_redelivery) == (10, 1, 9)
    assert report.out_of_time
    acks = await tap.seen(app)
    assert sorted((a.kind, a.delay_s) for a in acks) == [("+ACK", None)] + [("-NAK", None)] * 9

    # AND the next run gets exactly those nine at once, and does not redo the first
    started = time.monotonic()
    rest = await poll_until(runtime, "integration", handler, queue_gone(app, "integration"))
    assert time.monotonic() - started < 5.0
    assert total(rest, "done") == 9
    assert sorted(handled) == sorted(c.command_id for c in commands)


async def test_time_running_out_inside_a_last_short_batch_is_reported(
    make_app: AppFactory,
) -> None:
    # GIVEN three commands (a batch short of the row's 10, so the run fetches no more), and
    # a remaining-time check that says stop once the first has run
    app = await make_app()
    await send_commands(app, "integration", 3)
    handled: list[str] = []

    async def handler(command: Command, delivery: Delivery) -> None:
        handled.append(command.command_id)

    # WHEN the queue is polled
    runtime = await app.queue_runtime()
    report = await runtime.poll("integration", handler, should_stop=lambda: bool(handled))

    # THEN the run says it ran out of time (its caller must come back for the two left),
    # not that the queue is drained
    assert (report.done, report.left_for_redelivery) == (1, 2)
    assert report.out_of_time is True


async def test_no_fetch_is_made_when_time_is_already_up(make_app: AppFactory) -> None:
    # GIVEN a command waiting and no time left
    app = await make_app()
    await send_commands(app, "integration", 1)

    # WHEN the queue is polled
    report = await (await app.queue_runtime()).poll("integration", noop, should_stop=lambda: True)

    # THEN nothing was fetched and the command is untouched
    assert (report.fetches, report.fetched, report.out_of_time) == (0, 0, True)
    assert await counts_become(app, {"cmd.integration": 1}) == {"cmd.integration": 1}
