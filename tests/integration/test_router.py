"""The event router against a real nats-server, real SQLite files and moto's S3 server
(spec "Event router: the event log consumer", the router rows of "Sweep housekeeping" and
"Idempotency and dedupe")."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js.api import AckPolicy, DeliverPolicy
from nats.js.errors import NotFoundError

from project_roots import ensure_project_roots
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.archive import ArchiveReader
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.log_context import CorrelationIdFilter
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import NatsUnavailableError
from rhumbatron.messaging.event_log import ConsumerLag, Subscription
from rhumbatron.messaging.pull import ConsumerChange
from rhumbatron.metrics import MetricBinding, metric_counts
from rhumbatron.product.audit import list_audit, record_audit
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, event_stream_subject, stream_index
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.router.capacity import DRAIN_AT_SHARE, ceilings, observed_events_per_day
from rhumbatron.router.claims import claim_events
from rhumbatron.router.handlers import AuditArchiver, CausalRouting, NoCausalRules, RunContext
from rhumbatron.router.maintenance import prune_processed_events, run_maintenance
from rhumbatron.router.nudge import InProcessNudge
from rhumbatron.router.records import APPLIED, Outcome, Record, RecordOutcome, decode_records
from rhumbatron.router.reports import RunReport, SweepReport
from rhumbatron.router.ticks import tick_kind
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess
from server_counts import settles_to

from .test_queue_consumer import AckTap

pytestmark = pytest.mark.integration

CALLER = Caller("acme", "system:test", correlation_id="corr-router")
PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR
CAUSAL = Subscription.CAUSAL_ROUTER
REACTIONS = Subscription.REACTIONS
START = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)  # minute of day 600 -> stream 0


def projects_on_stream(stream: int, count: int) -> list[str]:
    """``count`` project IDs whose events go to stream ``stream``."""
    names = (f"proj-{i}" for i in itertools.count())
    return list(itertools.islice((n for n in names if stream_index(n) == stream), count))


def sweep_minute(stream: int, day_offset: int = 0) -> datetime:
    """A sweep minute that visits ``stream`` and is neither maintenance nor release sweep."""
    for minute in range(600, 700):
        when = START.replace(hour=minute // 60, minute=minute % 60) + timedelta(days=day_offset)
        index, maintenance, release = tick_kind(load_settings(), when)
        if index == stream and not maintenance and not release:
            return when
    raise AssertionError("unreachable")


def lifecycle(project_id: str, now: datetime, change: str = "chg-1") -> list[Event]:
    """A small project history: created, a change with two tasks, one completed."""
    ctx = FactContext(CALLER, project_id, now)
    change_id = f"{project_id}-{change}"
    return [
        ctx.fact("project.created", {"name": f"Project {project_id}"}),
        ctx.fact(
            "change.created",
            {"title": "Add login", "clientRequestId": f"req-{change}", "requestedBy": "user:1"},
            change_id=change_id,
        ),
        ctx.fact("change.planned", {"taskIds": ["t1", "t2"]}, change_id=change_id),
        ctx.fact("task.ready", {}, change_id=change_id, task_id="t1"),
        ctx.fact("task.assigned", {"agentId": "agent-7"}, change_id=change_id, task_id="t1"),
        ctx.fact("task.completed", {"agentId": "agent-7"}, change_id=change_id, task_id="t1"),
    ]


#: The events of :func:`lifecycle` a causal rule acts on (change.planned, task.completed): the
#: causal router leases and settles only those; it acks the other four with no claim.
ROUTED_IN_LIFECYCLE = 2


def causal_claims(app: Rhumbatron, stream: int) -> set[str]:
    """The Event IDs the causal router holds a claim for on ``stream``."""
    rows = (
        app.router()
        .stream_state(stream)
        .connection.execute(
            "SELECT event_id FROM processed_events WHERE consumer = ?", (CAUSAL.value,)
        )
    )
    return {row[0] for row in rows}


def wakes(project_id: str, now: datetime, count: int) -> list[Event]:
    ctx = FactContext(CALLER, project_id, now)
    return [
        ctx.fact("agent.woke", {"agentId": f"agent-{i}"}, change_id=f"{project_id}-c", key=str(i))
        for i in range(count)
    ]


AppFactory = Callable[..., Awaitable[Rhumbatron]]
T = TypeVar("T")


@pytest_asyncio.fixture
async def make_app(
    settings: Settings, s3_server: S3ServerProcess, clock: ManualClock
) -> AsyncIterator[AppFactory]:
    """Builds runtimes on the test's nats-server and state dir, with its own bucket."""
    apps: list[Rhumbatron] = []
    # A fresh name per test: an id() can come back once its object is gone, and the moto
    # server (one per module) would hand the next test the last one's archive objects.
    bucket = f"evidence-{uuid.uuid4().hex[:20]}"
    clock.set(START)

    async def build(
        nudge: InProcessNudge | None = None,
        causal_routing: CausalRouting | None = None,
        **overrides: Any,
    ) -> Rhumbatron:
        values = settings.model_dump() | {
            "s3_endpoint_url": s3_server.endpoint_url,
            "evidence_bucket": bucket,
            **overrides,
        }
        app = bootstrap(
            load_settings(**values),
            clock=clock,
            alarms=RecordingAlarmSink(),
            nudge=nudge,
            causal_routing=causal_routing,
        )
        await app.ensure_streams()
        if not apps:
            app.s3().create_bucket(Bucket=bucket)
        apps.append(app)
        return app

    yield build
    for app in apps:
        await app.close()


@pytest_asyncio.fixture
async def acks(nats_server: NatsServerProcess) -> AsyncIterator[AckTap]:
    """The acks stream 0's consumers send, as nats-server receives them."""
    tap = await AckTap.open(nats_server.url, event_stream_name(0))
    yield tap
    await tap.close()


class NakTap:
    """The naks nats-server has processed for the consumers of one stream, from its
    ``MSG_NAKED`` advisories.

    A nak that reached the server (its sender flushed) is not yet processed: JetStream takes
    acks and naks off a queue of the consumer's own, apart from its queue of pull requests, so
    another reader's pull can be answered first. The server sends the advisory while it
    processes the nak, under the consumer's lock that a pull takes too, before it puts the
    record on the redelivery queue: a pull that follows the advisory finds the record.
    """

    def __init__(self, nc: NATS, sub: NatsSubscription) -> None:
        self._nc = nc
        self._sub = sub

    @classmethod
    async def open(cls, url: str, stream: str) -> NakTap:
        nc = await nats.connect(url, name="test-nak-tap")
        sub = await nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.{stream}.*")
        await nc.flush()  # the server sends an advisory only to a subscription it knows
        return cls(nc, sub)

    async def processed(self, consumer: str, count: int) -> list[int]:
        """The stream sequences of the next ``count`` naks processed for ``consumer``, as
        they come; a nak that never comes fails the test after 10 s."""
        seqs: list[int] = []
        while len(seqs) < count:
            advisory = json.loads((await self._sub.next_msg(timeout=10)).data)
            if advisory["consumer"] == consumer:
                seqs.append(advisory["stream_seq"])
        return seqs

    async def close(self) -> None:
        await self._nc.close()


@pytest_asyncio.fixture
async def naks(nats_server: NatsServerProcess) -> AsyncIterator[NakTap]:
    """The naks nats-server has processed for stream 0's consumers."""
    tap = await NakTap.open(nats_server.url, event_stream_name(0))
    yield tap
    await tap.close()


async def publish(app: Rhumbatron, events: list[Event]) -> None:
    """Put events on their streams as the outbox publisher does (Nats-Msg-Id = event ID),
    their projects created first (the router checks an event's tenant against its root)."""
    ensure_project_roots(app, events)
    js = (await app.nats()).jetstream()
    for event in events:
        subject = event_stream_subject(stream_index(event.project_id))
        await js.publish(subject, event.to_json(), headers={"Nats-Msg-Id": event.event_id})


async def two_events_each(app: Rhumbatron, clock: ManualClock, count: int) -> list[str]:
    """``count`` projects of stream 0, each with the first two facts of its lifecycle on the
    stream (published in project order); their IDs."""
    projects = projects_on_stream(0, count)
    for project in projects:
        await publish(app, lifecycle(project, clock.now())[:2])
    return projects


async def publish_raw(app: Rhumbatron, stream: int, body: bytes, msg_id: str) -> None:
    js = (await app.nats()).jetstream()
    await js.publish(event_stream_subject(stream), body, headers={"Nats-Msg-Id": msg_id})


async def until(
    run: Callable[[], Awaitable[T]], done: Callable[[T], bool], attempts: int = 200
) -> T:
    """Run ``run`` until ``done`` holds, a bounded number of times.

    JetStream processes acks and naks on a queue of its own: a redelivery can trail a nak
    by a moment. This bounds that wait instead of sleeping a guessed time.
    """
    for _ in range(attempts):
        result = await run()
        if done(result):
            return result
    raise AssertionError(f"condition not reached after {attempts} runs")


async def settled_lag(app: Rhumbatron, stream: int = 0) -> ConsumerLag:
    """The projector's lag on ``stream`` once every ack sent to it is settled. JetStream
    settles acks on a queue of its own, so the lag may trail an ack by a moment; an ack never
    sent is never settled, and the wait fails."""
    log = await app.router().event_log()
    return await until(lambda: log.lag(stream, PROJECTOR), lambda lag: lag.num_ack_pending == 0)


def view_count(app: Rhumbatron, project_id: str, table: str = "project_events") -> int:
    view = app.router().projector.view(project_id)
    sql = f"SELECT COUNT(*) FROM {table} WHERE project_id = ?"
    return int(view.connection.execute(sql, (project_id,)).fetchone()[0])


async def test_each_stream_gets_the_specs_four_durable_consumers_and_reactions_at_first_read(
    make_app: AppFactory,
) -> None:
    # GIVEN streams and no reader yet
    app = await make_app()
    js = (await app.nats()).jetstream()
    with pytest.raises(NotFoundError):
        await js.consumer_info(event_stream_name(0), PROJECTOR.value)

    # WHEN the sweep visits stream 0
    await app.router().sweep(now=sweep_minute(0))

    # THEN stream 0 has exactly the spec's four durable pull consumers (S0-097) and the
    # reactions' (seed 002: every reaction is one more cursor), explicit ack, 5-minute ack
    # wait; stream 1 has only reactions, which every tick reads on every stream (the others
    # are created at their first read there). The names are the spec's, written out: taken
    # from the project's own enum they would prove nothing.
    names = sorted([c.name async for c in _consumers(js, event_stream_name(0))])
    assert names == [
        "analytics-projector",
        "audit-archiver",
        "causal-router",
        "project-view-projector",
        "reactions",
    ]
    for subscription in Subscription:
        info = await js.consumer_info(event_stream_name(0), subscription.value)
        assert info.config.durable_name == subscription.value
        assert info.config.ack_policy == AckPolicy.EXPLICIT
        assert info.config.ack_wait == 300
        assert info.config.deliver_subject is None  # a pull consumer
        # durable: the server never removes it for being idle (its cursor would be lost)
        assert not info.config.inactive_threshold
        # every record from the first, redelivered without a server-side limit (the router
        # counts failures itself: JetStream must never stop redelivering), and at most the
        # settings' records in flight
        assert info.config.deliver_policy == DeliverPolicy.ALL
        assert info.config.max_deliver == -1
        assert info.config.max_ack_pending == app.settings.router_max_ack_pending
    assert [c.name async for c in _consumers(js, event_stream_name(1))] == [REACTIONS.value]


async def _consumers(js: Any, stream: str) -> AsyncIterator[Any]:
    for info in await js.consumers_info(stream):
        yield info


async def test_a_warm_log_client_pulls_through_the_consumer_it_ensured_once(
    make_app: AppFactory,
) -> None:
    # GIVEN a log client that has read stream 0 once, creating the projector's consumer
    # with a window of records in flight other than the server's default (1,000)
    app = await make_app(router_max_ack_pending=250)
    log = await app.router().event_log()
    await log.fetch(0, PROJECTOR, 1)
    puller = log._pullers[(0, PROJECTOR)]

    # WHEN it reads again
    await log.fetch(0, PROJECTOR, 1)

    # THEN it reused the same puller without asking the server about the consumer again (the
    # first answer, "created", still stands), with a bounded pull and a late-message window
    # shorter than the ack wait: a record held longer than that is JetStream's to redeliver
    assert log._pullers[(0, PROJECTOR)] is puller
    assert log.consumer_changes[(0, PROJECTOR)] is ConsumerChange.CREATED
    assert puller.timeout_s == app.settings.router_fetch_timeout_s
    assert puller.keep_late_s == app.settings.router_ack_wait_s / 2
    info = await (await app.nats()).jetstream().consumer_info(event_stream_name(0), PROJECTOR.value)
    assert info.config.max_ack_pending == 250


async def test_a_consumer_not_created_yet_lags_by_the_whole_stream(make_app: AppFactory) -> None:
    # GIVEN 3 records on stream 0 and no reader yet
    app = await make_app()
    js = (await app.nats()).jetstream()
    for _ in range(3):
        await js.publish(event_stream_subject(0), b"{}")
    log = await app.router().event_log()

    # WHEN the projector's lag is read
    lag = await log.lag(0, PROJECTOR)

    # THEN it is all of the stream, nothing in flight, and the consumer does not exist
    assert (lag.num_pending, lag.num_ack_pending, lag.exists) == (3, 0, False)


