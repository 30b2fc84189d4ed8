"""An event storm and a self-caused reaction loop (RELIABILITY B8, issue #7 item 5), on a
real nats-server, real SQLite files and a real loopback webhook receiver that verifies every
signature.

**The storm.** 10,000 ``task.completed`` events of one tenant — four projects on four
streams, 2,500 each — go onto the event streams the way the outbox publisher sends them
(:class:`JetStreamSender` atomic batches of 100, ``Nats-Msg-Id`` = the event ID); one webhook
subscription matches all of them. The daily budget is 2,500 and the in-flight cap 3, so the
storm meets both limits. The first round is four real sweep ticks, a minute apart; each runs
one ``reactions`` batch on every stream. Every later round runs, for each stream with records
waiting, that one batch (``consume(…, consumes=1, batch=router_fetch_max_records)``, as
:meth:`EventRouter.sweep` plans it), the four side by side as sweep invocations that overran
into each other: that is what puts more deliveries in flight than the cap allows. A full sweep
per round would also project and archive the 10,000 events — not what is under test, and
minutes of work.

**The loop.** Subscriptions in a ring, each selecting the ``task.completed`` facts of its own
``agentId``; the receiver's owner answers every delivery with the next member's fact, written
in the delivery's correlation (its ``webhook-id``), as a hook that writes back does. Real
sweep ticks of the project's stream run until nothing waits and nothing new was delivered.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from integration import test_reactions as reactions_tests
from integration.test_reactions import (
    PROJECT,
    SECRET,
    START,
    STREAM,
    TENANT,
    Receiver,
    World,
    make_world,
    webhook,
)
from project_roots import ensure_project_roots
from rhumbatron.agents.signing import verify
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import project_admin_key
from rhumbatron.errors import RhumbatronError
from rhumbatron.messaging.event_log import ConsumerLag, Subscription
from rhumbatron.messaging.sender import JetStreamSender, OutgoingMessage
from rhumbatron.metrics import MetricBinding, metric_counts
from rhumbatron.product.dead_letters import list_dead_letters
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, event_stream_subject, stream_index
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.guards import Hop, SuppressionReason, suppressions
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import Governance
from rhumbatron.router.event_router import EventRouter
from rhumbatron.router.handlers import RunContext
from rhumbatron.router.reports import SubscriptionReport
from rhumbatron.router.ticks import tick_kind

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

# The reactions tests' fixtures, registered here under the same names.
receiver = reactions_tests.receiver
world = reactions_tests.world

REACTIONS = Subscription.REACTIONS
STORM_PROJECTS = 4
EVENTS_PER_PROJECT = 2_500
STORM_EVENTS = STORM_PROJECTS * EVENTS_PER_PROJECT
DAILY_BUDGET = 2_500
IN_FLIGHT_CAP = 3
#: The storm receiver's work per request, as a real endpoint has: it keeps deliveries of the
#: side-by-side batches overlapping at the receiver, where the in-flight cap is measured.
RECEIVER_WORK_S = 0.002
#: Rounds of the storm before the test calls the drain stuck (it needs 25 and some retries).
MAX_STORM_ROUNDS = 400
#: Sweep ticks a reaction loop may run before the test calls it unbounded.
MAX_LOOP_TICKS = 40


# -- a receiver that counts the requests it answers at once --------------------------------------


@dataclass
class StormReceiver:
    """A loopback HTTP server that verifies every signature and records the most requests it
    was answering at once."""

    clock: ManualClock
    url: str = ""
    delivered: list[str] = field(default_factory=list)  # webhook-ids, in arrival order
    refused: list[str] = field(default_factory=list)  # bad signatures: there must be none
    answering: int = 0
    most_at_once: int = 0


@pytest.fixture
def storm_receiver(clock: ManualClock) -> Iterator[StormReceiver]:
    state = StormReceiver(clock)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            with lock:
                state.answering += 1
                state.most_at_once = max(state.most_at_once, state.answering)
            try:
                verify([SECRET], headers, body, now=state.clock.now(), tolerance_s=300)
            except RhumbatronError:
                status = 401
                with lock:
                    state.refused.append(headers.get("webhook-id", "?"))
            else:
                status = 204
                # The endpoint's work, not a wait for anything: nothing synchronises on it.
                time.sleep(RECEIVER_WORK_S)
                with lock:
                    state.delivered.append(headers["webhook-id"])
            with lock:
                state.answering -= 1
            self.send_response(status)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


# -- the router's side ---------------------------------------------------------------------------


def sweep_minutes(settings: Settings, stream: int, after: datetime) -> Iterator[datetime]:
    """The sweep ticks that visit ``stream`` after ``after``, without the daily maintenance
    tick (it prunes and archives, which is not under test)."""
    minute = after.replace(second=0, microsecond=0)
    while True:
        minute += timedelta(minutes=1)
        index, maintenance, _ = tick_kind(settings, minute)
        if index == stream and not maintenance:
            yield minute


async def reactions_lag(router: EventRouter, stream: int) -> ConsumerLag:
    return await (await router.event_log()).lag(stream, REACTIONS)


def waiting(lag: ConsumerLag) -> int:
    """Records never delivered, plus delivered ones not acknowledged (those sent back)."""
    return lag.num_pending + lag.num_ack_pending


async def reactions_batch(router: EventRouter, stream: int) -> SubscriptionReport:
    """The one ``reactions`` batch a sweep tick of ``stream`` ends with."""
    settings = router.settings
    run = RunContext(stream, router.clock.now().timestamp(), settings.router_apply_calls_per_run)
    return await router.consume(run, REACTIONS, consumes=1, batch=settings.router_fetch_max_records)


# -- the storm -----------------------------------------------------------------------------------


def projects_on_distinct_streams(count: int) -> list[str]:
    """``count`` project IDs whose events land on ``count`` different streams."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < count:
        project = f"storm-{n}"
        found.setdefault(stream_index(project), project)
        n += 1
    return list(found.values())


