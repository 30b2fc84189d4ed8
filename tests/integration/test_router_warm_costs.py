"""What a warm router process spends per run, against a real nats-server (issue #16, "Costs
that fall as load rises"): the pull requests it sends, the flushes it waits for, the decodes
a record costs, the files and connections it holds, the records it keeps for a stream's next
run and releases; and what it must not save on (acks that have left the process when a run
returns, a connection replaced under it)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription as NatsSubscription

from rhumbatron.core.clock import ManualClock
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name
from rhumbatron.router.handlers import RunContext
from rhumbatron.router.nudge_turn import nudge_in_turn
from rhumbatron.router.records import APPLIED, Record, RecordOutcome
from rhumbatron_dev.local.nats_server import NatsServerProcess

from . import test_router
from .test_queue_consumer import AppFactory
from .test_router import (
    CAUSAL,
    PROJECTOR,
    REACTIONS,
    lifecycle,
    projects_on_stream,
    publish,
    two_events_each,
)

pytestmark = pytest.mark.integration

make_app = test_router.make_app  # the router tests' runtimes, on this test's servers

_PULL_PREFIX = "$JS.API.CONSUMER.MSG.NEXT."


class ConsumerTraffic:
    """What one consumer of stream 0 receives from its readers, in the order nats-server got
    it: ``"pull"`` for a pull request, the ack's kind (``"+ACK"``, ``"-NAK"``) for an ack.

    Pull requests and acks are plain core-NATS publishes (to ``$JS.API.CONSUMER.MSG.NEXT.…``
    and ``$JS.ACK.…``); JetStream's own subscriptions and this one's both receive them, and one
    subscription gets one connection's publishes in the order they were sent."""

    def __init__(self, nc: NATS, sub: NatsSubscription, consumer: Subscription) -> None:
        self._nc = nc
        self._sub = sub
        stream = event_stream_name(0)
        self._pull_subject = f"{_PULL_PREFIX}{stream}.{consumer.value}"
        self._ack_prefix = f"$JS.ACK.{stream}.{consumer.value}."
        self._seen: list[str] = []

    @classmethod
    async def open(cls, url: str, consumer: Subscription) -> ConsumerTraffic:
        nc = await nats.connect(url, name="test-consumer-traffic")
        sub = await nc.subscribe("$JS.>")  # one subscription: one order for both kinds
        await nc.flush()  # the server forwards only to a subscription it knows
        return cls(nc, sub, consumer)

    async def seen(self, sender: NATS) -> list[str]:
        """Everything so far; ``sender`` is flushed first, so what it sent reached the server,
        and the tap's own flush then brings it here."""
        await sender.flush()
        await self._nc.flush()
        while self._sub.pending_msgs:
            msg = await self._sub.next_msg(timeout=1)
            if msg.subject == self._pull_subject:
                self._seen.append("pull")
            elif msg.subject.startswith(self._ack_prefix):
                self._seen.append(msg.data.decode().partition(" ")[0] or "+ACK")
        return list(self._seen)

    async def close(self) -> None:
        await self._nc.close()