async def test_a_changed_ack_wait_updates_the_existing_consumer(make_app: AppFactory) -> None:
    # GIVEN consumers created with the spec's 5-minute ack wait
    first = await make_app()
    await first.router().nudge(0)
    # WHEN a runtime with another ack wait reads the stream
    second = await make_app(router_ack_wait_s=120)
    await second.router().nudge(0)
    # THEN the consumer was updated in place (pull_subscribe alone would not)
    js = (await second.nats()).jetstream()
    info = await js.consumer_info(event_stream_name(0), PROJECTOR.value)
    assert info.config.ack_wait == 120
    log = await second.router().event_log()
    assert log.consumer_changes[(0, PROJECTOR)] is ConsumerChange.UPDATED


async def test_a_nudge_runs_the_projector_then_the_causal_router_into_the_project_view(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a project's history on its stream
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, lifecycle(project, clock.now()))

    # WHEN the stream is nudged
    report = await app.router().nudge(0)

    # THEN the projector and the causal router ran (the projector started first, then the
    # two side by side: S0-068 is adapted), and nothing else, in a run named for the nudge
    assert (report.stream_index, report.kind) == (0, "nudge")
    assert list(report.subscriptions) == [PROJECTOR.value, CAUSAL.value]
    assert report.subscriptions[PROJECTOR.value].applied == 6
    assert report.subscriptions[CAUSAL.value].applied == 6
    # AND the view shows what a dashboard needs
    view = app.router().projector.view(project).snapshot()
    assert view["name"] == f"Project {project}"
    assert view["changesByState"] == {"open": 1}
    assert view["tasksByState"] == {"completed": 1, "planned": 1}
    assert view["activeAgents"] == []
    assert view["latestEvents"][0]["eventType"] == "task.completed"
    lags = {(lag.stream, lag.consumer): lag for lag in await app.router().consumer_lags()}
    assert lags[(event_stream_name(0), PROJECTOR.value)].num_pending == 0
    assert lags[(event_stream_name(0), PROJECTOR.value)].num_ack_pending == 0


async def test_a_warm_nudge_asks_for_the_projectors_records_before_the_causal_routers(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN a stream both subscriptions have read once (consumers made, view store open)
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, lifecycle(project, clock.now()))
    await app.router().nudge(0)
    # AND a second client on the JetStream pull requests of stream 0, and more events
    tap = await nats.connect(nats_server.url, name="test-pull-tap")
    pulls = await tap.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{event_stream_name(0)}.*")
    await tap.flush()
    await publish(app, wakes(project, clock.now(), 3))

    # WHEN the stream is nudged again
    await app.router().nudge(0)

    # THEN the projector's pull reached the server first, then the causal router's (S0-068,
    # adapted: the nudge starts the projector first, then the two run side by side)
    await (await app.nats()).flush()
    await tap.flush()
    asked = []
    while pulls.pending_msgs:
        asked.append((await pulls.next_msg(timeout=1)).subject.rsplit(".", 1)[-1])
    await tap.close()
    assert asked[:2] == [PROJECTOR.value, CAUSAL.value]


async def test_one_consume_fetches_at_most_100_records_and_a_nudge_does_two(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN 250 events on one stream
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, wakes(project, clock.now(), 250))

    # WHEN one nudge runs
    report = await app.router().nudge(0)

    # THEN each subscription consumed twice, 100 records each, and 50 wait for the next run
    for name in (PROJECTOR.value, CAUSAL.value):
        assert report.subscriptions[name].consumes == 2
        assert report.subscriptions[name].fetched == 200
    lag = (await app.router().event_log()).lag
    assert (await lag(0, PROJECTOR)).num_pending == 50

    # WHEN the next nudge runs
    again = await app.router().nudge(0)

    # THEN its first fetch came back short (50), which ended the run: one consume each
    for name in (PROJECTOR.value, CAUSAL.value):
        assert (again.subscriptions[name].consumes, again.subscriptions[name].fetched) == (1, 50)


async def test_a_sweep_tick_does_at_most_two_consumes_of_the_projector_and_the_causal_router(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN 250 events on one stream
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, wakes(project, clock.now(), 250))

    # WHEN one sweep tick visits that stream
    sweep = await app.router().sweep(now=sweep_minute(0))

    # THEN each of the two subscriptions consumed twice, 100 records each (S0-071, as a
    # nudge does), and 50 wait for the next run
    for subscription in (PROJECTOR, CAUSAL):
        sub = sweep.run.subscriptions[subscription.value]
        assert (sub.consumes, sub.fetched) == (2, 200), subscription
        lag = await (await app.router().event_log()).lag(0, subscription)
        assert lag.num_pending == 50, subscription


async def test_a_consume_asked_for_more_than_100_records_still_fetches_at_most_100(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN 250 events on one stream
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, wakes(project, clock.now(), 250))
    router = app.router()

    # WHEN a consume of one fetch asks for 250 records at once
    report = await router.consume(router.run_context(0), CAUSAL, consumes=1, batch=250)

    # THEN that fetch brought 100 and 150 wait (spec S0-063: the cap holds for any caller)
    assert (report.consumes, report.fetched) == (1, 100)
    assert (await (await router.event_log()).lag(0, CAUSAL)).num_pending == 150


async def test_an_empty_fetch_is_a_normal_outcome(make_app: AppFactory) -> None:
    app = await make_app()
    report = await app.router().nudge(5)
    sub = report.subscriptions[PROJECTOR.value]
    assert (sub.consumes, sub.fetched, sub.failed) == (1, 0, 0)


async def test_the_same_batch_delivered_again_applies_nothing_and_is_acked(
    make_app: AppFactory, clock: ManualClock
) -> None:
    """The spec's sequence diagram: the second delivery finds the claim and applies nothing."""
    # GIVEN an event E that the projector claimed and applied, but whose ack never happened
    app = await make_app()
    router = app.router()
    (project,) = projects_on_stream(0, 1)
    event = lifecycle(project, clock.now())[0]
    await publish(app, [event])
    log = await router.event_log()
    messages = await log.fetch(0, PROJECTOR, 100)
    run = router.run_context(0)
    first = await router.projector.handle(decode_records(messages, 0, router.project_owners), run)
    assert first[event.event_id].outcome.value == "applied"
    await messages[0].nak()  # JetStream delivers the same message again (at least once)

    # WHEN the same batch comes back (the server handles a nak on its own queue, so the
    # redelivery can trail the nak by a moment)
    report = await until(
        lambda: router.nudge(0), lambda r: r.subscriptions[PROJECTOR.value].fetched > 0
    )

    # THEN the claim row makes it a duplicate: nothing applied, and it is acked
    assert report.subscriptions[PROJECTOR.value].duplicates == 1
    assert report.subscriptions[PROJECTOR.value].applied == 0
    assert view_count(app, project) == 1
    assert (await settled_lag(app)).num_ack_pending == 0