def storm_events(clock: ManualClock, project: str) -> list[Event]:
    ctx = FactContext(Caller(TENANT, "system:storm", f"corr-{project}"), project, clock.now())
    return [
        ctx.fact(
            "task.completed", {"agentId": "builder"}, change_id=f"{project}-c1", task_id=f"t{i}"
        )
        for i in range(EVENTS_PER_PROJECT)
    ]


async def publish_as_the_publisher(world: World, events: list[Event]) -> None:
    """Send one project's events as the outbox publisher does: atomic batches of 100 with
    ``Nats-Msg-Id`` = the event ID, through the real sender."""
    ensure_project_roots(world.app, events)
    sender = JetStreamSender(
        await world.app.nats(), ack_timeout_s=world.app.settings.publish_ack_timeout_s
    )
    index = stream_index(events[0].project_id)
    for start in range(0, len(events), 100):
        messages = [
            OutgoingMessage(event_stream_subject(index), e.event_id, e.to_json())
            for e in events[start : start + 100]
        ]
        stored = await sender.send_batch(event_stream_name(index), messages)
        assert not any(s.duplicate for s in stored)


@dataclass
class Storm:
    """What the rounds of a storm did."""

    first: list[SubscriptionReport]  # each first-round tick's reactions batch per storm stream
    reports: list[SubscriptionReport]  # every reactions batch, the first round's included
    cursors: list[list[int]]  # records never delivered, per stream, before each round
    lags: list[ConsumerLag]  # per stream, at the end
    rounds: int