def counted_flushes(nc: NATS, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The flushes ``nc`` waits for from now on, one entry each (the client's own method,
    wrapped: a flush is a PING and a wait for the server's PONG)."""
    flushes: list[float] = []
    flush = nc.flush

    async def counted_flush(*args: Any, **kwargs: Any) -> None:
        flushes.append(time.monotonic())
        await flush(*args, **kwargs)

    monkeypatch.setattr(nc, "flush", counted_flush)
    return flushes


async def test_a_full_fetch_asks_for_the_runs_next_before_its_acks_and_the_last_asks_for_none(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN four projects with two events each on stream 0, and fetches of 4 records
    app = await make_app(router_fetch_max_records=4)
    await two_events_each(app, clock, 4)
    traffic = await ConsumerTraffic.open(nats_server.url, PROJECTOR)
    try:
        # WHEN one nudge runs: two fetches of the projector, both full
        report = await app.router().nudge(0)
        assert report.subscriptions[PROJECTOR.value].fetched == 8
        # THEN the second fetch was asked for before the first's acks went (its records
        #   arrive while the first applies), and the run's last fetch asked for nothing more
        assert await traffic.seen(await app.nats()) == ["pull", "pull"] + ["+ACK"] * 8
    finally:
        await traffic.close()


async def test_a_fetch_that_comes_back_short_asks_for_nothing_more(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN one project with two events on stream 0: less than a fetch takes
    app = await make_app()
    await two_events_each(app, clock, 1)
    traffic = await ConsumerTraffic.open(nats_server.url, PROJECTOR)
    try:
        # WHEN one nudge runs the projector, then the causal router
        report = await app.router().nudge(0)
        assert report.subscriptions[CAUSAL.value].applied == 2
        # THEN the projector's consumer was asked once: its short fetch ended the run, and
        #   the causal router's run asked it for nothing
        assert await traffic.seen(await app.nats()) == ["pull", "+ACK", "+ACK"]
    finally:
        await traffic.close()


async def test_a_consume_returns_with_its_acks_gone_from_the_process(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN two events on stream 0, and the router's connection
    app = await make_app()
    await two_events_each(app, clock, 1)
    router = app.router()
    nc = await app.nats()
    # WHEN the projector consumes them, with nothing said of flushing
    report = await router.consume(router.run_context(0), PROJECTOR, consumes=2, batch=100)
    # THEN its acks have left the client as it returns (flushed, the server's answer in): a
    #   function frozen right now would leave none of them behind to be redelivered
    assert report.applied == 2
    assert nc.pending_data_size == 0


async def test_a_nudge_waits_for_one_flush_for_both_subscriptions_acks(
    make_app: AppFactory, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a project's history on stream 0, and the router's connection counting its flushes
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, lifecycle(project, clock.now()))
    flushes = counted_flushes(await app.nats(), monkeypatch)
    # WHEN the stream is nudged: the projector and the causal router each ack six records
    report = await app.router().nudge(0)
    assert [s.applied for s in report.subscriptions.values()] == [6, 6]
    # THEN the run waited for one round trip for all twelve acks, not one per subscription
    assert len(flushes) == 1


class RulesThatKeepWhatTheySee:
    """Causal rules that act on no Event, and keep every Event they were shown."""

    def __init__(self) -> None:
        self.shown: list[Event] = []

    def acts_on(self, event: Event) -> bool:
        self.shown.append(event)
        return False

    async def route(
        self, events: Sequence[Event], traces: Mapping[str, str] | None = None
    ) -> dict[str, RecordOutcome]:
        return {event.event_id: APPLIED for event in events}


class ReactionsThatKeepWhatTheyGet:
    """A ``reactions`` handler that applies every record and keeps each record's Event."""

    subscription = REACTIONS

    def __init__(self) -> None:
        self.given: list[Event] = []

    async def handle(self, records: Sequence[Record], run: RunContext) -> dict[str, RecordOutcome]:
        self.given += [r.event for r in records if r.event is not None]
        return {r.key: APPLIED for r in records}

    def mark_processed(self, records: Sequence[Record], run: RunContext) -> None:
        pass


async def test_every_subscription_of_a_process_is_given_the_event_its_first_reader_decoded(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a router whose causal rules and reactions keep the Events they are given, and a
    #   project's history on stream 0
    rules = RulesThatKeepWhatTheySee()
    app = await make_app(causal_routing=rules)
    router = app.router()
    reactions = ReactionsThatKeepWhatTheyGet()
    router.reactions_handler = reactions
    (project,) = projects_on_stream(0, 1)
    events = lifecycle(project, clock.now())
    await publish(app, events)
    # WHEN the causal router reads the stream, then the reactions do
    for subscription in (CAUSAL, REACTIONS):
        await router.consume(router.run_context(0), subscription, consumes=1, batch=100)
    # THEN both were given every Event, and the reactions the very objects the causal router
    #   was shown: each envelope was decoded and validated once in the process
    assert [e.event_id for e in rules.shown] == [e.event_id for e in events]
    assert [e.event_id for e in reactions.given] == [e.event_id for e in events]
    assert all(got is shown for got, shown in zip(reactions.given, rules.shown, strict=True))


async def test_a_router_whose_connection_was_closed_reads_through_the_new_one(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a router that read stream 0 once, whose connection then closed for good
    app = await make_app()
    first, second = projects_on_stream(0, 2)
    await publish(app, lifecycle(first, clock.now())[:2])
    router = app.router()
    assert (await router.nudge(0)).subscriptions[PROJECTOR.value].applied == 2
    await (await app.nats()).close()
    # WHEN more events come and the stream is nudged again
    await publish(app, lifecycle(second, clock.now())[:2])
    report = await router.nudge(0)
    # THEN the run reads them through the process's new connection
    assert report.subscriptions[PROJECTOR.value].applied == 2
    assert (await router.event_log()).nc is await app.nats()


def open_descriptors_of(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:  # closed between the listing and the read
            continue
    return count


async def test_a_router_holds_each_streams_state_file_open_once_and_closes_it(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a router that ran two nudges of stream 0 in the stream's turn, the first routing a
    #   project's history (its claims, and the turn, are rows of the stream's state file)
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, lifecycle(project, clock.now()))
    router = app.router()
    for _ in range(2):
        await nudge_in_turn(router, 0, hold_s=60)
    state_file = router.stream_state(0).path
    # THEN the stream's state file is open once in the process, however often it was used
    assert open_descriptors_of(state_file) == 1
    # AND closing the router closes it
    await router.close()
    assert open_descriptors_of(state_file) == 0


# -- the records a process keeps for a stream's next run -----------------------------------


async def test_a_router_that_never_read_has_nothing_kept_to_release(
    make_app: AppFactory,
) -> None:
    app = await make_app()
    assert await app.router().release_held() == 0


async def test_releasing_counts_every_record_each_stream_kept_for_its_next_run(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN a process whose projector alone read two streams (its causal router never ran
    #   here), each run applying two projects of five and keeping the other three's records
    app = await make_app(router_apply_calls_per_run=2)
    router = app.router()
    kept = 0
    for stream in (0, 1):
        for project in projects_on_stream(stream, 5):
            await publish(app, lifecycle(project, clock.now())[:2])
        report = await router.consume(router.run_context(stream), PROJECTOR, consumes=2, batch=100)
        kept += report.deferred
    assert kept == 12
    traffic = await ConsumerTraffic.open(nats_server.url, PROJECTOR)
    try:
        # WHEN no run follows in this process, and it releases what it kept
        released = await router.release_held()
        # THEN every kept record of both streams is released, and counted
        assert released == 12
        assert (await traffic.seen(await app.nats())).count("-NAK") == 6  # stream 0's own
    finally:
        await traffic.close()


async def test_releasing_with_nothing_kept_waits_for_no_round_trip(
    make_app: AppFactory, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a router that read stream 0 and kept nothing (every project within its calls),
    #   and its connection counting the flushes it waits for
    app = await make_app()
    await two_events_each(app, clock, 2)
    router = app.router()
    assert (await router.nudge(0)).left_waiting is False
    flushes = counted_flushes(await app.nats(), monkeypatch)
    # WHEN it releases what it kept
    # THEN there was nothing to nack, and no round trip to the server was made for it
    assert await router.release_held() == 0
    assert flushes == []