async def test_an_event_published_again_after_the_dedupe_window_is_applied_once(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN an event a causal rule acts on (change.planned), applied once, then re-sent under
    #   a new message ID (the window passed)
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    event = lifecycle(project, clock.now())[2]
    await publish(app, [event])
    await app.router().nudge(0)
    await publish_raw(app, 0, event.to_json(), msg_id=f"{event.event_id}-again")
    # WHEN it is consumed (a pull right after the store can trail it by a moment under load,
    # so the runs go on until both subscriptions fetched it)
    duplicates = {PROJECTOR.value: 0, CAUSAL.value: 0}
    fetched = dict(duplicates)

    async def consume() -> None:
        report = await app.router().nudge(0)
        for name in duplicates:
            duplicates[name] += report.subscriptions[name].duplicates
            fetched[name] += report.subscriptions[name].fetched

    await until(consume, lambda _: all(fetched.values()))
    # THEN every subscription saw a duplicate, and the view counts the event once
    assert duplicates == {PROJECTOR.value: 1, CAUSAL.value: 1}
    assert fetched == {PROJECTOR.value: 1, CAUSAL.value: 1}
    assert view_count(app, project) == 1


@pytest.mark.parametrize("stream", [-1, 8])
async def test_a_nudge_of_a_stream_outside_the_eight_is_refused_naming_the_range(
    make_app: AppFactory, stream: int
) -> None:
    app = await make_app()
    with pytest.raises(ValueError) as refused:
        await app.router().nudge(stream)
    assert str(refused.value) == f"stream index {stream} is outside 0..7"
    # (refused before it began: it counts as no nudge for the capacity's checks)
    assert not app.router().nudged_lately(app.clock.now().timestamp())


async def test_with_no_causal_rules_installed_every_event_is_applied_with_no_claim(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a router with no causal rules installed, and a project's history on its stream
    app = await make_app(causal_routing=NoCausalRules())
    (project,) = projects_on_stream(1, 1)
    await publish(app, lifecycle(project, clock.now()))
    # WHEN the stream is nudged
    report = await app.router().nudge(1)
    # THEN the causal router applied every event, and took no lease for any (no claim row)
    assert report.subscriptions[CAUSAL.value].applied == 6
    claims = app.router().stream_state(1).connection
    assert claims.execute("SELECT COUNT(*) FROM processed_events").fetchone()[0] == 0


class RulesThatCrashOnce:
    """Causal rules that act on every Event and raise while routing their first batch (a
    rule's bug, not an Event's); every Event given after that is routed."""

    def __init__(self) -> None:
        self.crashed = False
        self.routed: list[str] = []

    def acts_on(self, event: Event) -> bool:
        return True

    async def route(
        self, events: Sequence[Event], traces: Mapping[str, str] | None = None
    ) -> dict[str, RecordOutcome]:
        if not self.crashed:
            self.crashed = True
            raise RuntimeError("a rule fell over")
        self.routed += [event.event_id for event in events]
        return {event.event_id: APPLIED for event in events}


async def test_a_crashing_causal_rule_fails_its_events_with_the_reason_and_routes_them_next_run(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN causal rules that raise while routing the first batch, and one event on stream 0
    rules = RulesThatCrashOnce()
    app = await make_app(causal_routing=rules, router_nak_delay_s=0)
    (project,) = projects_on_stream(0, 1)
    (event,) = lifecycle(project, clock.now())[:1]
    await publish(app, [event])
    # WHEN the stream is nudged
    caplog.handler.addFilter(CorrelationIdFilter())
    with caplog.at_level(logging.WARNING):
        first = (await app.router().nudge(0)).subscriptions[CAUSAL.value]
    # THEN the run goes on and fails the event (one failure counted, with the rule's error
    #   as its reason), says so with the traceback, and releases its lease
    assert (first.applied, first.failed) == (0, 1)
    state = app.router().stream_state(0)
    assert state.failures(CAUSAL.value, event.event_id) == 1
    (reason,) = state.connection.execute(
        "SELECT last_error FROM k2_batch_failures WHERE consumer = ?", (CAUSAL.value,)
    ).fetchone()
    assert reason == "routing failed: a rule fell over"
    (logged,) = [r for r in caplog.records if r.name == "rhumbatron.router.handlers"]
    assert logged.getMessage() == "causal routing failed"
    assert logged.exc_info is not None and str(logged.exc_info[1]) == "a rule fell over"
    # (the failure's count is a warning carrying the event's correlation ID, for the search)
    (counted,) = [r for r in caplog.records if r.getMessage().startswith(f"{CAUSAL} failed ")]
    assert getattr(counted, "correlation_id", None) == event.correlation_id
    assert causal_claims(app, 0) == set()
    # WHEN the redelivery comes
    again = await until(
        lambda: app.router().nudge(0), lambda r: r.subscriptions[CAUSAL.value].applied > 0
    )
    # THEN it is routed, once, and its lease completes
    assert again.subscriptions[CAUSAL.value].applied == 1
    assert rules.routed == [event.event_id]
    assert causal_claims(app, 0) == {event.event_id}


async def test_the_causal_router_acks_an_event_no_rule_acts_on_with_no_claim(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a project's history: of its six events, the rules act on change.planned and
    #   task.completed only
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    events = lifecycle(project, clock.now())
    await publish(app, events)
    # WHEN the router reads them
    first = (await app.router().nudge(0)).subscriptions[CAUSAL.value]
    # THEN the causal router applied all six, and leased and settled only the two routed ones
    assert (first.applied, first.duplicates, first.failed) == (6, 0, 0)
    routed = {e.event_id for e in events if e.event_type in ("change.planned", "task.completed")}
    assert causal_claims(app, 0) == routed
    assert len(routed) == ROUTED_IN_LIFECYCLE

    # WHEN the unrouted project.created comes again under a new message ID
    await publish_raw(app, 0, events[0].to_json(), msg_id=f"{events[0].event_id}-again")
    # (a no-wait pull right after the PubAck may find the consumer not yet told of it)
    run = await until(
        lambda: app.router().nudge(0), lambda r: r.subscriptions[CAUSAL.value].fetched > 0
    )
    again = run.subscriptions[CAUSAL.value]
    # THEN it is applied again, still with no claim (nothing happens twice: no rule acts on
    #   it), while the projector takes it as a duplicate of its own claim
    assert (again.applied, again.duplicates) == (1, 0)
    assert causal_claims(app, 0) == routed
    assert view_count(app, project) == 6


async def test_the_same_event_twice_in_one_batch_is_applied_once(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN an event on the stream twice (re-sent under another message ID) before any run
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    event = lifecycle(project, clock.now())[0]
    await publish(app, [event])
    await publish_raw(app, 0, event.to_json(), msg_id=f"{event.event_id}-again")
    # WHEN one nudge fetches both in one batch
    report = await app.router().nudge(0)
    # THEN no subscription failed either record, both were acked, and the view holds the
    #   event once
    for name in (PROJECTOR.value, CAUSAL.value):
        sub = report.subscriptions[name]
        assert (sub.fetched, sub.applied + sub.duplicates, sub.failed) == (2, 2, 0), name
    assert view_count(app, project) == 1
    assert (await settled_lag(app)).num_ack_pending == 0


async def test_a_record_settled_with_a_warning_logs_its_events_correlation_id(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN an event on stream 0 and its view file held by another writer
    app = await make_app(sqlite_busy_timeout_ms=0)
    (project,) = projects_on_stream(0, 1)
    event = lifecycle(project, clock.now())[0]
    await publish(app, [event])
    store = app.router().projector.views(0)
    assert store.connection is not None  # opening makes the file
    caplog.handler.addFilter(CorrelationIdFilter())
    # WHEN a nudge cannot apply it and leaves it to retry
    with held_by_another_writer(store.path):
        report = await app.router().nudge(0)
    assert report.subscriptions[PROJECTOR.value].retried == 1
    # THEN the warning saying so carries the event's correlation ID, for the log search
    [warned] = [r for r in caplog.records if " retries " in r.getMessage()]
    assert getattr(warned, "correlation_id", None) == event.correlation_id == CALLER.correlation_id


async def test_a_record_left_to_retry_is_nacked_with_the_nack_delay(
    make_app: AppFactory, clock: ManualClock, acks: AckTap
) -> None:
    # GIVEN an event on stream 0 and its view file held by another writer
    app = await make_app(sqlite_busy_timeout_ms=0)
    (project,) = projects_on_stream(0, 1)
    await publish(app, lifecycle(project, clock.now())[:1])
    store = app.router().projector.views(0)
    assert store.connection is not None  # opening makes the file
    # WHEN a nudge cannot apply it
    with held_by_another_writer(store.path):
        report = await app.router().nudge(0)
    # THEN the projector leaves it to retry, nacked with the 30 s delay (not at once)
    assert report.subscriptions[PROJECTOR.value].retried == 1
    naks = [a for a in await acks.seen(app, consumer=PROJECTOR.value) if a.kind == "-NAK"]
    assert [(a.stream_seq, a.delay_s) for a in naks] == [(1, 30.0)]


async def test_the_apply_cap_defers_events_without_counting_a_failure(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN five projects with events on one stream and a cap of 2 apply calls per run
    app = await make_app(router_apply_calls_per_run=2)
    projects = await two_events_each(app, clock, 5)

    # WHEN one nudge runs
    report = await app.router().nudge(0)

    # THEN two projects were applied and the rest deferred — not failed, not counted
    projector = report.subscriptions[PROJECTOR.value]
    assert projector.applied == 4
    assert projector.deferred >= 6
    assert projector.failed == 0
    assert failures_counted(app, 0) == 0

    # AND the deferred events come back with the next deliveries and are all applied
    await until(
        lambda: app.router().nudge(0),
        lambda _: [view_count(app, p) for p in projects] == [2] * 5,
    )


async def test_a_run_that_leaves_records_waiting_asks_for_what_the_next_fetch_leaves_to_fill(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN six projects with two events each on one stream, fetches of 4 records and a cap
    #   of 3 apply calls per run
    app = await make_app(router_apply_calls_per_run=3, router_fetch_max_records=4)
    await two_events_each(app, clock, 6)
    # WHEN one nudge runs: its second fetch applies one project and keeps the other's two
    report = await app.router().nudge(0)
    assert (report.subscriptions[PROJECTOR.value].deferred, report.left_waiting) == (2, True)
    # THEN it asked for the 2 records the next run's fetch of 4 leaves to fill, no more: 4 are
    # delivered and unacked (2 kept, 2 asked for) and 2 still wait on the stream
    log = await app.router().event_log()

    async def delivered_and_waiting() -> tuple[int, int]:
        lag = await log.lag(0, PROJECTOR)
        return lag.num_ack_pending, lag.num_pending

    await settles_to(delivered_and_waiting, (4, 2))


async def test_the_apply_cap_holds_across_the_fetches_of_one_run(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN four projects with two events each on one stream, fetches of 4 records and a
    #   cap of 3 apply calls per run
    app = await make_app(router_apply_calls_per_run=3, router_fetch_max_records=4)
    projects = await two_events_each(app, clock, 4)

    # WHEN one nudge runs (two fetches: the first two projects, then the last two)
    report = await app.router().nudge(0)

    # THEN the first fetch spent two calls and the second fetch one: its second project waits
    projector = report.subscriptions[PROJECTOR.value]
    assert (projector.consumes, projector.fetched) == (2, 8)
    assert (projector.applied, projector.deferred) == (6, 2)
    assert [view_count(app, p) for p in projects] == [2, 2, 2, 0]
    assert report.left_waiting


async def test_a_run_whose_calls_are_spent_fetches_nothing_more(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN four projects with two events each, fetches of 4 records and 2 calls per run
    app = await make_app(router_apply_calls_per_run=2, router_fetch_max_records=4)
    await two_events_each(app, clock, 4)

    # WHEN one nudge runs
    report = await app.router().nudge(0)

    # THEN its first fetch spent both calls, and it fetched no second batch only to defer it
    projector = report.subscriptions[PROJECTOR.value]
    assert (projector.consumes, projector.fetched, projector.applied) == (1, 4, 4)
    assert projector.deferred == 0 and not report.left_waiting
    lag = await settled_lag(app)
    assert (lag.num_pending, lag.num_ack_pending) == (4, 0)


async def test_deferred_records_are_kept_for_the_next_run_not_delivered_again(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN five projects with two events each on one stream and a cap of 2 calls per run
    app = await make_app(router_apply_calls_per_run=2)
    projects = await two_events_each(app, clock, 5)
    router = app.router()
    js = (await app.nats()).jetstream()

    # WHEN three nudges run one after the other in this process
    applied = []
    for _ in range(3):
        report = await router.nudge(0)
        applied.append(report.subscriptions[PROJECTOR.value].applied)
        info = await js.consumer_info(event_stream_name(0), PROJECTOR.value)
        # THEN after each, the records it deferred are still delivered to this process,
        #   unacknowledged, and JetStream never had to send one of them again
        assert info.num_redelivered == 0
        assert info.num_ack_pending == report.subscriptions[PROJECTOR.value].deferred

    # AND the three runs applied two projects each, from the one delivery
    assert applied == [4, 4, 2]
    assert [view_count(app, p) for p in projects] == [2] * 5
    assert await router.release_held(0) == 0


async def test_records_left_waiting_are_nacked_for_any_reader_when_no_run_follows(
    make_app: AppFactory, clock: ManualClock, naks: NakTap
) -> None:
    # GIVEN a run that left six records waiting (five projects, a cap of 2 calls)
    first = await make_app(router_apply_calls_per_run=2)
    projects = await two_events_each(first, clock, 5)
    report = await first.router().nudge(0)
    assert report.subscriptions[PROJECTOR.value].deferred == 6
    # AND another process whose run finds them delivered elsewhere, so nothing to do
    second = await make_app(router_apply_calls_per_run=15)
    assert (await second.router().nudge(0)).subscriptions[PROJECTOR.value].fetched == 0

    # WHEN the first process releases what it kept (and the server has processed its naks:
    # it takes them off a queue of its own, so a pull sent at once could be answered first)
    assert await first.router().release_held(0) == 6
    assert len(set(await naks.processed(PROJECTOR.value, 6))) == 6

    # THEN they are nacked without delay: the other process applies them at once
    report = await second.router().nudge(0)
    assert report.subscriptions[PROJECTOR.value].applied == 6
    assert [view_count(second, p) for p in projects] == [2] * 5


async def test_a_router_closes_when_its_kept_records_cannot_be_nacked_and_closes_once(
    make_app: AppFactory,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a run that left six records waiting, and a connection whose flush times out
    app = await make_app(router_apply_calls_per_run=2)
    await two_events_each(app, clock, 5)
    router = app.router()
    assert (await router.nudge(0)).subscriptions[PROJECTOR.value].deferred == 6

    async def flush_times_out(*args: object, **kwargs: object) -> None:
        raise nats.errors.TimeoutError

    monkeypatch.setattr(await app.nats(), "flush", flush_times_out)

    # WHEN the router closes, and closes again
    with caplog.at_level("WARNING", logger="rhumbatron.router.event_router"):
        await router.close()
        await router.close()

    # THEN it said once why the records were not nacked (JetStream redelivers them after the
    #   ack wait) and closed anyway; the second close had nothing left to close
    assert [r.getMessage() for r in caplog.records] == [
        "cannot nack the records kept for a next run: nats: timeout"
    ]


async def test_an_in_process_nudge_runs_again_while_its_runs_leave_records_waiting(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN five projects with two events each and a cap of 2 calls per run
    nudge = InProcessNudge()
    app = await make_app(nudge=nudge, router_apply_calls_per_run=2)
    app.router()  # binds the nudge
    projects = await two_events_each(app, clock, 5)

    # WHEN one nudge arrives
    await nudge.nudge(0)
    await nudge.settle()

    # THEN its runs went on until nothing was left waiting: three runs of two calls at most
    assert nudge.runs == 3
    assert [view_count(app, p) for p in projects] == [2] * 5
    lag = await (await app.router().event_log()).lag(0, PROJECTOR)
    assert (lag.num_pending, lag.num_ack_pending) == (0, 0)


async def test_a_failing_record_is_counted_and_redelivered_only_after_the_nack_delay(
    make_app: AppFactory, acks: AckTap
) -> None:
    # GIVEN a record that does not decode, between two good events
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    good = lifecycle(project, START)
    await publish(app, good[:1])
    await publish_raw(app, 0, b"{not json", msg_id="poison-1")
    await publish(app, good[1:2])

    # WHEN the stream is nudged
    report = await app.router().nudge(0)

    # THEN the good events were applied around it, its failure counted once per subscription
    assert report.subscriptions[PROJECTOR.value].applied == 2
    assert report.subscriptions[PROJECTOR.value].failed == 1
    state = app.router().stream_state(0)
    assert state.failures(PROJECTOR.value, "poison-1") == 1
    assert state.failures(CAUSAL.value, "poison-1") == 1
    # AND the nack holds it for 30 s: an immediate second run does not see it again
    again = await app.router().nudge(0)
    assert again.subscriptions[PROJECTOR.value].fetched == 0
    assert (await (await app.router().event_log()).lag(0, PROJECTOR)).num_ack_pending == 1
    naks = [a for a in await acks.seen(app, consumer=PROJECTOR.value) if a.kind == "-NAK"]
    assert [(a.stream_seq, a.delay_s) for a in naks] == [(2, 30.0)]


async def test_every_failing_record_of_a_fetch_counts_in_the_runs_report(
    make_app: AppFactory,
) -> None:
    # GIVEN three records that do not decode, on stream 0
    app = await make_app()
    for number in range(3):
        await publish_raw(app, 0, b"{not json", msg_id=f"poison-{number}")
    # WHEN the stream is nudged
    report = await app.router().nudge(0)
    # THEN each subscription's report counts the three failures, as the stream state does
    state = app.router().stream_state(0)
    for subscription in (PROJECTOR, CAUSAL):
        assert report.subscriptions[subscription.value].failed == 3, subscription
        assert [state.failures(subscription.value, f"poison-{n}") for n in range(3)] == [1] * 3


async def test_every_record_of_a_fetch_dead_lettered_counts_in_the_runs_report(
    make_app: AppFactory,
) -> None:
    # GIVEN three records that do not decode, on stream 0, where the first failure is the
    #   last one allowed
    app = await make_app(router_max_failures=1)
    for number in range(3):
        await publish_raw(app, 0, b"{not json", msg_id=f"poison-{number}")
    # WHEN the stream is nudged
    report = await app.router().nudge(0)
    # THEN each subscription's report counts the three dead letters its run wrote
    for subscription in (PROJECTOR, CAUSAL):
        assert report.subscriptions[subscription.value].dead_lettered == 3, subscription
    letters = app.product().connection.execute("SELECT COUNT(*) FROM dead_letters").fetchone()
    assert letters[0] == 6


async def test_the_fifth_failure_makes_a_poison_dead_letter_and_acks_it(
    make_app: AppFactory,
) -> None:
    # GIVEN a record with an unknown type, redelivered at once after each nack
    app = await make_app(router_nak_delay_s=0)
    body = b'{"eventId": "evt_00000000000000000000000000000001", "eventType": "task.exploded"}'
    await publish_raw(app, 0, body, msg_id="evt_00000000000000000000000000000001")

    # WHEN nudges run until it has failed five times
    reports: list[RunReport] = []

    async def nudge() -> RunReport:
        reports.append(await app.router().nudge(0))
        return reports[-1]

    def counted(subscription: Subscription, what: str) -> int:
        return sum(getattr(r.subscriptions[subscription.value], what) for r in reports)

    # (each subscription gets its own redeliveries: under load one may lag the other a run)
    await until(nudge, lambda _: min(counted(s, "dead_lettered") for s in (PROJECTOR, CAUSAL)) > 0)

    # THEN the 5th failure (counted per subscription, not before) wrote one dead letter per
    # subscription, and the record is acked
    for subscription in (PROJECTOR, CAUSAL):
        assert counted(subscription, "failed") == 5, subscription
        assert counted(subscription, "dead_lettered") == 1, subscription
    rows = (
        app.product()
        .connection.execute(
            "SELECT consumer, kind, status, stream, event_id FROM dead_letters ORDER BY consumer"
        )
        .fetchall()
    )
    assert [tuple(r) for r in rows] == [
        (CAUSAL.value, "poison_event", "open", "EVENTS_00", "evt_00000000000000000000000000000001"),
        (
            PROJECTOR.value,
            "poison_event",
            "open",
            "EVENTS_00",
            "evt_00000000000000000000000000000001",
        ),
    ]
    lag = await settled_lag(app)
    assert (lag.num_pending, lag.num_ack_pending) == (0, 0)


async def test_an_event_dead_lettered_on_its_fifth_failure_is_marked_processed(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a decodable event whose project view refuses it, redelivered at once after a nack
    app = await make_app(router_nak_delay_s=0)
    (project,) = projects_on_stream(0, 1)
    view = app.router().projector.view(project)
    view.connection.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON view_tasks WHEN NEW.task_id = 't-bad' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    bad = FactContext(CALLER, project, clock.now()).fact(
        "task.ready", {}, change_id=f"{project}-c", task_id="t-bad"
    )
    await publish(app, [bad])
    # AND nudges ran until its 5th failure made the projector's dead letter, which names
    # the event's tenant, project, Change and task, where it is and why it failed
    await until(
        lambda: app.router().nudge(0),
        lambda r: r.subscriptions[PROJECTOR.value].dead_lettered > 0,
    )
    letter = (
        app.product()
        .connection.execute(
            "SELECT tenant_id, project_id, change_id, task_id, event_id, stream, stream_seq, "
            "reason, body FROM dead_letters WHERE consumer = ?",
            (PROJECTOR.value,),
        )
        .fetchone()
    )
    assert tuple(letter)[:7] == (
        CALLER.tenant_id,
        project,
        f"{project}-c",
        "t-bad",
        bad.event_id,
        "EVENTS_00",
        1,
    )
    assert letter["reason"] == "applying task.ready to the view failed: refused"
    said = [r.getMessage() for r in caplog.records if " failed evt_" in r.getMessage()]
    assert said == [
        f"project-view-projector failed {bad.event_id} ({n}/5): {letter['reason']}"
        for n in range(1, 6)
    ]
    assert json.loads(letter["body"])["eventId"] == bad.event_id

    # WHEN the view would now take it, and the same event arrives again
    view.connection.execute("DROP TRIGGER refuse")
    await publish_raw(app, 0, bad.to_json(), msg_id=f"{bad.event_id}-again")
    report = await until(
        lambda: app.router().nudge(0), lambda r: r.subscriptions[PROJECTOR.value].fetched > 0
    )

    # THEN the projector takes it as processed: a duplicate, acked, never applied
    projector = report.subscriptions[PROJECTOR.value]
    assert (projector.duplicates, projector.applied, projector.failed) == (1, 0, 0)
    assert view_count(app, project) == 0
    assert (await settled_lag(app)).num_ack_pending == 0


def test_the_sweep_visits_the_minute_of_day_mod_8_and_skips_analytics_on_housekeeping_ticks() -> (
    None
):
    settings = load_settings()
    day = datetime(2026, 3, 2, tzinfo=UTC)
    assert tick_kind(settings, day.replace(hour=0, minute=0)) == (0, False, False)
    assert tick_kind(settings, day.replace(hour=0, minute=9)) == (1, False, True)
    assert tick_kind(settings, day.replace(hour=4, minute=17)) == (257 % 8, True, False)
    assert tick_kind(settings, day.replace(hour=13, minute=14)) == ((13 * 60 + 14) % 8, False, True)
    assert tick_kind(settings, day.replace(hour=13, minute=15)) == (
        (13 * 60 + 15) % 8,
        False,
        False,
    )
    visited = {tick_kind(settings, day + timedelta(minutes=m))[0] for m in range(8)}
    assert visited == set(range(8))


async def test_a_housekeeping_tick_runs_no_analytics_batch(make_app: AppFactory) -> None:
    app = await make_app()
    maintenance = await app.router().sweep(now=datetime(2026, 3, 2, 4, 17, tzinfo=UTC))
    release = await app.router().sweep(now=datetime(2026, 3, 2, 4, 19, tzinfo=UTC))
    ordinary = await app.router().sweep(now=datetime(2026, 3, 2, 4, 20, tzinfo=UTC))
    assert Subscription.ANALYTICS_PROJECTOR.value not in maintenance.run.subscriptions
    assert Subscription.ANALYTICS_PROJECTOR.value not in release.run.subscriptions
    assert list(ordinary.run.subscriptions) == [
        PROJECTOR.value,
        CAUSAL.value,
        Subscription.AUDIT_ARCHIVER.value,
        Subscription.ANALYTICS_PROJECTOR.value,
        Subscription.REACTIONS.value,
    ]


async def test_a_sweep_tick_runs_one_archiver_and_one_analytics_batch_of_at_most_100(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN 250 mapped events waiting on one stream
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    await publish(app, wakes(project, clock.now(), 250))

    # WHEN one ordinary sweep tick visits that stream
    sweep = await app.router().sweep(now=sweep_minute(0))

    # THEN the archiver and the analytics projector each ran one batch of 100
    for name in (Subscription.AUDIT_ARCHIVER, Subscription.ANALYTICS_PROJECTOR):
        sub = sweep.run.subscriptions[name.value]
        assert (sub.consumes, sub.fetched, sub.applied) == (1, 100, 100)
    # AND that batch became one archive object and 100 EVENT_METRICS points
    assert [count for _, count in sweep.archive_objects] == [100]
    counts = metric_counts(app.product().connection, MetricBinding.EVENT_METRICS)
    assert counts["agent_wakeup"] == 100
    # AND the other 150 wait on the stream for the next ticks
    lag = (await app.router().event_log()).lag
    assert (await lag(0, Subscription.AUDIT_ARCHIVER)).num_pending == 150
    assert (await lag(0, Subscription.ANALYTICS_PROJECTOR)).num_pending == 150

    # WHEN the same warm router sweeps that stream again
    again = await app.router().sweep(now=sweep_minute(0))

    # THEN its report names only the object it wrote itself, not the first tick's too
    assert [count for _, count in again.archive_objects] == [100]
    assert again.archive_objects != sweep.archive_objects


async def test_an_archive_batch_above_the_fetch_cap_moves_all_its_records_in_one_tick(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN archive batches of 200 records (two fetches at the cap of 100) and 250 events
    #   waiting on one stream
    app = await make_app(archive_batch_size=200)
    (project,) = projects_on_stream(0, 1)
    await publish(app, wakes(project, clock.now(), 250))
    # WHEN one ordinary sweep tick visits that stream
    sweep = await app.router().sweep(now=sweep_minute(0))
    # THEN the archiver moved the whole batch of 200, in two objects of 100, not the first
    #   fetch alone; 50 wait for the next tick
    sub = sweep.run.subscriptions[Subscription.AUDIT_ARCHIVER.value]
    assert (sub.consumes, sub.fetched, sub.applied) == (2, 200, 200)
    assert [count for _, count in sweep.archive_objects] == [100, 100]
    lag = (await app.router().event_log()).lag
    assert (await lag(0, Subscription.AUDIT_ARCHIVER)).num_pending == 50


async def test_with_nudges_off_eight_sweeps_apply_archive_and_count_every_event(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN projects on three streams, and no nudge at all
    app = await make_app()
    projects = [projects_on_stream(s, 1)[0] for s in (0, 3, 6)]
    events = [e for p in projects for e in lifecycle(p, clock.now())]
    await publish(app, events)

    # WHEN eight sweep ticks run (every stream once)
    base = sweep_minute(0)
    sweeps = [await app.router().sweep(now=base + timedelta(minutes=m)) for m in range(8)]

    # THEN every event is in its project's view
    assert [view_count(app, p) for p in projects] == [6, 6, 6]
    # AND each visited stream's batch became one archive object holding its events
    objects = [o for s in sweeps for o in s.archive_objects]
    assert sorted(count for _, count in objects) == [6, 6, 6]
    reader = ArchiveReader(app.s3(), app.settings.evidence_bucket)
    assert sorted(e.event_id for e in reader.iter_events()) == sorted(e.event_id for e in events)
    # AND one EVENT_METRICS data point per mapped lifecycle event
    counts = metric_counts(app.product().connection, MetricBinding.EVENT_METRICS)
    assert counts["change_created"] == 3
    assert counts["task_completed"] == 3
    # AND the last tick saw every consumer of the visited streams at lag 0
    for sweep in sweeps:
        mine = [
            lag for lag in sweep.lags if lag.stream == event_stream_name(sweep.run.stream_index)
        ]
        assert all(lag.num_pending == 0 and lag.num_ack_pending == 0 for lag in mine)


async def test_the_publisher_nudges_the_router_so_views_update_without_a_sweep(
    make_app: AppFactory,
) -> None:
    # GIVEN a runtime whose publisher nudges the router in process
    nudge = InProcessNudge()
    app = await make_app(nudge=nudge)
    app.router()  # binds the nudge
    (project,) = projects_on_stream(2, 1)

    # WHEN an actor writes and its alarm publishes
    app.project_root(project).create_project(CALLER, name="Nudged")
    await app.drain_alarms()
    await nudge.settle()

    # THEN the view has the fact, no sweep needed
    assert nudge.runs >= 1
    assert app.router().projector.view(project).snapshot()["name"] == "Nudged"


async def test_s3_down_during_archiving_loses_nothing(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN events on stream 4 and an archive whose S3 is down
    own_s3 = S3ServerProcess()
    own_s3.start()
    try:
        app = await make_app(
            s3_endpoint_url=own_s3.endpoint_url, router_nak_delay_s=0, s3_timeout_s=1
        )
        app.s3().create_bucket(Bucket=app.settings.evidence_bucket)
        (project,) = projects_on_stream(4, 1)
        events = lifecycle(project, clock.now())
        await publish(app, events)
        own_s3.stop()

        # WHEN the sweep tries to archive
        caplog.set_level(logging.WARNING, logger="rhumbatron.router")
        down = await app.router().sweep(now=sweep_minute(4))

        # THEN the batch is retried, not failed and not counted, each event's warning saying
        #   why: the object S3 would not take
        archiver = down.run.subscriptions[Subscription.AUDIT_ARCHIVER.value]
        assert (archiver.retried, archiver.failed, archiver.applied) == (6, 0, 0)
        retries = [
            r.getMessage()
            for r in caplog.records
            if r.getMessage().startswith(f"{Subscription.AUDIT_ARCHIVER.value} retries ")
        ]
        assert len(retries) == 6
        assert all(
            re.search(r": could not write archive object s3://\S+ \(a batch of 6 ", line)
            for line in retries
        ), retries
        assert (
            app.router()
            .stream_state(4)
            .connection.execute("SELECT COUNT(*) FROM k2_batch_failures")
            .fetchone()[0]
            == 0
        )

        # WHEN S3 is back and the stream's next sweep comes
        own_s3.start()
        up = await app.router().sweep(now=sweep_minute(4) + timedelta(minutes=8))

        # THEN every event is archived
        assert up.run.subscriptions[Subscription.AUDIT_ARCHIVER.value].applied == 6
        reader = ArchiveReader(app.s3(), app.settings.evidence_bucket)
        assert sorted(e.event_id for e in reader.iter_events()) == sorted(
            e.event_id for e in events
        )
    finally:
        own_s3.stop()


async def applied_15_days_ago(
    app: Rhumbatron, clock: ManualClock, *, cause_chain: bool = False
) -> str:
    """A project of stream 1 whose lifecycle the router applied and routed 15 days before
    the clock's now (the clock is moved on), with a reaction's cause chain kept then when
    ``cause_chain``; its ID."""
    (project,) = projects_on_stream(1, 1)
    await publish(app, lifecycle(project, clock.now()))
    await app.router().nudge(1)
    if cause_chain:
        keep_cause_chain(app, "evt-old", clock.now())
    clock.advance(days=15)
    return project


async def test_the_daily_tick_prunes_claims_older_than_14_days_up_to_the_cap(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN 6 events applied by the projector, 2 of them routed by the causal router (its
    #   claims), 15 days ago, and a daily prune cap of one row per table
    app = await make_app(processed_events_prune_cap=1)
    project = await applied_15_days_ago(app, clock)

    # WHEN the 04:17 UTC tick runs
    tick = clock.now().replace(hour=4, minute=17) + timedelta(days=1)
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)

    # THEN at most the cap of old claim rows went: of the causal router's claims, and of the
    # projector's (its feed rows)
    assert sweep.maintenance
    assert (sweep.pruned_claims, sweep.pruned_feed_rows) == (1, 1)
    assert sweep.pruned_metric_rows == 0  # the lag points are 15 days old; 30 are kept
    old = "SELECT COUNT(*) FROM processed_events WHERE processed_at_s < ?"
    cutoff = (tick - timedelta(days=14)).timestamp()
    left = app.router().stream_state(1).connection.execute(old, (cutoff,)).fetchone()[0]
    assert left == ROUTED_IN_LIFECYCLE - 1
    assert view_count(app, project) == 6 - 1


async def test_the_daily_prune_cap_holds_across_every_file_that_holds_claims(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN, applied and routed 15 days ago, two events of a project on stream 1 (2 feed
    #   rows, no claim) and the lifecycles of projects on streams 2 and 3 (6 feed rows and 2
    #   causal claims each), each in its stream's own files, and a daily cap of 3 rows
    app = await make_app(processed_events_prune_cap=3)
    streams = (1, 2, 3)
    projects = [projects_on_stream(stream, 1)[0] for stream in streams]
    for project, stream in zip(projects, streams, strict=True):
        events = lifecycle(project, clock.now())
        await publish(app, events[:2] if stream == 1 else events)
        await app.router().nudge(stream)
    clock.advance(days=15)

    # WHEN the 04:17 UTC tick runs
    tick = clock.now().replace(hour=4, minute=17) + timedelta(days=1)
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)

    # THEN 3 claims and 3 feed rows went in all: what one file took, the next could not
    assert sweep.maintenance
    assert (sweep.pruned_claims, sweep.pruned_feed_rows) == (3, 3)
    assert sum(len(causal_claims(app, stream)) for stream in streams) == 2 * 2 - 3
    assert sum(view_count(app, project) for project in projects) == 2 + 2 * 6 - 3


@pytest.mark.parametrize(
    ("sizing", "pruned"),
    [
        # the default sizing: the daily tick alone prunes, as the spec has it
        ({}, (0, 0)),
        # sized above what the daily cap keeps up with: 10 events a day leave up to 50 claim
        # rows, over a cap of 4, so every tick prunes ceil(2 × 50 / 1,440) = 1 row a table
        ({"expected_events_per_day": 10, "processed_events_prune_cap": 4}, (1, 1)),
    ],
)
async def test_an_ordinary_tick_prunes_old_claims_when_sized_above_the_daily_cap(
    make_app: AppFactory, clock: ManualClock, sizing: dict[str, int], pruned: tuple[int, int]
) -> None:
    # GIVEN a project's events applied, and a reaction's cause chain kept, 15 days ago
    app = await make_app(**sizing)
    project = await applied_15_days_ago(app, clock, cause_chain=True)
    # WHEN an ordinary tick runs (not the 04:17 one)
    tick = clock.now().replace(hour=10, minute=3)
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)
    # THEN it pruned the sized chunk of claims, feed rows and the reactions' history, or
    #   nothing at the default
    assert not sweep.maintenance
    assert (sweep.pruned_claims, sweep.pruned_feed_rows) == pruned
    assert sweep.pruned_reaction_rows == pruned[0]
    assert view_count(app, project) == 6 - pruned[1]


def keep_cause_chain(app: Rhumbatron, cause_key: str, at: datetime) -> None:
    """A reaction's cause chain recorded at ``at`` (the reactions' history the prune keeps
    14 days)."""
    with app.product().transaction() as db:
        db.execute(
            "INSERT INTO reaction_causes VALUES (?, 'acme', 0, '[]', ?)",
            (cause_key, at.timestamp()),
        )


def cause_chains(app: Rhumbatron) -> int:
    return int(
        app.product().connection.execute("SELECT COUNT(*) FROM reaction_causes").fetchone()[0]
    )


#: Sized so that every ordinary tick prunes 10 rows a table: 1,440 events a day leave up to
#: 7,200 claim rows, over the daily cap of 5,000, so ceil(2 × 7,200 / 1,440) = 10.
PRUNED_EVERY_TICK = {"expected_events_per_day": 1_440}


async def test_an_ordinary_tick_whose_time_is_up_prunes_nothing(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a deployment whose ordinary ticks prune, claims and a cause chain 15 days old
    app = await make_app(**PRUNED_EVERY_TICK)
    project = await applied_15_days_ago(app, clock, cause_chain=True)
    # WHEN an ordinary tick runs with no time left
    tick = clock.now().replace(hour=10, minute=3)
    sweep = await app.router().sweep(now=tick, should_stop=lambda: True)
    # THEN it pruned nothing: the next tick does
    assert (sweep.pruned_claims, sweep.pruned_feed_rows, sweep.pruned_reaction_rows) == (0, 0, 0)
    assert (view_count(app, project), cause_chains(app)) == (6, 1)


async def test_an_ordinary_ticks_prune_stops_when_its_time_runs_out(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a deployment whose ordinary ticks prune, and a project's events routed and
    #   applied 15 days ago
    app = await make_app(**PRUNED_EVERY_TICK)
    project = await applied_15_days_ago(app, clock)
    claims = app.router().stream_state(1).connection
    count = "SELECT COUNT(*) FROM processed_events"
    # WHEN an ordinary tick's time runs out as soon as the claims are pruned
    tick = clock.now().replace(hour=10, minute=3)
    sweep = await app.router().sweep(
        now=tick, should_stop=lambda: claims.execute(count).fetchone()[0] == 0
    )
    # THEN the claims went and the feed rows wait for the next tick
    assert (sweep.pruned_claims, sweep.pruned_feed_rows) == (ROUTED_IN_LIFECYCLE, 0)
    assert view_count(app, project) == 6


async def test_an_ordinary_tick_prunes_for_the_rate_the_streams_were_observed_to_carry(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN the default sizing (the daily tick alone prunes) and a project's events applied
    #   15 days ago
    app = await make_app()
    await applied_15_days_ago(app, clock)
    # WHEN an ordinary tick's housekeeping runs for streams measured at 1,440 events a day
    #   (past what the daily cap keeps up with: 10 rows a table each tick)
    tick = clock.now().replace(hour=10, minute=3)
    sweep = SweepReport(
        run=RunReport(1, "sweep"),
        minute_of_day=tick.hour * 60 + tick.minute,
        maintenance=False,
        release_sweep=False,
        analytics=True,
    )
    await run_maintenance(app.router(), sweep, tick, observed_per_day=1_440.0, should_stop=None)
    # THEN it pruned the old claims and feed rows as if sized for that rate
    assert (sweep.pruned_claims, sweep.pruned_feed_rows) == (ROUTED_IN_LIFECYCLE, 6)


async def test_a_sweep_measures_the_streams_rate_and_its_prune_keeps_up_with_it(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN the default sizing (the daily tick alone prunes), a project's events applied 15
    #   days ago, and a rate that counts once a stream spans 0.1 ms of the server's clock
    #   (a test override of the minute: the six publishes, each acknowledged before the
    #   next, span more, so stream 1 carries millions of events a day)
    app = await make_app(router_rate_min_span_s=0.0001)
    await applied_15_days_ago(app, clock)
    # WHEN an ordinary tick's sweep runs
    tick = clock.now().replace(hour=10, minute=3)
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)
    # THEN its capacity check measured the streams and its prune kept up with that rate
    assert not sweep.maintenance
    assert (sweep.pruned_claims, sweep.pruned_feed_rows) == (ROUTED_IN_LIFECYCLE, 6)


async def test_a_prune_whose_time_runs_out_after_the_claims_returns_them_and_leaves_the_rest(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a project's events routed and applied 15 days ago
    app = await make_app()
    project = await applied_15_days_ago(app, clock)
    claims = app.router().stream_state(1).connection
    count = "SELECT COUNT(*) FROM processed_events"
    # WHEN a prune's time runs out as soon as the causal router's claims are gone
    pruned = prune_processed_events(
        app.router(),
        now_s=clock.now().timestamp(),
        cap=100,
        should_stop=lambda: claims.execute(count).fetchone()[0] == 0,
    )
    # THEN it returns the claims it deleted and no feed row: the feed waits for the next tick
    assert pruned == (ROUTED_IN_LIFECYCLE, 0)
    assert view_count(app, project) == 6


async def test_a_claim_is_kept_until_it_is_14_days_old_and_pruned_after(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN events applied by the projector and the causal router at 04:18 UTC, a minute
    # after a daily tick
    app = await make_app()
    (project,) = projects_on_stream(1, 1)
    applied_at = clock.now().replace(hour=4, minute=18, second=0, microsecond=0) + timedelta(days=1)
    clock.set(applied_at)
    await publish(app, lifecycle(project, clock.now()))
    await app.router().nudge(1)
    count = "SELECT COUNT(*) FROM processed_events"
    stream_claims = app.router().stream_state(1).connection
    claims = stream_claims.execute(count).fetchone()[0]  # the causal router's
    assert (claims, view_count(app, project)) == (ROUTED_IN_LIFECYCLE, 6)  # feed: the projector's

    # WHEN the daily tick runs 14 days later, when the claims are a minute short of 14 days
    tick = applied_at + timedelta(days=14, minutes=-1)
    clock.set(tick)
    kept = await app.router().sweep(now=tick)

    # THEN none is pruned: a claim is kept 14 days
    assert kept.maintenance
    assert kept.pruned_claims == 0

    # WHEN the next day's tick runs, the claims a day older
    tick += timedelta(days=1)
    clock.set(tick)
    pruned = await app.router().sweep(now=tick)

    # THEN every one of them is pruned
    assert pruned.maintenance
    assert (pruned.pruned_claims, pruned.pruned_feed_rows) == (claims, 6)


async def test_the_daily_tick_prunes_claims_just_older_than_14_days_and_keeps_younger_ones(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN one project's events claimed 14 days and an hour before the 04:17 UTC tick,
    #   and another project's claimed 14 days less an hour before it
    app = await make_app()
    tick = datetime(2026, 3, 17, 4, 17, tzinfo=UTC)
    older, younger = projects_on_stream(1, 2)
    ages = {older: timedelta(days=14, hours=1), younger: timedelta(days=14, hours=-1)}
    for project, age in ages.items():
        clock.set(tick - age)
        await publish(app, lifecycle(project, clock.now()))
        await app.router().nudge(1)

    # WHEN the 04:17 UTC tick runs
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)

    # THEN the older project's 2 causal claims and 6 feed rows (the projector's claims) went,
    #   and every claim and feed row of the younger project stayed
    assert sweep.maintenance
    assert (sweep.pruned_claims, sweep.pruned_feed_rows) == (ROUTED_IN_LIFECYCLE, 6)
    stream = app.router().stream_state(1).connection
    views = app.router().projector.views(1).connection  # both projects' stream
    assert view_count(app, older) == 0
    assert view_count(app, younger) == 6
    younger_ids = [
        r[0]
        for r in views.execute(
            "SELECT event_id FROM project_events WHERE project_id = ?", (younger,)
        )
    ]
    marks = ",".join("?" * len(younger_ids))
    causal = f"SELECT COUNT(*) FROM processed_events WHERE consumer = ? AND event_id IN ({marks})"
    assert stream.execute(causal, (CAUSAL.value, *younger_ids)).fetchone()[0] == ROUTED_IN_LIFECYCLE


async def test_every_sweep_records_consumer_lag_and_outbox_backlog_as_metrics(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN two actors with an unpublished outbox row each (one project created here, the
    # other when its events were put on stream 0) and a stream with unread events
    app = await make_app()
    (project,) = projects_on_stream(3, 1)
    app.project_root(project).create_project(CALLER, name="Backlog")
    await publish(app, wakes(projects_on_stream(0, 1)[0], clock.now(), 3))

    # WHEN a sweep tick runs on another stream
    sweep = await app.router().sweep(now=sweep_minute(5))

    # THEN it recorded the lag of all 40 consumers (5 × 8 streams) and the outbox backlog
    assert len(sweep.lags) == 40
    unread = {(lag.stream, lag.consumer): lag.num_pending for lag in sweep.lags}
    assert unread[(event_stream_name(0), PROJECTOR.value)] == 3
    assert sweep.outbox_backlog["pending"] == 2
    counts = metric_counts(app.product().connection, MetricBinding.METRICS)
    assert counts["consumer_num_pending"] == 40
    assert counts["consumer_num_ack_pending"] == 40
    assert counts["outbox_pending"] == 1

    # AND each consumer's points name its stream and consumer and carry what the sweep
    #   read: the lag is read per consumer
    def per_consumer(name: str) -> dict[tuple[str, str], float]:
        points = app.product().connection.execute(
            "SELECT dimensions, value FROM platform_metrics WHERE name = ?", (name,)
        )
        return {
            (d["stream"], d["consumer"]): value
            for d, value in ((json.loads(row[0]), row[1]) for row in points)
        }

    pending = per_consumer("consumer_num_pending")
    assert len(pending) == 40
    assert pending[(event_stream_name(0), PROJECTOR.value)] == 3
    assert per_consumer("consumer_num_ack_pending") == {
        (lag.stream, lag.consumer): lag.num_ack_pending for lag in sweep.lags
    }
    # AND the backlog's points carry its counts, state by state
    backlog = dict(
        app.product()
        .connection.execute(
            "SELECT name, value FROM platform_metrics WHERE name LIKE 'outbox_%' ORDER BY name"
        )
        .fetchall()
    )
    assert backlog == {"outbox_failed": 0, "outbox_pending": 2, "outbox_retry_wait": 0}


async def test_the_daily_tick_drops_lag_points_older_than_30_days_and_keeps_event_metrics(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a sweep's lag points and an analytics point, 31 days old
    app = await make_app()
    (project,) = projects_on_stream(6, 1)
    await publish(app, lifecycle(project, clock.now())[:2])
    first = sweep_minute(6)
    clock.set(first)
    await app.router().sweep(now=first)
    product = app.product().connection
    before = metric_counts(product, MetricBinding.EVENT_METRICS)
    assert before["change_created"] == 1

    # WHEN the daily tick comes 31 days later
    tick = (first + timedelta(days=31)).replace(hour=4, minute=17)
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)

    # THEN the old lag points went (40 × 2 consumer points, 3 outbox points and the
    # projector's one freshness point); the analytics points stayed
    assert sweep.pruned_metric_rows == 84
    assert metric_counts(product, MetricBinding.EVENT_METRICS) == before
    assert metric_counts(product, MetricBinding.METRICS)["consumer_num_pending"] == 40


async def test_analytics_points_are_kept_90_days_and_pruned_after(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a project's analytics points, written by a sweep
    app = await make_app()
    (project,) = projects_on_stream(6, 1)
    await publish(app, lifecycle(project, clock.now())[:2])
    first = sweep_minute(6)
    clock.set(first)
    await app.router().sweep(now=first)
    product = app.product().connection
    written = metric_counts(product, MetricBinding.EVENT_METRICS)
    assert written["change_created"] == 1
    assert app.settings.event_metrics_retention_days == 90

    # WHEN the daily tick comes 89 days later, THEN they are kept
    tick = (first + timedelta(days=89)).replace(hour=4, minute=17)
    clock.set(tick)
    await app.router().sweep(now=tick)
    assert metric_counts(product, MetricBinding.EVENT_METRICS) == written

    # WHEN it comes 91 days later, THEN every one of them is gone: the table that grows
    # with the events stays bounded
    tick += timedelta(days=2)
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)
    assert metric_counts(product, MetricBinding.EVENT_METRICS) == {}
    assert sweep.pruned_metric_rows >= sum(written.values())


async def test_an_ordinary_tick_prunes_old_metric_points_when_sized_above_the_daily_cap(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a deployment sized above what the daily prune keeps up with (a chunk of 1 row a
    #   table a tick), and lag points 31 days old
    app = await make_app(expected_events_per_day=10, processed_events_prune_cap=4)
    first = sweep_minute(2)
    clock.set(first)
    await app.router().sweep(now=first)
    product = app.product().connection
    old = "SELECT COUNT(*) FROM platform_metrics WHERE recorded_at_s <= ?"
    old_points = product.execute(old, (first.timestamp(),)).fetchone()[0]
    assert old_points > 1
    # WHEN an ordinary tick runs 31 days later
    tick = (first + timedelta(days=31)).replace(hour=10, minute=3)
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)
    # THEN it pruned its chunk of them, not waiting for the daily tick
    assert not sweep.maintenance
    assert sweep.pruned_metric_rows == 1
    assert product.execute(old, (first.timestamp(),)).fetchone()[0] == old_points - 1


def held_view_file(app: Rhumbatron, project_id: str) -> sqlite3.Connection:
    """Another writer's connection holding the write lock of ``project_id``'s view file (its
    stream's), made with its schema first; closing it lets the file go."""
    view = app.router().projector.view(project_id)
    view.connection  # noqa: B018 - create the file and its schema first
    holder = sqlite3.connect(view.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


@contextlib.contextmanager
def held_by_another_writer(path: Path) -> Iterator[None]:
    """While the block runs, another writer holds ``path``'s write lock (the file exists)."""
    holder = sqlite3.connect(path, timeout=0)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.rollback()
        holder.close()


def failures_counted(app: Rhumbatron, stream: int) -> int:
    state = app.router().stream_state(stream).connection
    return int(state.execute("SELECT COUNT(*) FROM k2_batch_failures").fetchone()[0])


async def test_a_view_file_held_by_another_writer_is_retried_not_counted(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a project's view file locked by another writer past the busy timeout
    app = await make_app(sqlite_busy_timeout_ms=50, router_nak_delay_s=0)
    (project,) = projects_on_stream(7, 1)
    await publish(app, lifecycle(project, clock.now())[:3])
    holder = held_view_file(app, project)

    # WHEN the stream is nudged
    report = await app.router().nudge(7)

    # THEN the events are retried, no failure is counted
    projector = report.subscriptions[PROJECTOR.value]
    assert (projector.applied, projector.failed) == (0, 0)
    assert projector.retried >= 3
    assert failures_counted(app, 7) == 0

    # AND once the file is free they are applied
    holder.close()  # its transaction rolls back
    await until(lambda: app.router().nudge(7), lambda _: view_count(app, project) == 3)


async def test_with_its_view_file_held_a_run_retries_its_budget_and_holds_the_rest(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN five projects with two events each on stream 0, a cap of 2 calls per run, and
    # the stream's view file locked by another writer past the busy timeout
    app = await make_app(
        sqlite_busy_timeout_ms=50, router_nak_delay_s=0, router_apply_calls_per_run=2
    )
    projects = await two_events_each(app, clock, 5)
    holder = held_view_file(app, projects[0])

    # WHEN the stream is nudged
    report = await app.router().nudge(0)

    # THEN the two projects the run could take are retried; the other three wait, held for
    # the next run as the cap leaves them (not retried, not counted as failures)
    projector = report.subscriptions[PROJECTOR.value]
    assert (projector.retried, projector.deferred) == (4, 6)
    assert (projector.applied, projector.failed) == (0, 0)
    assert report.left_waiting
    assert failures_counted(app, 0) == 0

    # AND once the file is free every event is applied, once
    holder.close()  # its transaction rolls back
    await until(
        lambda: app.router().nudge(0),
        lambda _: [view_count(app, p) for p in projects] == [2] * 5,
    )


async def test_a_consumer_deleted_under_a_warm_router_is_created_again_without_doubles(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a router that applied a project's events, whose consumer an operator then deletes
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    events = lifecycle(project, clock.now())
    await publish(app, events[:3])
    await app.router().nudge(0)
    js = (await app.nats()).jetstream()
    await js.delete_consumer(event_stream_name(0), PROJECTOR.value)
    await publish(app, events[3:])

    # WHEN the same warm router is nudged
    report = await app.router().nudge(0)

    # THEN the consumer exists again, re-read the stream, and the claims kept the view exact
    projector = report.subscriptions[PROJECTOR.value]
    assert (projector.applied, projector.duplicates) == (3, 3)
    assert view_count(app, project) == 6
    assert (await js.consumer_info(event_stream_name(0), PROJECTOR.value)).num_pending == 0


# -- drain mode (issue #17): sized above what the sweep alone carries --------------------


#: Above half of the sweep-only ceilings (analytics': 1,151 ticks × 100 = 115,100 a day).
SIZED_FOR_DRAIN_MODE = {"expected_events_per_day": 1_000_000}
#: The subscriptions a nudge drains after the projector and the causal router in drain mode.
DRAINED_BY_A_NUDGE = (
    Subscription.AUDIT_ARCHIVER,
    Subscription.ANALYTICS_PROJECTOR,
    Subscription.REACTIONS,
)


def archived_ids(app: Rhumbatron) -> Counter[str]:
    reader = ArchiveReader(app.s3(), app.settings.evidence_bucket)
    return Counter(event.event_id for event in reader.iter_events())


async def test_at_the_default_sizing_a_nudge_leaves_the_archive_to_the_sweep(
    make_app: AppFactory, clock: ManualClock
) -> None:
    app = await make_app()
    (project,) = projects_on_stream(2, 1)
    await publish(app, wakes(project, clock.now(), 5))
    report = await app.router().nudge(2)
    assert set(report.subscriptions) == {
        Subscription.PROJECT_VIEW_PROJECTOR.value,
        Subscription.CAUSAL_ROUTER.value,
    }
    assert archived_ids(app) == Counter()


async def test_in_drain_mode_one_nudge_drains_the_archive_analytics_and_reactions(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a deployment sized for 10^6 a day, and 350 events on one stream (more than the
    #   sweep's one batch of 100 a tick)
    app = await make_app(**SIZED_FOR_DRAIN_MODE)
    (project,) = projects_on_stream(2, 1)
    events = wakes(project, clock.now(), 350)
    await publish(app, events)
    # WHEN the stream is nudged once
    report = await app.router().nudge(2)
    # THEN the archiver, analytics and reactions took every event, as the projector did
    for subscription in DRAINED_BY_A_NUDGE:
        assert report.subscriptions[subscription.value].applied == 350, subscription
    # AND the archive holds each event exactly once, across its objects
    assert archived_ids(app) == Counter(e.event_id for e in events)

    # WHEN more events come and the stream's sweep tick runs in the same warm process
    await publish(app, more_wakes(project, clock))
    sweep = await app.router().sweep(now=sweep_minute(2))
    # THEN the sweep reports the object it wrote, not the ones the nudge wrote before it
    assert [count for _, count in sweep.archive_objects] == [5]


async def test_a_rate_the_streams_were_seen_to_carry_past_the_drain_threshold_turns_drain_mode_on(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a deployment sized at the spec's default (no drain mode by its sizing), whose
    #   streams' rate is read over spans as short as 20 ms, and stream 2 carrying events over
    #   at least that span: millions a day at that pace, far past half the lowest sweep-only
    #   ceiling (57,550 a day)
    app = await make_app(router_rate_min_span_s=0.02)
    (project,) = projects_on_stream(2, 1)
    nc = await app.nats()
    for event in wakes(project, clock.now(), 1_000):
        await publish(app, [event])
        if await observed_events_per_day(nc, min_span_s=0.02) > 0:
            break
    else:
        raise AssertionError("1,000 events did not span 20 ms")
    rate = await observed_events_per_day(nc, min_span_s=0.02)
    assert rate > DRAIN_AT_SHARE * ceilings(app.settings).analytics_events_per_day
    # (before any sweep measured it, a nudge does not drain)
    before = await app.router().nudge(2)
    assert Subscription.AUDIT_ARCHIVER.value not in before.subscriptions
    # WHEN a sweep measures the rate, then more events come and the stream is nudged
    await app.router().sweep(now=sweep_minute(2))
    await publish(app, more_wakes(project, clock))
    report = await app.router().nudge(2)
    # THEN the nudge drains the archive, analytics and reactions: the rate seen counts
    for subscription in DRAINED_BY_A_NUDGE:
        assert report.subscriptions[subscription.value].applied == 5, subscription


async def test_in_drain_mode_a_nudge_told_to_stop_drains_nothing(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN drain mode, and events waiting on one stream
    app = await make_app(**SIZED_FOR_DRAIN_MODE)
    (project,) = projects_on_stream(2, 1)
    await publish(app, wakes(project, clock.now(), 10))
    # WHEN the stream is nudged with its time already up
    report = await app.router().nudge(2, should_stop=lambda: True)
    # THEN no subscription fetched anything: the drain stopped too, not only the two runs
    assert report.total("fetched") == 0
    assert archived_ids(app) == Counter()


async def test_a_warm_nudge_while_nats_is_down_fails_as_unavailable(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN a warm router that nudged a stream
    app = await make_app()
    await app.router().nudge(0)
    nc = await app.nats()
    # WHEN NATS goes away, and once the client knows it, the stream is nudged again
    nats_server.stop()
    for _ in range(1_000):
        if nc.is_reconnecting:
            break
        await asyncio.sleep(0.01)  # polls the client's state; its reader task notices
    assert nc.is_reconnecting
    # THEN the nudge fails as NATS being unavailable (what the caller retries on), not with
    #   an error of flushing a connection that is down
    with pytest.raises(NatsUnavailableError):
        await app.router().nudge(0)
    await app.close()


async def test_a_cold_nudge_with_nats_unreachable_fails_as_unavailable(
    settings: Settings,
) -> None:
    # GIVEN a runtime whose NATS cannot be reached (no consume has opened the event log)
    app = bootstrap(load_settings(state_dir=settings.state_dir, nats_url="nats://127.0.0.1:1"))
    # WHEN its first nudge runs  THEN it fails as NATS being unavailable (what the caller
    #   retries on), not on the event log it never opened
    with pytest.raises(NatsUnavailableError):
        await app.router().nudge(0)
    await app.close()


def more_wakes(project_id: str, clock: ManualClock) -> list[Event]:
    """Five more wake events of ``project_id``, under keys :func:`wakes` does not use."""
    ctx = FactContext(CALLER, project_id, clock.now())
    return [
        ctx.fact(
            "agent.woke", {"agentId": f"agent-{i}"}, change_id=f"{project_id}-c", key=f"more-{i}"
        )
        for i in range(5)
    ]


async def test_in_drain_mode_a_tick_drains_every_stream_and_archives_each_event_once(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN drain mode, 150 events on each of two streams, and a nudge of one of them
    #   that drained part of its backlog before the rest arrived
    app = await make_app(**SIZED_FOR_DRAIN_MODE)
    (first,) = projects_on_stream(3, 1)
    (second,) = projects_on_stream(5, 1)
    early = wakes(first, clock.now(), 150)
    await publish(app, early)
    await app.router().nudge(3)
    late = wakes(second, clock.now(), 150)
    await publish(app, late)
    (third,) = projects_on_stream(0, 1)
    own = wakes(third, clock.now(), 150)
    await publish(app, own)
    # WHEN a sweep tick that visits the third stream runs
    tick = sweep_minute(0)
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)
    # THEN it drained its own stream's archiver, analytics and reactions, past the one
    #   batch of 100 an ordinary tick takes
    for name in (Subscription.AUDIT_ARCHIVER, Subscription.ANALYTICS_PROJECTOR, REACTIONS):
        assert sweep.run.subscriptions[name.value].applied == 150, name
    # AND it drained the other streams' archiver, analytics and reactions too
    assert sorted(sweep.drained_elsewhere) == [f"EVENTS_0{n}" for n in range(1, 8)]
    report = sweep.drained_elsewhere["EVENTS_05"]
    assert (report.stream_index, report.kind) == (5, "sweep")
    drained = report.subscriptions
    assert drained[Subscription.AUDIT_ARCHIVER.value].applied == 150
    assert drained[Subscription.REACTIONS.value].applied == 150
    assert drained[Subscription.ANALYTICS_PROJECTOR.value].applied == 150
    # AND every event is archived exactly once, whichever run archived it
    assert archived_ids(app) == Counter(e.event_id for e in [*early, *late, *own])
    assert sum(count for _, count in sweep.archive_objects) == 300


async def test_in_drain_mode_a_tick_told_to_stop_drains_no_other_stream(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN drain mode and events waiting on another stream than the tick's
    app = await make_app(**SIZED_FOR_DRAIN_MODE)
    (second,) = projects_on_stream(5, 1)
    await publish(app, wakes(second, clock.now(), 10))
    tick = sweep_minute(0)
    clock.set(tick)
    # WHEN the tick runs with its time already spent
    sweep = await app.router().sweep(now=tick, should_stop=lambda: True)
    # THEN it drained no other stream: they wait for the next tick
    assert sweep.drained_elsewhere == {}
    assert archived_ids(app) == Counter()


async def test_in_drain_mode_a_tick_whose_time_runs_out_mid_drain_stops_there(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN drain mode and 350 events waiting on stream 5, not the tick's stream
    app = await make_app(**SIZED_FOR_DRAIN_MODE)
    (second,) = projects_on_stream(5, 1)
    await publish(app, wakes(second, clock.now(), 350))
    tick = sweep_minute(0)
    clock.set(tick)
    archiver = app.router().handler(5, Subscription.AUDIT_ARCHIVER)
    assert isinstance(archiver, AuditArchiver)
    out_of_time = False

    def time_is_up() -> bool:  # from the moment stream 5's archiver has written an object
        nonlocal out_of_time
        out_of_time = out_of_time or bool(archiver.objects_written)
        return out_of_time

    # WHEN the tick's time runs out once stream 5's archiver has written its first object
    sweep = await app.router().sweep(now=tick, should_stop=time_is_up)
    # THEN the archiver stopped after that fetch of 100, nothing else drained on stream 5, and
    # the streams after it were not visited
    drained = sweep.drained_elsewhere["EVENTS_05"].subscriptions
    assert drained[Subscription.AUDIT_ARCHIVER.value].applied == 100
    assert set(drained) == {Subscription.AUDIT_ARCHIVER.value}
    assert sorted(sweep.drained_elsewhere) == [f"EVENTS_0{n}" for n in range(1, 6)]


async def test_a_sweep_takes_one_reactions_batch_on_each_other_stream(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN drain mode off, fetches of 4 records (a test override of the 100), and 6 events
    #   waiting on each of streams 3, 4 and 5
    app = await make_app(router_drain_mode=False, router_fetch_max_records=4)
    for stream in (3, 4, 5):
        (project,) = projects_on_stream(stream, 1)
        await publish(app, wakes(project, clock.now(), 6))
    # WHEN stream 4's sweep runs
    sweep = await app.router().sweep(now=sweep_minute(4))
    # THEN it was an ordinary tick's sweep run on stream 4, whose reactions took one batch
    assert (sweep.run.stream_index, sweep.run.kind) == (4, "sweep")
    assert (sweep.maintenance, sweep.release_sweep, sweep.analytics) == (False, False, True)
    own = sweep.run.subscriptions[Subscription.REACTIONS.value]
    assert (own.consumes, own.fetched) == (1, 4)
    # AND it took one reactions batch on each of the seven other streams, its own stream's
    #   reactions being in its own run: 4 of the 6 on streams 3 and 5, nothing elsewhere
    assert set(sweep.reactions_elsewhere) == {event_stream_name(i) for i in range(8) if i != 4}
    fetched = {name: sub.fetched for name, sub in sweep.reactions_elsewhere.items()}
    assert fetched == {name: 4 if name in ("EVENTS_03", "EVENTS_05") else 0 for name in fetched}


async def test_a_sweep_writes_the_freshness_point_a_nudge_kept_in_memory(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a warm router whose first nudge wrote its freshness point, and whose second
    #   nudge, within the minute between flushes, kept its point in memory
    app = await make_app(router_drain_mode=False)
    (project,) = projects_on_stream(2, 1)
    events = lifecycle(project, clock.now())
    product = app.product().connection

    def freshness_points() -> int:
        return metric_counts(product, MetricBinding.METRICS).get("event_freshness_s", 0)

    await publish(app, events[:3])
    await app.router().nudge(2)
    assert freshness_points() == 1
    await publish(app, events[3:])
    await app.router().nudge(2)
    assert freshness_points() == 1
    # WHEN a sweep tick runs, still within that minute
    await app.router().sweep(now=sweep_minute(5))
    # THEN the kept point is written: a sweep always flushes
    assert freshness_points() == 2


@pytest.mark.parametrize(("flush_s", "written"), [(0.0, 2), (30.0, 1)])
async def test_a_nudge_writes_its_freshness_point_at_the_interval_the_settings_give(
    make_app: AppFactory, clock: ManualClock, flush_s: float, written: int
) -> None:
    # GIVEN a warm router whose freshness points are written every flush_s (0 s, or 30 s)
    app = await make_app(router_drain_mode=False, router_freshness_flush_s=flush_s)
    (project,) = projects_on_stream(2, 1)
    events = lifecycle(project, clock.now())
    # WHEN two nudges apply events, ten seconds apart
    await publish(app, events[:3])
    await app.router().nudge(2)
    clock.advance(10)
    await publish(app, events[3:])
    await app.router().nudge(2)
    # THEN each wrote its point when the interval allowed it: both at 0 s, the first at 30 s
    counts = metric_counts(app.product().connection, MetricBinding.METRICS)
    assert counts.get("event_freshness_s", 0) == written


async def test_an_event_another_run_holds_a_live_lease_on_is_retried_not_acked(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a project's lifecycle on stream 0, and a live lease of the causal router on its
    #   change.planned, as a run that died mid-batch leaves it (300 s, not yet run out)
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    events = lifecycle(project, clock.now())
    planned = events[2]
    assert planned.event_type == "change.planned"
    with app.router().stream_state(0).transaction() as db:
        now_s = clock.now().timestamp()
        claim_events(db, CAUSAL.value, [planned.event_id], now_s=now_s, lease_s=300)
    await publish(app, events)
    # WHEN the causal router reads the stream
    with caplog.at_level(logging.WARNING, logger="rhumbatron.router.settling"):
        report = await app.router().consume(
            app.router().run_context(0), CAUSAL, consumes=1, batch=100
        )
    # THEN that event is given back to retry, its effect may never have happened (an ack
    #   would lose it), and the warning says why; the others are settled
    assert (report.fetched, report.retried, report.duplicates) == (6, 1, 0)
    assert [r.getMessage() for r in caplog.records] == [
        f"{CAUSAL.value} retries {planned.event_id}: claimed by another run whose lease has "
        "not expired"
    ]


async def test_a_sweep_releases_only_its_own_streams_held_records(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN a cap of 2 apply calls per run and five projects with events on stream 0: a
    #   nudge applies two projects and keeps the rest for the stream's next run
    app = await make_app(router_apply_calls_per_run=2, router_drain_mode=False)
    await two_events_each(app, clock, 5)
    assert (await app.router().nudge(0)).left_waiting
    tap = await AckTap.open(nats_server.url, event_stream_name(0))
    try:
        # WHEN the sweep of another stream runs in the same process
        await app.router().sweep(now=sweep_minute(4))
        # THEN stream 0's kept records stay kept for its next run: none is nacked
        naks = [a for a in await tap.seen(app) if a.kind == "-NAK"]
        assert naks == []
        # AND stream 0's own sweep releases them, at once, for any reader
        await app.router().sweep(now=sweep_minute(0))
        seen = await tap.seen(app)
        assert [a for a in seen if a.kind == "-NAK"]
    finally:
        await tap.close()


async def test_in_drain_mode_a_sweep_releases_every_streams_held_records(
    make_app: AppFactory, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN drain mode, a cap of 2 apply calls per run and five projects on stream 0: a nudge
    #   applies two projects and keeps the rest for the stream's next run
    app = await make_app(**SIZED_FOR_DRAIN_MODE, router_apply_calls_per_run=2)
    await two_events_each(app, clock, 5)
    assert (await app.router().nudge(0)).left_waiting
    tap = await AckTap.open(nats_server.url, event_stream_name(0))
    try:
        # WHEN the sweep of another stream runs: in drain mode it runs every stream, so no
        #   run of stream 0 follows it in this process
        await app.router().sweep(now=sweep_minute(4))
        # THEN stream 0's kept records are released at once, for any reader
        assert [a for a in await tap.seen(app) if a.kind == "-NAK"]
    finally:
        await tap.close()


async def test_in_drain_mode_a_housekeeping_tick_drains_no_analytics_on_other_streams(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN drain mode and events waiting on stream 5 and on the tick's own stream
    app = await make_app(**SIZED_FOR_DRAIN_MODE)
    (second,) = projects_on_stream(5, 1)
    await publish(app, wakes(second, clock.now(), 10))
    # WHEN the tick of a release-sweep minute (one of the housekeeping minutes) runs
    tick = next(
        when
        for when in (START.replace(hour=10, minute=m) for m in range(60))
        if tick_kind(app.settings, when)[2]
    )
    own_stream = tick_kind(app.settings, tick)[0]
    assert own_stream != 5
    (first,) = projects_on_stream(own_stream, 1)
    await publish(app, wakes(first, clock.now(), 10))
    clock.set(tick)
    sweep = await app.router().sweep(now=tick)
    # THEN the tick's own stream drained its archive and reactions, not its analytics
    assert not sweep.analytics
    assert Subscription.ANALYTICS_PROJECTOR.value not in sweep.run.subscriptions
    assert sweep.run.subscriptions[Subscription.REACTIONS.value].applied == 10
    # AND so did stream 5: its analytics waits for another tick
    drained = sweep.drained_elsewhere["EVENTS_05"].subscriptions
    assert set(drained) == {Subscription.AUDIT_ARCHIVER.value, Subscription.REACTIONS.value}
    assert drained[Subscription.REACTIONS.value].applied == 10


async def test_a_capacity_check_gives_a_stalled_server_two_seconds(
    make_app: AppFactory, nats_server: NatsServerProcess
) -> None:
    # GIVEN a connected runtime whose server stalls (SIGSTOP)
    app = await make_app()
    nc = await app.nats()
    nats_server.pause()
    try:
        # WHEN the streams' rate is measured
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await observed_events_per_day(nc)
        waited_s = time.monotonic() - started
    finally:
        nats_server.resume()
    # THEN it gave up after its 2 s wait for the first stream's answer (the sweep then goes
    #   on with the settings' warnings alone), neither sooner nor much later
    assert 2.0 <= waited_s < 2.9


async def test_a_warm_router_measures_its_capacity_again_every_hour(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a deployment sized above a sweep-only ceiling (drain mode off: the archive's
    #   144,000 a day is below it)
    app = await make_app(expected_events_per_day=200_000, router_drain_mode=False)
    router = app.router()
    assert app.settings.router_capacity_check_every_s == 3_600
    # WHEN its first sweep runs, THEN it warns of the ceilings below the sized volume
    first = sweep_minute(0)
    clock.set(first)
    measured = await router.sweep(now=first)
    assert any("archive_events_per_day" in w for w in measured.warnings)
    # AND it read the rate the streams carry (none spans a minute yet: nothing of its ceiling)
    assert measured.capacity_used_percent == 0.0
    # WHEN the warm router sweeps again within the hour, THEN it does not measure again
    within = first + timedelta(minutes=59)
    clock.set(within)
    again = await router.sweep(now=within)
    assert (again.warnings, again.capacity_used_percent) == ([], None)
    # WHEN an hour has passed, THEN it measures again, and warns again
    later = first + timedelta(hours=1)
    clock.set(later)
    assert any("archive_events_per_day" in w for w in (await router.sweep(now=later)).warnings)


async def test_a_sweep_that_cannot_read_the_rate_says_why_and_still_warns_from_the_settings(
    make_app: AppFactory,
    clock: ManualClock,
    nats_server: NatsServerProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a deployment sized for 10^8 a day with drain mode off (the archive's ceiling is
    #   below it whatever nudges; the projector's sweep-only ones only while none runs), and
    #   a router that nudged a stream itself
    app = await make_app(expected_events_per_day=100_000_000, router_drain_mode=False)
    router = app.router()
    await router.nudge(0)
    # WHEN NATS goes away before the router's first sweep
    nats_server.stop()
    first = sweep_minute(0)
    clock.set(first)
    with (
        caplog.at_level("WARNING", logger="rhumbatron.router.event_router"),
        pytest.raises(NatsUnavailableError),
    ):
        await router.sweep(now=first)
    # THEN it logged why it has no rate, and the settings' warnings as a nudged router sees
    #   them: the archive's ceiling, not the sweep-only ones
    logged = [r.getMessage() for r in caplog.records if r.name == "rhumbatron.router.event_router"]
    why = [m for m in logged if m.startswith("cannot estimate the event rate: ")]
    assert len(why) == 1 and why[0].startswith("cannot estimate the event rate: nats: ")
    assert any(" archive_events_per_day " in m for m in logged)
    assert not any(" sweep_apply_events_per_day " in m for m in logged)
    # AND the runtime closes though NATS is down: there is nothing to drain
    await app.close()


async def test_the_projectors_sweep_ceilings_warn_only_while_no_nudge_runs(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a deployment sized for 10^8 a day: only the projector's sweep-only ceilings are
    #   below it, and they bind only while nothing nudges the router
    app = await make_app(expected_events_per_day=100_000_000)
    first = sweep_minute(0)
    clock.set(first)
    sweep_only = {"sweep_apply_events_per_day", "sweep_apply_calls_per_day"}

    def warned(warnings: list[str]) -> set[str]:
        return {name for name in sweep_only for w in warnings if f" {name} " in w}

    # WHEN a router sweeps with no nudge run anywhere, THEN it warns of both
    assert warned((await app.router().sweep(now=first)).warnings) == sweep_only
    # WHEN the nudge function (another process) takes a stream's turn, THEN the next
    #   hour's check of a fresh router warns of neither
    assert (
        app.router().stream_state(3).take_nudge_turn("nudger", now_s=first.timestamp(), hold_s=60)
    )
    await app.close()
    later = first + timedelta(minutes=30)
    clock.set(later)
    assert warned((await app.router().sweep(now=later)).warnings) == set()
    # WHEN an hour and more passes with no nudge, THEN they bind again, and it says so
    quiet = later + timedelta(hours=2)
    clock.set(quiet)
    assert warned((await app.router().sweep(now=quiet)).warnings) == sweep_only
    # WHEN this process nudges a stream itself, THEN the next check warns of neither
    await app.router().nudge(0)
    again = quiet + timedelta(hours=1)
    clock.set(again)
    assert warned((await app.router().sweep(now=again)).warnings) == set()


async def test_a_nudge_counts_as_lately_for_exactly_one_capacity_check_interval(
    make_app: AppFactory, clock: ManualClock
) -> None:
    app = await make_app()
    window_s = app.settings.router_capacity_check_every_s
    # GIVEN the nudge function (another process) held stream 3's turn until `ends_s`
    start_s = clock.now().timestamp()
    app.router().stream_state(3).take_nudge_turn("nudger", now_s=start_s, hold_s=60)
    ends_s = start_s + 60
    # THEN it ran lately up to the interval's last instant after its turn ended, and not after
    assert app.router().nudged_lately(ends_s + window_s)
    assert not app.router().nudged_lately(ends_s + window_s + 0.5)
    # GIVEN this process nudged at `nudged_s`, THEN the same holds of its own nudge
    nudged_s = ends_s + window_s + 100
    clock.set(datetime.fromtimestamp(nudged_s, UTC))
    await app.router().nudge(0)
    assert app.router().nudged_lately(nudged_s + window_s)
    assert not app.router().nudged_lately(nudged_s + window_s + 0.5)


async def test_a_sweep_nacks_what_its_projector_left_waiting_when_it_ends(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN five projects with two events each on stream 0 and a cap of 2 calls per run
    app = await make_app(router_apply_calls_per_run=2)
    projects = await two_events_each(app, clock, 5)

    # WHEN the sweep tick of stream 0 runs (no run of this process follows it)
    sweep = await app.router().sweep(now=sweep_minute(0))

    # THEN its projector applied two projects and nacked the rest: none is held, unacked,
    #   by a process no run of the stream may come back to, so another router gets them
    #   at once (held, they would come back only after the 5-minute ack wait)
    projector = sweep.run.subscriptions[PROJECTOR.value]
    assert (projector.applied, projector.deferred) == (4, 6)
    other = await make_app()
    await until(
        lambda: other.router().nudge(0),
        lambda _: [view_count(other, p) for p in projects] == [2] * 5,
    )


async def test_the_daily_tick_drops_audit_rows_past_their_year_and_keeps_the_rest(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN audit rows 366 and 364 days before a daily tick
    app = await make_app()
    tick = (sweep_minute(0) + timedelta(days=1)).replace(hour=4, minute=17)
    clock.set(tick)
    with app.product().transaction() as db:
        for age_days in (366, 364):
            record_audit(
                db,
                at_s=(tick - timedelta(days=age_days)).timestamp(),
                principal="token:0",
                tenant_id="acme",
                operation="dismiss_dead_letter",
                method="POST",
                path="/dead-letters/dl_1/dismiss",
                target={"id": "dl_1"},
                status_code=200,
            )
    # WHEN the 04:17 UTC tick runs
    sweep = await app.router().sweep(now=tick)
    # THEN the row past 365 days went, the other stayed
    assert (sweep.maintenance, sweep.pruned_audit_rows) == (True, 1)
    (kept,) = list_audit(app.product().connection)
    assert round((tick.timestamp() - kept.at_s) / 86_400) == 364


@pytest.mark.parametrize("subscription", list(Subscription))
async def test_a_record_a_subscription_marked_processed_is_a_duplicate_to_it_after(
    make_app: AppFactory, clock: ManualClock, subscription: Subscription
) -> None:
    # GIVEN a decoded record of a routed event (change.planned), which the subscription's
    # handler marks processed, as it does once the record's fifth failure dead-lettered it
    app = await make_app()
    (project,) = projects_on_stream(0, 1)
    event = lifecycle(project, clock.now())[2]
    ensure_project_roots(app, [event])
    record = Record(cast(Any, None), 7, event.event_id, event, None)
    handler = app.router().handler(0, subscription)
    run = RunContext(0, now_s=clock.now().timestamp(), apply_calls_left=15)
    handler.mark_processed([record], run)

    # WHEN the record is delivered to it again
    outcomes = await handler.handle([record], run)

    # THEN the handler skips it: a duplicate, nothing applied, written or routed
    assert outcomes[event.event_id].outcome is Outcome.DUPLICATE


def a_daily_tick(days_from_now: int) -> datetime:
    """The 04:17 UTC tick ``days_from_now`` days from the wall clock's today: S3 stamps an
    object with the wall clock's time, whatever the router's clock says."""
    today = datetime.now(UTC).date() + timedelta(days=days_from_now)
    return datetime(today.year, today.month, today.day, 4, 17, tzinfo=UTC)


async def test_the_daily_tick_expires_archive_objects_older_than_365_days_only(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN a history archived today (a store with no lifecycle rules: the pass is on)
    app = await make_app()
    (project,) = projects_on_stream(2, 1)
    await publish(app, lifecycle(project, clock.now()))
    await app.router().drain()
    assert sum(archived_ids(app).values()) == 6
    # WHEN the daily tick runs 364 days later, THEN nothing has expired
    early = await app.router().sweep(now=a_daily_tick(364))
    assert (early.maintenance, early.archive_objects_expired) == (True, 0)
    assert sum(archived_ids(app).values()) == 6
    # AND 366 days later the object holding them is gone
    late = await app.router().sweep(now=a_daily_tick(366))
    assert late.archive_objects_expired == 1
    assert archived_ids(app) == Counter()


async def test_the_daily_tick_expires_by_the_configured_age_and_at_most_its_objects_a_pass(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN archives kept 30 days, expired one object a pass, and two objects archived today
    app = await make_app(archive_max_age_days=30, archive_expiry_max_objects=1)
    for stream in (2, 3):
        (project,) = projects_on_stream(stream, 1)
        await publish(app, lifecycle(project, clock.now()))
    await app.router().drain()
    assert sum(archived_ids(app).values()) == 12
    # WHEN the daily tick runs 29 days later, THEN nothing has expired
    assert (await app.router().sweep(now=a_daily_tick(29))).archive_objects_expired == 0
    # AND 31 days later one object goes, the other waits for the next pass
    assert (await app.router().sweep(now=a_daily_tick(31))).archive_objects_expired == 1
    assert sum(archived_ids(app).values()) == 6


async def test_the_daily_tick_prunes_the_reactions_history_past_its_days_and_reports_it(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN cause chains of the reactions 15 and 13 days before a daily tick (14 are kept)
    app = await make_app()
    tick = (sweep_minute(0) + timedelta(days=1)).replace(hour=4, minute=17)
    clock.set(tick)
    assert ReactionSettings().reaction_history_days == 14
    with app.product().transaction() as db:
        for age_days in (15, 13):
            db.execute(
                "INSERT INTO reaction_causes VALUES (?, 'acme', 0, '[]', ?)",
                (f"evt-{age_days}", (tick - timedelta(days=age_days)).timestamp()),
            )
    # WHEN the 04:17 UTC tick runs
    sweep = await app.router().sweep(now=tick)
    # THEN the older row went and the report counts it
    assert (sweep.maintenance, sweep.pruned_reaction_rows) == (True, 1)
    kept = app.product().connection.execute("SELECT cause_key FROM reaction_causes").fetchall()
    assert [row[0] for row in kept] == ["evt-13"]


async def test_a_daily_tick_whose_archive_expiry_fails_logs_it_and_does_the_rest(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a router whose archive bucket does not exist
    app = await make_app(evidence_bucket=f"gone-{uuid.uuid4().hex[:12]}")
    # WHEN the daily tick runs
    sweep = await app.router().sweep(now=a_daily_tick(0))
    # THEN the expiry's failure is logged (tomorrow's pass tries again), none counted, and
    # the tick's other housekeeping ran
    assert sweep.maintenance and sweep.archive_objects_expired == 0
    [said] = [r.getMessage() for r in caplog.records if "archive expiry" in r.getMessage()]
    assert said.startswith("archive expiry pass failed: ")
    assert "NoSuchBucket" in said or "does not exist" in said


async def test_a_claims_file_held_under_the_causal_router_retries_its_batch_naming_the_error(
    make_app: AppFactory, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a project's history on stream 0 (two of its six events routed by the rules), and
    #   the stream's state file, where the causal router takes its leases, held by another
    #   writer
    app = await make_app(router_nak_delay_s=0, sqlite_busy_timeout_ms=0)
    (project,) = projects_on_stream(0, 1)
    events = lifecycle(project, clock.now())
    await publish(app, events)
    state = app.router().stream_state(0)
    assert state.connection is not None  # opening makes the file
    # WHEN the stream is nudged
    with caplog.at_level(logging.WARNING), held_by_another_writer(state.path):
        report = await app.router().nudge(0)
    # THEN the causal router retries the whole batch, counting no failure, and says why for
    #   each event: the error's type and words; the projector, on its own file, applied them
    causal = report.subscriptions[CAUSAL.value]
    assert (causal.retried, causal.applied, causal.failed) == (6, 0, 0)
    assert failures_counted(app, 0) == 0
    assert report.subscriptions[PROJECTOR.value].applied == 6
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{CAUSAL} ")]
    assert len(said) == 6
    for line, event in zip(said, events, strict=True):
        why = f"ActorBusyError: SQLite file {state.path} is held by another writer"
        assert line.startswith(f"{CAUSAL} retries {event.event_id}: {why}"), line
    # AND once the file is free the batch is routed, the routed events leased once
    await until(lambda: app.router().nudge(0), lambda r: r.subscriptions[CAUSAL.value].applied > 0)
    assert len(causal_claims(app, 0)) == ROUTED_IN_LIFECYCLE


async def test_a_failure_that_cannot_be_counted_is_logged_and_the_record_nacked_not_acked(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a message that is no event on stream 0, and the stream's state file (where
    # failures are counted) held by another writer
    app = await make_app(router_nak_delay_s=0, sqlite_busy_timeout_ms=0)
    await publish_raw(app, 0, b"{not json", msg_id="junk-1")
    state = app.router().stream_state(0)
    assert state.connection is not None  # opening makes the file
    with held_by_another_writer(state.path):
        # WHEN the projector reads it
        await app.router().nudge(0)
    # THEN the count that could not be written is logged, and the record was nacked, not
    # acked: it comes back, and its failure is counted then
    said = [r.getMessage() for r in caplog.records if "cannot count" in r.getMessage()]
    assert said and said[0].startswith("cannot count the failure of junk-1: SQLite file ")
    assert state.failures(PROJECTOR.value, "junk-1") == 0
    await until(
        lambda: app.router().nudge(0), lambda r: r.subscriptions[PROJECTOR.value].failed > 0
    )
    assert state.failures(PROJECTOR.value, "junk-1") == 1


async def test_a_streams_router_state_and_views_live_where_the_architecture_says(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN the files docs/architecture.md's "Where state lives" names for a stream
    layout = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "<state>/router/stream-<NN>.sqlite" in layout
    assert "<state>/views/EVENTS_<NN>.sqlite" in layout
    # WHEN a project's history on stream 3 is nudged (the causal router leases two events)
    app = await make_app()
    (project,) = projects_on_stream(3, 1)
    await publish(app, lifecycle(project, clock.now()))
    await app.router().nudge(3)
    # THEN its claims are in the stream's router state, and its view in the stream's views
    state = app.settings.state_dir
    assert causal_claims(app, 3) and app.router().stream_state(3).path == (
        state / "router" / "stream-03.sqlite"
    )
    assert (state / "router" / "stream-03.sqlite").is_file()
    assert (state / "views" / "EVENTS_03.sqlite").is_file()