async def run_storm(world: World, streams: list[int]) -> Storm:
    """Round 1: a real sweep tick per stream, a minute apart. Then, a minute apart, rounds
    of one reactions batch for each stream with records waiting, side by side, until none
    waits."""
    router, clock = world.app.router(), world.clock
    first: list[SubscriptionReport] = []
    for minute in sorted(next(sweep_minutes(router.settings, s, clock.now())) for s in streams):
        clock.set(minute)
        sweep = await router.sweep(now=minute)
        first.append(sweep.run.subscriptions[REACTIONS.value])
        first += [
            report
            for name, report in sweep.reactions_elsewhere.items()
            if name in {event_stream_name(s) for s in streams}
        ]
    lags = [await reactions_lag(router, s) for s in streams]
    storm = Storm(first, list(first), [[EVENTS_PER_PROJECT] * len(streams)], lags, 1)
    while any(waiting(lag) for lag in lags) and storm.rounds < MAX_STORM_ROUNDS:
        storm.cursors.append([lag.num_pending for lag in lags])
        storm.rounds += 1
        clock.advance(60)
        lagging = [s for s, lag in zip(streams, lags, strict=True) if waiting(lag)]
        storm.reports += await asyncio.gather(*(reactions_batch(router, s) for s in lagging))
        lags = [await reactions_lag(router, s) for s in streams]
    storm.cursors.append([lag.num_pending for lag in lags])
    storm.lags = lags
    return storm


async def test_a_10000_event_storm_queues_on_the_streams_and_every_event_is_accounted_for(
    tmp_path: Path, settings: Settings, clock: ManualClock, storm_receiver: StormReceiver
) -> None:
    # GIVEN a webhook subscription of a tenant with a daily budget of 2,500 and an in-flight
    # cap of 3, and 10,000 matching events of that tenant on four streams
    clock.set(START)
    limits = ReactionSettings(
        reaction_daily_budget=DAILY_BUDGET, reaction_in_flight_cap=IN_FLIGHT_CAP
    )
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    started = time.monotonic()
    try:
        world.registry.create(
            TENANT,
            "storm-hook",
            Selector.create(["task.completed"]),
            webhook(storm_receiver.url),
            Governance(cooldown_s=0),
        )
        projects = projects_on_distinct_streams(STORM_PROJECTS)
        streams = [stream_index(p) for p in projects]
        event_ids: set[str] = set()
        for project in projects:
            events = storm_events(clock, project)
            event_ids.update(e.event_id for e in events)
            await publish_as_the_publisher(world, events)
        published_s = time.monotonic() - started

        # WHEN sweep ticks and reactions batches run round after round until nothing waits
        storm = await run_storm(world, streams)
        drained_s = time.monotonic() - started - published_s

        # THEN (a) a tick took one batch at most per stream: the cursors lagged and caught up
        # tick by tick (2,100 never delivered per stream after the first round's four ticks),
        # and nothing waits
        first_round = [(r.consumes, r.fetched) for r in storm.first]
        assert first_round == [(1, 100)] * STORM_PROJECTS * STORM_PROJECTS
        assert storm.cursors[1] == [EVENTS_PER_PROJECT - 100 * STORM_PROJECTS] * STORM_PROJECTS
        assert all(r.consumes == 1 and r.fetched <= 100 for r in storm.reports)
        for before, after in zip(storm.cursors[1:], storm.cursors[2:], strict=False):
            assert all(0 <= b - a <= 100 for b, a in zip(before, after, strict=True))
        assert [waiting(lag) for lag in storm.lags] == [0] * STORM_PROJECTS, storm.lags
        assert storm.rounds >= 1 + (EVENTS_PER_PROJECT - 100 * STORM_PROJECTS) // 100

        # (b) the receiver never answered more requests at once than the cap; what the cap
        # refused went back to its stream (retried) and came round again, nothing failed
        assert storm_receiver.refused == []
        assert 1 <= storm_receiver.most_at_once <= IN_FLIGHT_CAP
        sent_back = sum(r.retried for r in storm.reports)
        assert sent_back > 0
        assert sum(r.failed + r.dead_lettered for r in storm.reports) == 0

        # (c) exactly the budget was delivered, each once; every other event was skipped
        # with reason budget, and budget.exceeded was recorded once
        delivered = storm_receiver.delivered
        assert len(set(delivered)) == len(delivered) == DAILY_BUDGET
        product = world.app.product().connection
        skipped = suppressions(product, tenant_id=TENANT, limit=2 * STORM_EVENTS)
        assert Counter(s.reason for s in skipped) == {
            SuppressionReason.BUDGET: STORM_EVENTS - DAILY_BUDGET
        }
        budget_facts = sum(
            world.app.resource_shard(p, project_admin_key(p))
            .connection.execute("SELECT COUNT(*) FROM outbox WHERE event_type = 'budget.exceeded'")
            .fetchone()[0]
            for p in projects
        )
        assert budget_facts == 1
        assert metric_counts(product, MetricBinding.METRICS)["reaction_fired"] == DAILY_BUDGET
        refused = dict(
            product.execute(
                "SELECT json_extract(dimensions, '$.gate'), COUNT(*) FROM platform_metrics "
                "WHERE name = 'reaction_refused' GROUP BY 1"
            ).fetchall()
        )
        assert refused["budget"] == STORM_EVENTS - DAILY_BUDGET
        assert refused["in_flight"] > 0

        # (d) every event is accounted for, delivered or visibly skipped, none lost: each
        # event and each (event, subscription) delivery has its done claim, no dead letter,
        # and the streams still hold all 10,000
        delivered_events = {key.split(":", 1)[0] for key in delivered}
        skipped_events = {s.event_id for s in skipped}
        assert delivered_events.isdisjoint(skipped_events)
        assert delivered_events | skipped_events == event_ids
        claims = dict(
            product.execute(
                "SELECT instr(event_id, ':') > 0, COUNT(*) FROM processed_events "
                "WHERE consumer = ? AND status = 'done' GROUP BY 1",
                (REACTIONS.value,),
            ).fetchall()
        )
        assert claims == {0: STORM_EVENTS, 1: STORM_EVENTS}
        assert list_dead_letters(product) == []
        js = (await world.app.nats()).jetstream()
        stored = [(await js.stream_info(event_stream_name(s))).state.messages for s in streams]
        assert stored == [EVENTS_PER_PROJECT] * STORM_PROJECTS
        print(
            f"\nB8 storm: {STORM_EVENTS} events published in {published_s:.1f} s, drained in "
            f"{storm.rounds} rounds in {drained_s:.1f} s; the receiver answered at most "
            f"{storm_receiver.most_at_once} at once (cap {IN_FLIGHT_CAP}); "
            f"{sent_back} records sent back by the in-flight cap"
        )
    finally:
        await world.app.close()


# -- a self-caused loop --------------------------------------------------------------------------


def ring_fact(clock: ManualClock, member: int, task_id: str, correlation_id: str) -> Event:
    """The ``task.completed`` fact ring member ``member`` selects, written in
    ``correlation_id``."""
    ctx = FactContext(Caller(TENANT, "user:hook", correlation_id), PROJECT, clock.now())
    return ctx.fact(
        "task.completed", {"agentId": f"ring-{member}"}, change_id=f"{PROJECT}-r", task_id=task_id
    )


def ring_of(world: World, receiver: Receiver, size: int) -> list[str]:
    """``size`` webhook subscriptions; member ``i`` selects the facts of agent ``ring-i``."""
    return [
        world.registry.create(
            TENANT,
            f"ring-{i}",
            Selector.create(["task.completed"], {"payload.agentId": f"ring-{i}"}),
            webhook(receiver.url),
            Governance(cooldown_s=0),
        ).record.subscription_id
        for i in range(size)
    ]


@dataclass
class Loop:
    """What a reaction loop did: the sweep ticks it took, and the facts written, seed first."""

    ticks: int
    facts: list[Event]


async def run_ring_until_quiet(world: World, receiver: Receiver, ring: list[str]) -> Loop:
    """Seed the ring with member 0's fact and run the project stream's sweep ticks. Before
    each tick the receiver's owner answers every new delivery of member ``i`` with member
    ``i + 1``'s fact, in the delivery's correlation. Quiet: nothing new was delivered and
    nothing waits on the stream."""
    router, clock = world.app.router(), world.clock
    facts = [ring_fact(clock, 0, "t0", "corr-seed")]
    await world.publish(facts[0])
    answered = 0
    minutes = sweep_minutes(router.settings, STREAM, clock.now())
    for tick in range(1, MAX_LOOP_TICKS + 1):
        new = receiver.received[answered:]
        answered += len(new)
        for headers, _ in new:
            member = ring.index(headers["webhook-id"].split(":", 1)[1])
            echo = ring_fact(
                clock, (member + 1) % len(ring), f"t{len(facts)}", headers["webhook-id"]
            )
            await world.publish(echo)
            facts.append(echo)
        if not new and waiting(await reactions_lag(router, STREAM)) == 0:
            return Loop(tick, facts)
        minute = next(minutes)
        clock.set(minute)
        await router.sweep(now=minute)
    raise AssertionError(f"the reaction loop still ran after {MAX_LOOP_TICKS} sweep ticks")


async def test_a_loop_between_two_subscriptions_stops_at_the_self_cause_guard(
    world: World, receiver: Receiver
) -> None:
    # GIVEN two subscriptions A and B, each delivery answered with a fact the other one
    # matches: A → B → A …
    a, b = ring = ring_of(world, receiver, 2)

    # WHEN member 0's fact arrives and sweep ticks run until the stream is quiet
    loop = await run_ring_until_quiet(world, receiver, ring)

    # THEN A fired, then B; the fact B's delivery caused was held back before A fired again,
    # as self-caused, recorded with the chain A, B — and the loop ended by itself
    e0, e1, e2 = loop.facts
    assert [h["webhook-id"] for h, _ in receiver.received] == [
        f"{e0.event_id}:{a}",
        f"{e1.event_id}:{b}",
    ]
    (suppression,) = world.suppressed()
    assert (suppression.event_id, suppression.subscription_id) == (e2.event_id, a)
    assert suppression.reason is SuppressionReason.SELF_CAUSE
    assert suppression.cause_chain.hops == (Hop(e0.event_id, a), Hop(e1.event_id, b))
    assert metric_counts(world.app.product().connection)["reaction_suppressed"] == 1
    assert loop.ticks <= 2 * (len(loop.facts) + 1)
    print(f"\nB8 loop A→B→A: quiet after {loop.ticks} sweep ticks")


async def test_a_chain_through_more_subscriptions_than_the_depth_cap_stops_at_the_cap(
    world: World, receiver: Receiver
) -> None:
    # GIVEN ten subscriptions in a ring — more than the depth cap of 8, so no subscription
    # repeats within the cap — each delivery answered with the fact the next one matches
    cap = ReactionSettings().reaction_depth_cap
    ring = ring_of(world, receiver, cap + 2)

    # WHEN member 0's fact arrives and sweep ticks run until the stream is quiet
    loop = await run_ring_until_quiet(world, receiver, ring)

    # THEN exactly ``cap`` reactions fired, on the facts 0 … cap-1 reactions deep; the fact
    # ``cap`` deep was held back by the depth cap, recorded with its whole chain, and
    # nothing fired past it — the chain ended by itself
    facts = loop.facts
    assert len(facts) == cap + 1
    assert [h["webhook-id"] for h, _ in receiver.received] == [
        f"{facts[i].event_id}:{ring[i]}" for i in range(cap)
    ]
    (suppression,) = world.suppressed()
    assert (suppression.event_id, suppression.subscription_id) == (facts[cap].event_id, ring[cap])
    assert suppression.reason is SuppressionReason.DEPTH
    assert suppression.depth == cap
    assert suppression.cause_chain.hops == tuple(
        Hop(facts[i].event_id, ring[i]) for i in range(cap)
    )
    assert loop.ticks <= 2 * (len(facts) + 1)
    print(f"\nB8 chain of {len(ring)}: stopped at depth {cap} after {loop.ticks} sweep ticks")
