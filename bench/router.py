"""(e) The event router's ``project-view-projector`` against a raw pull consumer and a
FastStream peer; (f) commit-to-view latency with the in-process nudge on.

**(e) Throughput.** One stream (``EVENTS_00``) holds N pre-published ``task.ready`` Events of
several projects that hash to it, interleaved as concurrent writers leave them. Each kind
drains the same events from a fresh durable pull consumer (the router's consumer settings:
explicit ack, 300 s ack wait, 1,000 acks pending), each over its own NATS connection:

* ``raw_fetch_ack``: nats-py ``pull_subscribe`` + ``fetch(100)`` + ``msg.ack()`` for every
  message, nothing else: the floor of what any consumer pays;
* ``projector``: ``EventRouter.consume`` for ``project-view-projector`` exactly as a nudge
  runs it — a fresh run context per run (15 apply calls), 2 consumes of 100 per run — run
  after run until drained: fetch, decode, group by project, apply (claims + view rows of the
  fetch's projects in one transaction of the stream's view store), an outcome and an ack per
  record;
* ``faststream``: FastStream's JetStream batch pull subscriber (``PullSub(batch=True)``,
  batch size 100, durable, ``AckPolicy.ACK``) whose handler does the same work per batch: the
  same Event validation, and the fetch's projects applied in one view-store transaction.

**(f) Latency.** Actor transactions at a steady offered rate, in a writer process of their
own → alarm → ``drain_alarms`` (publisher) → ``InProcessNudge`` → ``EventRouter.nudge`` → the
view row committed. The view side is stamped by SQLite's trace callback on each view
connection when the ``COMMIT`` that carries the event's ``project_events`` row starts (the
commit's own fsync comes on top).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import re
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.jetstream import (
    BenchError,
    RunResult,
    ServerCpu,
    measure,
    raw_pipelined,
    reset_streams,
    run_settings,
)
from bench.pinning import CommitCounter, pin_process, pinned_layout
from bench.report import Figure, Ratio
from bench.workload import RawMessage
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.heap import freeze_startup_heap
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.messaging.connection import connect_nats
from rhumbatron.messaging.event_log import Subscription, consumer_config
from rhumbatron.messaging.pull import ensure_consumer
from rhumbatron.operator.inspect import file_kind
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import (
    EVENT_STREAM_COUNT,
    event_stream_name,
    event_stream_subject,
    stable_event_id,
    stream_index,
)
from rhumbatron.router.handlers import NoCausalRules, RunContext
from rhumbatron.router.nudge import InProcessNudge
from rhumbatron.router.records import Outcome, Record
from rhumbatron.router.view_store import StreamViews
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

    from rhumbatron.router.event_router import EventRouter

__all__ = [
    "TARGET_LATENCY_P99_MS",
    "TARGET_PROJECTOR_VS_FASTSTREAM",
    "TARGET_PROJECTOR_VS_RAW",
    "ConsumeResult",
    "LatencyResult",
    "RouterOptions",
    "RouterSuite",
    "RouterWorkload",
    "build_router_workload",
    "faststream_run",
    "format_latency",
    "latency_run",
    "projector_run",
    "raw_fetch_ack_run",
    "router_ratios",
    "router_suite",
]

#: Target floors and ceilings on the issue's 2-core machine.
TARGET_PROJECTOR_VS_RAW = 0.6
TARGET_PROJECTOR_VS_FASTSTREAM = 1.0
TARGET_LATENCY_P99_MS = 50.0
TARGET_PROJECTOR_VS_RAW_WIDE = 0.5
TARGET_KNEE_RATE = 500.0
TARGET_PIPELINE_CPU_MS = 1.2
#: A latency run counts at its target rate only when the writer offered at least this share.
OFFERED_RATE_FLOOR = 0.95

#: The stream the throughput kinds drain.
ROUTER_STREAM = 0
#: Records per fetch for every kind: the router's ``router_fetch_max_records`` (spec: 100).
BATCH = 100

_PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR
_KINDS = ("raw_fetch_ack", "projector", "faststream")
_WIDE_KINDS = ("raw_fetch_ack", "projector")
_DESCRIPTIONS = {
    "raw_fetch_ack": (
        "(e) raw nats-py durable pull consumer: fetch(100) + msg.ack() per message, no work"
    ),
    "projector": (
        "(e) EventRouter.consume(project-view-projector) as a nudge runs it (2 consumes of 100, "
        "15 apply calls per run), run after run: decode, claim + apply_delta, ack"
    ),
    "faststream": (
        "(e) FastStream PullSub(batch=True, batch_size=100), durable, AckPolicy.ACK; handler: "
        "the same decode + one view-store transaction per batch"
    ),
}
_CALLER_TENANT = "tenant-bench"


@dataclass(frozen=True, slots=True)
class RouterOptions:
    """The router benchmarks' knobs (command-line flags of ``bench.run``)."""

    repeats: int
    projects: int
    events_per_project: int
    latency_rate: float
    latency_s: float
    latency_projects: int
    #: Other offered rates, each run for ``knee_s`` after the main one: the rate sweep that
    #: finds the knee (the highest rate whose p99 stays within the target).
    knee_rates: tuple[float, ...] = ()
    knee_s: float = 4.0
    #: The projector against the raw consumer once more, with this many projects on the
    #: stream (every fetch of 100 holds 50 projects: the 15-call cap's hard case).
    wide_projects: int = 50


@dataclass(frozen=True, slots=True)
class RouterWorkload:
    """Events of ``projects`` (all on ``ROUTER_STREAM``), interleaved round-robin."""

    projects: tuple[str, ...]
    messages: tuple[RawMessage, ...]

    @property
    def events(self) -> int:
        return len(self.messages)

    def describe(self) -> dict[str, object]:
        """The workload's shape, for ``results.json`` and the docs."""
        return {
            "stream": event_stream_name(ROUTER_STREAM),
            "projects": len(self.projects),
            "events": self.events,
            "events_per_project": self.events // max(len(self.projects), 1),
            "order": "round-robin over the projects (every fetch of 100 holds all of them)",
            "event_type": "task.ready",
            "mean_envelope_bytes": round(
                sum(len(m.data) for m in self.messages) / max(self.events, 1), 1
            ),
        }


def _projects_on(stream: int, count: int, prefix: str) -> list[str]:
    """``count`` project IDs whose events go to ``stream``."""
    found: list[str] = []
    number = 0
    while len(found) < count:
        project = f"{prefix}-{number:04d}"
        number += 1
        if stream_index(project) == stream:
            found.append(project)
    return found


def _task_ready(project: str, number: int, now: datetime) -> tuple[str, bytes]:
    """One ``task.ready`` Event of ``project`` (8 Changes per project), as its outbox holds it."""
    caller = Caller(_CALLER_TENANT, "system:bench", f"corr-{project}")
    event = FactContext(caller, project, now).fact(
        "task.ready",
        {"agent_role": "builder"},
        change_id=f"chg-{project}-{number % 8:02d}",
        task_id=f"task-{number:06d}",
    )
    return event.event_id, event.to_json()


def _create_project_roots(app: Rhumbatron, projects: Sequence[str]) -> None:
    """The project roots of the synthetic events' projects, for the caller's tenant (not
    timed): the router refuses an event whose project has no root (issue #21)."""
    for project in projects:
        if app.project_tenant(project) is None:
            owner = Caller(_CALLER_TENANT, "system:bench", f"corr-root-{project}")
            app.project_root(project).create_project(owner, name=project)


def build_router_workload(
    *, projects: int, events_per_project: int, prefix: str = "router"
) -> RouterWorkload:
    """Valid Event envelopes of ``projects`` projects on ``ROUTER_STREAM``, round-robin."""
    ids = _projects_on(ROUTER_STREAM, projects, prefix)
    now = datetime.now(UTC)
    subject = event_stream_subject(ROUTER_STREAM)
    messages = []
    for number in range(events_per_project):
        for project in ids:
            event_id, data = _task_ready(project, number, now)
            messages.append(RawMessage(subject, event_id, data))
    return RouterWorkload(tuple(ids), tuple(messages))


# -- (e) throughput --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumeResult:
    """One drain: its timing, and how many records it fetched (redeliveries included)."""

    run: RunResult
    fetched: int
    router_runs: int = 0


async def _publish(nc: NATS, settings: Settings, workload: RouterWorkload) -> None:
    """Empty streams, then the workload on ``ROUTER_STREAM`` (not timed)."""
    await reset_streams(nc, settings)
    js = nc.jetstream(timeout=10.0)
    await raw_pipelined(js, workload.messages, window=BATCH, ack_timeout_s=10.0)
    info = await js.stream_info(event_stream_name(ROUTER_STREAM))
    if info.state.messages != workload.events:
        raise BenchError(f"{info.state.messages} of {workload.events} events on the stream")
    _settle_disk()


def _settle_disk() -> None:
    """Write back the dirty pages earlier runs left (not timed), so no run's fsyncs queue
    behind another run's files."""
    os.sync()


async def _create_consumer(nc: NATS, settings: Settings, durable: str) -> None:
    """The durable consumer with the router's settings, created before the clock starts."""
    config = consumer_config(_PROJECTOR, settings)
    config.durable_name = durable
    await ensure_consumer(nc.jetstream(), event_stream_name(ROUTER_STREAM), config)


async def _check_drained(nc: NATS, durable: str, timeout_s: float = 10.0) -> int:
    """Wait until the consumer has nothing pending and nothing unacknowledged; return how
    many deliveries JetStream made to it (redeliveries included).

    Acks are fire-and-forget publishes; the server counts them a moment after the client
    sent them. This wait is inside the timing only for FastStream, whose last acks go out
    after its handler returns (see :func:`faststream_run`).
    """
    js = nc.jetstream()
    stream = event_stream_name(ROUTER_STREAM)
    deadline = time.monotonic() + timeout_s
    while True:
        info = await js.consumer_info(stream, durable)
        if not info.num_pending and not info.num_ack_pending:
            return int(info.delivered.consumer_seq or 0)
        if time.monotonic() > deadline:
            raise BenchError(
                f"consumer {durable}: {info.num_pending} pending, {info.num_ack_pending} "
                f"unacknowledged after {timeout_s} s"
            )
        await asyncio.sleep(0.0005)


async def raw_fetch_ack_run(
    url: str, settings: Settings, workload: RouterWorkload, cpu: ServerCpu, tag: str
) -> ConsumeResult:
    """nats-py ``fetch(100)`` and ``ack`` every message until all N are acked."""
    nc = await connect_nats(settings, name=f"bench-raw-{tag}")
    durable = f"raw-{tag}"
    fetched = 0
    try:
        await _create_consumer(nc, settings, durable)

        async def run() -> None:
            nonlocal fetched
            js = nc.jetstream()
            sub = await js.pull_subscribe(
                event_stream_subject(ROUTER_STREAM),
                durable=durable,
                stream=event_stream_name(ROUTER_STREAM),
            )
            while fetched < workload.events:
                messages = await sub.fetch(BATCH, timeout=settings.router_fetch_timeout_s)
                fetched += len(messages)
                for msg in messages:
                    await msg.ack()
            await nc.flush()

        result = await measure(workload.events, cpu, run)
        await _check_drained(nc, durable)
    finally:
        await nc.close()
    return ConsumeResult(result, fetched)


def _views_applied(stores: Sequence[StreamViews]) -> int:
    """Events the view stores hold (their feed rows), to check a drain applied each once."""
    return sum(
        int(store.connection.execute("SELECT COUNT(*) FROM project_events").fetchone()[0])
        for store in stores
    )


async def projector_run(
    url: str, workload: RouterWorkload, state_dir: Path, cpu: ServerCpu
) -> ConsumeResult:
    """Nudge-shaped ``EventRouter.consume`` runs of the projector until all N are applied.

    Each run gets a fresh :class:`RunContext` (the apply budget of a run) and up to
    ``router_consumes_per_run`` fetches, as :meth:`EventRouter.nudge` gives it, one run after
    the other as a nudge's turn runs them, ended by ``release_held``; the causal router's half
    of a nudge is left out (it is a different subscription). The view files
    are opened before the clock starts, as a warm router has them open, and the process's heap
    is frozen then, as a warm container's is (``rhumbatron.core.heap``).
    """
    settings = load_settings(state_dir=state_dir, nats_url=url, network_filesystem=False)
    app = bootstrap(settings)
    router = app.router()
    _create_project_roots(app, workload.projects)
    nc = await app.nats()
    await _create_consumer(nc, settings, _PROJECTOR.value)
    views = [
        router.projector.views(i) for i in sorted({stream_index(p) for p in workload.projects})
    ]
    for store in views:
        _ = store.connection
    freeze_startup_heap()
    applied = runs = 0

    async def run() -> None:
        nonlocal applied, runs
        stalled = 0
        while applied < workload.events:
            context = RunContext(
                stream_index=ROUTER_STREAM,
                now_s=app.clock.now().timestamp(),
                apply_calls_left=settings.router_apply_calls_per_run,
            )
            # As a nudge runs it in a turn of runs (``nudge_in_turn``): the acks of a run
            # wait for its commit's sync while the next run goes on, and the connection is
            # flushed once per run; the last run's acks are sent by ``release_held``.
            report = await router.consume(
                context,
                _PROJECTOR,
                consumes=settings.router_consumes_per_run,
                batch=settings.router_fetch_max_records,
                flush=False,
            )
            await nc.flush()
            runs += 1
            applied += report.applied
            if report.failed or report.retried or report.duplicates:
                raise BenchError(f"projector run {runs} was not clean: {report}")
            stalled = stalled + 1 if report.applied == 0 else 0
            if stalled > 100:
                raise BenchError(f"projector stalled at {applied} of {workload.events} events")
        await router.release_held(ROUTER_STREAM)

    try:
        result = await measure(workload.events, cpu, run)
        # Deliveries, not records handed to runs: a record a run held for the next one is
        # handed out twice but delivered once.
        fetched = await _check_drained(nc, _PROJECTOR.value)
        if (held := _views_applied(views)) != workload.events:
            raise BenchError(f"the views hold {held} of {workload.events} events")
    finally:
        await app.close()
    return ConsumeResult(result, fetched, runs)


async def faststream_run(
    url: str, workload: RouterWorkload, state_dir: Path, cpu: ServerCpu, tag: str
) -> ConsumeResult:
    """FastStream's batch pull subscriber doing the projector's work until all N are acked.

    FastStream decodes each body from JSON (its default decoder); the handler validates each
    into an :class:`Event` (``Event.parse`` of the mapping: the same model validation the
    router's decode runs after its own ``json.loads``), groups the batch by project and calls
    the stream's view store with the batch's projects: the same claim and view SQL, one
    transaction per batch. FastStream acks the batch after the handler
    returns (``AckPolicy.ACK``). Its per-message access log is off (``logger=None``), as the
    router logs nothing per record. The broker connects before the clock starts; starting it
    (consumer lookup, the pull loop) is timed, as the router's first fetch looks its consumer
    up too. The clock stops when the server has every ack.
    """
    from faststream import Context
    from faststream.middlewares import AckPolicy
    from faststream.nats import JStream, NatsBroker, PullSub
    from nats.js.api import AckPolicy as JsAckPolicy
    from nats.js.api import ConsumerConfig, DeliverPolicy

    settings = load_settings(state_dir=state_dir, nats_url=url, network_filesystem=False)
    durable = f"faststream-{tag}"
    store = StreamViews(settings, ROUTER_STREAM)
    _ = store.connection
    applied = fetched = 0
    done = asyncio.Event()
    broker = NatsBroker(url, logger=None, name=f"bench-faststream-{tag}")

    @broker.subscriber(
        event_stream_subject(ROUTER_STREAM),
        stream=JStream(name=event_stream_name(ROUTER_STREAM), declare=False),
        durable=durable,
        config=ConsumerConfig(
            ack_policy=JsAckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=settings.router_ack_wait_s,
            max_deliver=-1,
            max_ack_pending=settings.router_max_ack_pending,
        ),
        pull_sub=PullSub(batch_size=BATCH, timeout=settings.router_fetch_timeout_s, batch=True),
        ack_policy=AckPolicy.ACK,
    )
    # FastStream injects the batch's StreamMessage (the raw Msgs) by this default.
    async def on_batch(body: list[dict[str, Any]], message: Any = Context("message")) -> None:  # noqa: B008
        nonlocal applied, fetched
        raw: list[Msg] = message.raw_message
        fetched += len(raw)
        by_project: dict[str, list[Record]] = {}
        for msg, data in zip(raw, body, strict=True):
            event = Event.parse(data)  # FastStream has decoded the JSON already
            record = Record(msg, msg.metadata.sequence.stream, event.event_id, event, None)
            by_project.setdefault(event.project_id, []).append(record)
        outcomes = store.apply(list(by_project.values()), now_s=time.time())
        applied += sum(o.outcome is Outcome.APPLIED for o in outcomes.values())
        if applied >= workload.events:
            done.set()

    await broker.connect()
    checker = await connect_nats(settings, name=f"bench-faststream-check-{tag}")
    try:
        await _create_consumer(checker, settings, durable)

        async def run() -> None:
            await broker.start()
            await asyncio.wait_for(done.wait(), timeout=120)
            await _check_drained(checker, durable)

        result = await measure(workload.events, cpu, run)
        if applied != workload.events:
            raise BenchError(f"faststream applied {applied} of {workload.events} events")
        if (held := _views_applied([store])) != workload.events:
            raise BenchError(f"the views hold {held} of {workload.events} events")
    finally:
        await broker.stop()
        await checker.close()
        store.close()
    return ConsumeResult(result, fetched)


# -- (f) commit-to-view latency ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyResult:
    """Commit-to-view latency of every event of one paced run, and the rates it ran at."""

    target_rate: float
    events: int
    write_s: float
    apply_s: float
    latencies_ms: tuple[float, ...]
    writer_late_max_ms: float
    events_after_load: int
    nudge_runs: int
    publish_fires: int
    projects: int
    #: Per event: actor COMMIT -> stored on its stream (the publisher's share), and stored ->
    #: view COMMIT (the router's share), from the stream's own timestamps.
    to_stream_ms: tuple[float, ...] = ()
    to_view_ms: tuple[float, ...] = ()
    #: CPU seconds each process of the pipeline used from the load's start to the last
    #: event in its view (``/proc``): the bench process (publisher and router), the actors'
    #: writer, and nats-server.
    cpu_s: dict[str, float] = field(default_factory=dict)
    #: Durable SQLite commits of the paced load, by role: the actors' own (the writer's),
    #: the publisher's (actor files) and the router's (view stores, stream state, product).
    commits: dict[str, int] = field(default_factory=dict)
    #: Where the roles ran: one box shared by every process, or pinned apart.
    layout: str = "one box: writer, publisher + router, nats-server on every CPU"
    #: The CPUs each role's process could run on during the load, as it saw them.
    cpus_by_role: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def cpu_ms_per_event(self) -> float:
        """The whole pipeline's CPU per event, every process summed."""
        return sum(self.cpu_s.values()) / self.events * 1000

    @property
    def offered_rate(self) -> float:
        """Events committed by actors per second of the writing phase."""
        return self.events / self.write_s

    @property
    def applied_rate(self) -> float:
        """Events in the views per second, from the first actor commit to the last view row."""
        return self.events / self.apply_s

    def percentile(self, q: int, of: Sequence[float] | None = None) -> float:
        """The ``q``-th percentile of the latencies (or of ``of``), inclusive method, in ms."""
        data = self.latencies_ms if of is None else of
        return statistics.quantiles(data, n=100, method="inclusive")[q - 1]

    def split(self) -> dict[str, float]:
        """p50 and p99 of the publisher's and the router's share of the latency."""
        if not self.to_stream_ms or not self.to_view_ms:
            return {}
        return {
            "commit_to_stream_p50_ms": round(self.percentile(50, self.to_stream_ms), 2),
            "commit_to_stream_p99_ms": round(self.percentile(99, self.to_stream_ms), 2),
            "stream_to_view_p50_ms": round(self.percentile(50, self.to_view_ms), 2),
            "stream_to_view_p99_ms": round(self.percentile(99, self.to_view_ms), 2),
        }

    @property
    def offered_in_full(self) -> bool:
        """Whether the writer kept to the rate: a run whose writer fell behind (its offered
        rate under 95 % of the target) did not test the target rate."""
        return self.offered_rate >= OFFERED_RATE_FLOOR * self.target_rate

    @property
    def status(self) -> str:
        """PASS when the target rate was offered and p99 stayed within the target; SHORT when
        the writer could not offer the rate (it counts as no pass)."""
        if not self.offered_in_full:
            return "SHORT"
        return "PASS" if self.percentile(99) <= TARGET_LATENCY_P99_MS else "MISS"

    def as_json(self) -> dict[str, Any]:
        """The run as written to ``results.json``."""
        return {
            "target_rate_events_per_s": self.target_rate,
            "offered_rate_events_per_s": round(self.offered_rate, 1),
            "applied_rate_events_per_s": round(self.applied_rate, 1),
            "events": self.events,
            "projects": self.projects,
            "p50_ms": round(self.percentile(50), 2),
            "p90_ms": round(self.percentile(90), 2),
            "p99_ms": round(self.percentile(99), 2),
            "max_ms": round(max(self.latencies_ms), 2),
            "target_p99_at_most_ms": TARGET_LATENCY_P99_MS,
            "status": self.status,
            "writer_late_max_ms": round(self.writer_late_max_ms, 2),
            "events_applied_after_the_load": self.events_after_load,
            "nudge_runs": self.nudge_runs,
            "publisher_alarm_fires": self.publish_fires,
            **self.split(),
            "cpu_s_by_process": {k: round(v, 3) for k, v in self.cpu_s.items()},
            "cpu_ms_per_event": round(self.cpu_ms_per_event, 3) if self.cpu_s else None,
            "sqlite_commits_per_event_by_role": {
                role: round(count / self.events, 3) for role, count in self.commits.items()
            },
            "layout": self.layout,
            "cpus_by_role": {role: list(cpus) for role, cpus in self.cpus_by_role.items()},
        }


# The event ID opening each row of a traced feed INSERT, its parameters expanded.
_FEED_ROW_IDS = re.compile(r"(?:VALUES |\), )\('([^']+)'")


class _ViewCommits:
    """Stamps each event's ``project_events`` row with the time its view ``COMMIT`` starts.

    SQLite's trace callback (public ``sqlite3`` API) sees every statement a view connection
    runs, with its parameters expanded; no router code is wrapped or patched.
    """

    def __init__(self) -> None:
        self.committed_at: dict[str, float] = {}

    def tracer(self) -> Callable[[str], None]:
        pending: list[str] = []

        def trace(statement: str) -> None:
            if statement.startswith("INSERT INTO project_events"):
                # One row, or several (``row_statements``): each row's first value is its ID.
                pending.extend(_FEED_ROW_IDS.findall(statement))
            elif statement == "COMMIT":
                now = time.perf_counter()
                for event_id in pending:
                    self.committed_at.setdefault(event_id, now)
                pending.clear()
            elif statement == "ROLLBACK":
                pending.clear()

        return trace


def _latency_projects(count: int) -> list[str]:
    """``count`` projects spread over the eight streams (one per stream first)."""
    return [
        _projects_on(index % EVENT_STREAM_COUNT, index // EVENT_STREAM_COUNT + 1, "latency")[-1]
        for index in range(count)
    ]


_Plan = list[tuple[str, str, str]]


def latency_plan(rate: float, seconds: float, projects: int) -> tuple[list[str], _Plan, _Plan]:
    """``(projects, warm-up, paced plan)`` of a latency run: ``rate × seconds`` writes of
    ``(project, change, task)`` round-robin over the projects, four Changes each."""
    project_ids = _latency_projects(projects)
    plan = [
        (project_ids[n % projects], f"chg-{project_ids[n % projects]}-{n % 4}", f"task-{n:06d}")
        for n in range(int(rate * seconds))
    ]
    # One event per Change of the plan opens every actor file, view file, consumer and pull
    # subscription before the load, as warm processes have them.
    warm = [(p, c, f"task-warm-{c}") for p, c in dict.fromkeys((p, c) for p, c, _ in plan)]
    return project_ids, warm, plan


def _writer_process(
    conn: Connection,
    state_dir: Path,
    url: str,
    warm: _Plan,
    plan: _Plan,
    rate: float,
    alarms_to: Connection | None = None,
    cpus: frozenset[int] | None = None,
) -> None:
    """The actors' side of the latency run, in a process of its own (as workflow functions are).

    Commits ``warm``, reports ``warm-done`` and waits for ``go``; then commits ``plan`` on
    schedule (open loop: a late write does not push the schedule back). After every commit it
    sends ``(event_id, commit time, announced alarm keys)``: the alarm invoke of production.
    With ``alarms_to`` (the publisher's own process) the keys go there instead, before the
    commit's time is sent. ``time.perf_counter`` is CLOCK_MONOTONIC, one clock for every
    process of the machine. ``done`` carries the SQLite commits of the paced writes.
    """
    if cpus is not None:
        pin_process(os.getpid(), cpus)
    settings = load_settings(state_dir=state_dir, nats_url=url, network_filesystem=False)
    alarms = RecordingAlarmSink()
    app = bootstrap(settings, alarms=alarms)
    callers: dict[str, Caller] = {}
    commits = CommitCounter()

    def write(project: str, change_id: str, task_id: str) -> None:
        caller = callers.setdefault(
            project, Caller(_CALLER_TENANT, "system:bench", f"corr-{project}")
        )
        app.resource_shard(project, change_resource_key(change_id)).apply(
            caller,
            AppendChangeEvents(
                change_id=change_id,
                status="running",
                facts=(ChangeFact("task.ready", {"agent_role": "builder"}, task_id=task_id),),
            ),
        )
        committed = time.perf_counter()
        event_id = stable_event_id(change_id, "task.ready", task_id)
        keys = alarms.drain()
        if alarms_to is not None:
            if keys:
                alarms_to.send(keys)
            keys = []
        conn.send(("commit", event_id, committed, keys))

    try:
        for project, change_id, task_id in warm:
            write(project, change_id, task_id)
        freeze_startup_heap()  # warm now, as a warm container is after its first invocation
        conn.send(("warm-done",))
        if conn.recv() != "go":
            return
        commits.start()
        late_max = 0.0
        started = time.perf_counter()
        for number, (project, change_id, task_id) in enumerate(plan):
            wait = started + number / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                late_max = max(late_max, -wait)
            write(project, change_id, task_id)
        ran_on = sorted(os.sched_getaffinity(0))  # where the paced writes ran
        conn.send(("done", time.perf_counter() - started, late_max, commits.stop(), ran_on))
    finally:
        for ref in list(app.actor_refs()):
            app.actor(ref).close()
        conn.close()
        if alarms_to is not None:
            alarms_to.close()


def _process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc``; 0 when gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def latency_run(
    url: str,
    state_dir: Path,
    *,
    rate: float,
    seconds: float,
    projects: int,
    server_cpu: ServerCpu | None = None,
) -> LatencyResult:
    """Actor transactions at ``rate`` per second for ``seconds``; every event timed to its view.

    The actors write in a process of their own (see :func:`_writer_process`), one
    ``task.ready`` fact per ``AppendChangeEvents`` transaction, and hand each
    alarm they announce to this process, as the alarm invoke does. Here the publisher and the
    router share one runtime and event loop, as the local invoker has them: a publisher task
    runs ``Rhumbatron.drain_alarms`` whenever an alarm was announced, and the publisher nudges
    each stream it sent to through ``InProcessNudge``, which runs ``EventRouter.nudge``
    (projector, then causal router) as a background task per stream. The clock is the real
    one. Events still unapplied after the load get extra nudge runs (the sweep's job in
    production) and are counted.
    """
    settings = load_settings(state_dir=state_dir, nats_url=url, network_filesystem=False)
    nudge = InProcessNudge()
    app = bootstrap(settings, nudge=nudge, causal_routing=NoCausalRules())
    loop = asyncio.get_running_loop()
    views = _ViewCommits()
    project_ids, warm, plan = latency_plan(rate, seconds, projects)
    committed_at: dict[str, float] = {}
    writer_commits: dict[str, int] = {}
    ours_commits = CommitCounter(role_of=lambda path: _role_of_commit(path, state_dir))
    fires = 0
    writing = True
    wake = asyncio.Event()
    warmed: asyncio.Future[None] = loop.create_future()
    done: asyncio.Future[tuple[float, float]] = loop.create_future()

    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    writer = context.Process(
        target=_writer_process,
        args=(theirs, state_dir, url, warm, plan, rate),
        name="bench-latency-writer",
    )

    def on_message() -> None:  # the writer's commits and alarms reach this process
        try:
            while ours.poll():
                message = ours.recv()
                if message[0] == "commit":
                    _, event_id, at, keys = message
                    committed_at[event_id] = at
                    now = app.clock.now()
                    for key in keys:
                        app.alarms.alarm_set(key, now)
                    wake.set()
                elif message[0] == "warm-done":
                    warmed.set_result(None)
                elif message[0] == "done":
                    done.set_result((message[1], message[2]))
                    writer_commits.update(message[3])
        except EOFError:
            loop.remove_reader(ours.fileno())
            for future in (warmed, done):
                if not future.done():
                    future.set_exception(BenchError("the latency writer process died"))

    async def publisher() -> None:
        nonlocal fires
        while True:
            await wake.wait()
            wake.clear()
            reports = await app.drain_alarms()
            fires += len(reports)
            unclean = [r for r in reports if r.failed or r.retry_wait or r.error or r.unavailable]
            if unclean:
                raise BenchError(f"the publisher did not publish cleanly: {unclean[0]}")
            if not writing and not wake.is_set():
                return

    async def finish(publishing: asyncio.Task[None]) -> None:
        nonlocal writing
        writing = False
        wake.set()
        await publishing
        await nudge.settle()

    try:
        await app.ensure_streams()
        router = app.router()
        # Their project.created events go out with the warm-up, whose times are dropped.
        _create_project_roots(app, project_ids)
        for index in sorted({stream_index(p) for p in project_ids}):
            router.projector.views(index).connection.set_trace_callback(views.tracer())
        writer.start()
        theirs.close()
        loop.add_reader(ours.fileno(), on_message)
        publishing = asyncio.create_task(publisher())
        await asyncio.wait_for(warmed, timeout=60)
        await finish(publishing)
        freeze_startup_heap()  # the publisher's and router's process is warm now
        committed_at.clear()
        writing, fires = True, 0
        runs_before = nudge.runs
        cpu_before = _pipeline_cpu(writer.pid, server_cpu)
        ours_commits.start()
        publishing = asyncio.create_task(publisher())
        ours.send("go")
        write_s, late_max = await asyncio.wait_for(done, timeout=seconds * 10 + 60)
        await finish(publishing)
        cpu_after = _pipeline_cpu(writer.pid, server_cpu)
        role_commits = {"actors (writer)": writer_commits.get("all", 0), **ours_commits.stop()}
        cpu_s = {k: cpu_after[k] - cpu_before[k] for k in cpu_before}
        applied_by_nudges = sum(1 for e in committed_at if e in views.committed_at)
        await apply_what_is_left(router, {stream_index(p) for p in project_ids})
        nudge_runs = nudge.runs - runs_before
        stored_at = await _stored_at(await app.nats(), {stream_index(p) for p in project_ids})
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(ours.fileno())
        ours.close()
        if writer.pid is not None:
            writer.join(timeout=30)
            if writer.is_alive():
                writer.kill()
        ours_commits.stop()
        await nudge.close()
        await app.close()
    return latency_result(
        rate=rate,
        projects=projects,
        committed_at=committed_at,
        views=views,
        stored_at=stored_at,
        write_s=write_s,
        late_max_s=late_max,
        applied_by_nudges=applied_by_nudges,
        nudge_runs=nudge_runs,
        fires=fires,
        cpu_s=cpu_s,
        commits=role_commits,
    )


async def apply_what_is_left(router: EventRouter, streams: set[int]) -> None:
    """Nudge each of ``streams`` until a round applies nothing: what the sweep would pick up
    after a latency run's load (the events applied so are counted as after the load)."""
    for _ in range(100):
        moved = 0
        for index in sorted(streams):
            report = await router.nudge(index)
            moved += report.total("applied")
        if not moved:
            return


def latency_result(
    *,
    rate: float,
    projects: int,
    committed_at: dict[str, float],
    views: _ViewCommits,
    stored_at: dict[str, float],
    write_s: float,
    late_max_s: float,
    applied_by_nudges: int,
    nudge_runs: int,
    fires: int,
    cpu_s: dict[str, float],
    commits: dict[str, int],
    layout: str | None = None,
    cpus_by_role: dict[str, tuple[int, ...]] | None = None,
) -> LatencyResult:
    """A latency run's result from what it stamped; raises when an event never reached its
    view."""
    total = len(committed_at)
    missing = [e for e in committed_at if e not in views.committed_at]
    if missing:
        raise BenchError(f"{len(missing)} of {total} events never reached their view")
    latencies = tuple(sorted((views.committed_at[e] - at) * 1000 for e, at in committed_at.items()))
    first = min(committed_at.values())
    last = max(views.committed_at[e] for e in committed_at)
    # The stream's timestamps are wall-clock; the rest is CLOCK_MONOTONIC.
    offset = time.time() - time.perf_counter()
    return LatencyResult(
        target_rate=rate,
        events=total,
        write_s=write_s,
        apply_s=last - first,
        latencies_ms=latencies,
        writer_late_max_ms=late_max_s * 1000,
        events_after_load=total - applied_by_nudges,
        nudge_runs=nudge_runs,
        publish_fires=fires,
        projects=projects,
        to_stream_ms=tuple(
            sorted((stored_at[e] - offset - at) * 1000 for e, at in committed_at.items())
        ),
        to_view_ms=tuple(
            sorted((views.committed_at[e] + offset - stored_at[e]) * 1000 for e in committed_at)
        ),
        cpu_s=cpu_s,
        commits=commits,
        **({"layout": layout} if layout is not None else {}),
        cpus_by_role=cpus_by_role or {},
    )


def _role_of_commit(path: Path, state_dir: Path) -> str:
    """Whose commit a file's is, in the process that publishes and routes: the publisher
    writes actor files, the router everything else."""
    return "publisher" if file_kind(path, state_dir) == "actor" else "router"


def _pipeline_cpu(writer_pid: int | None, server_cpu: ServerCpu | None) -> dict[str, float]:
    """CPU seconds so far of each process of the latency pipeline."""
    return {
        "bench (publisher + router)": time.process_time(),
        "writer (actors)": _process_cpu_s(writer_pid),
        "nats-server": server_cpu.seconds() if server_cpu is not None else 0.0,
    }


async def _stored_at(nc: NATS, streams: set[int]) -> dict[str, float]:
    """When each event was stored on its stream (the server's timestamp), by Event ID."""
    js = nc.jetstream()
    stored: dict[str, float] = {}
    for index in sorted(streams):
        stream = event_stream_name(index)
        count = int((await js.stream_info(stream)).state.messages or 0)
        sub = await js.pull_subscribe(event_stream_subject(index), stream=stream)
        got = 0
        try:
            while got < count and (messages := await sub.fetch(BATCH, timeout=5)):
                got += len(messages)
                for msg in messages:
                    event_id = (msg.headers or {}).get("Nats-Msg-Id", "")
                    stored[event_id] = msg.metadata.timestamp.timestamp()
                    await msg.ack()
        finally:
            await sub.unsubscribe()
    return stored


def format_latency(result: LatencyResult) -> str:
    """The latency run as printed lines, with its target."""
    return "\n".join(
        [
            "router commit-to-view latency (actor COMMIT -> view COMMIT, nudge on)",
            "-" * 72,
            result.layout,
            f"offered {result.offered_rate:,.0f} events/s (target {result.target_rate:,.0f}) "
            f"for {result.write_s:.1f} s, {result.events:,} events, {result.projects} projects; "
            f"applied {result.applied_rate:,.0f} events/s",
            f"p50 {result.percentile(50):.1f} ms  p90 {result.percentile(90):.1f} ms  "
            f"p99 {result.percentile(99):.1f} ms  max {max(result.latencies_ms):.1f} ms  "
            f"(target p99 <= {TARGET_LATENCY_P99_MS:g} ms: {result.status})",
            "split by the stream's timestamps: "
            + ", ".join(f"{k} {v:.1f}" for k, v in result.split().items()),
            f"{result.nudge_runs} nudge runs, {result.publish_fires} publisher alarm fires, "
            f"writer at most {result.writer_late_max_ms:.1f} ms behind schedule, "
            f"{result.events_after_load} events applied only after the load (sweep's job)",
            f"CPU {result.cpu_ms_per_event:.2f} ms per event ("
            + ", ".join(f"{k} {v / result.events * 1000:.2f}" for k, v in result.cpu_s.items())
            + "); SQLite commits per event: "
            + ", ".join(f"{k} {v / result.events:.2f}" for k, v in result.commits.items()),
        ]
    )


# -- the suite -------------------------------------------------------------------------------


@dataclass
class RouterSuite:
    """What the router benchmarks produced."""

    workload: RouterWorkload
    wide: RouterWorkload | None = None
    figures: list[Figure] = field(default_factory=list)
    diagnostics: list[Figure] = field(default_factory=list)
    latency: LatencyResult | None = None
    knee: list[LatencyResult] = field(default_factory=list)
    #: The same rates with the roles in processes of their own, pinned apart (empty on a
    #: machine with one CPU).
    pinned: list[LatencyResult] = field(default_factory=list)

    def knee_rate(self, runs: Sequence[LatencyResult] | None = None) -> float | None:
        """The highest target rate of the sweep that was offered in full and whose p99 stays
        within the target (None: none does). A lower rate that missed does not hide it: at
        100 events/s a 4 s run holds 400 events, and one stall of the shared host is its
        p99. ``runs``: the pinned sweep, say; the one-box sweep by default."""
        if runs is None:
            runs = [*([self.latency] if self.latency is not None else []), *self.knee]
        passing = [r.target_rate for r in runs if r.status == "PASS"]
        return max(passing) if passing else None

    def targets(self) -> list[dict[str, Any]]:
        """The latency and CPU targets of issue #16, each with its status."""
        found: list[dict[str, Any]] = []
        sweeps = [
            (
                "router_latency.knee_rate_events_per_s",
                [*([self.latency] if self.latency else []), *self.knee],
                "one box: writer, publisher + router and nats-server on the same 2 cores",
            ),
        ]
        if self.pinned:
            sweeps.append(
                (
                    "router_latency.knee_rate_events_per_s@pinned",
                    self.pinned,
                    self.pinned[0].layout,
                )
            )
        for name, runs, where in sweeps:
            knee = self.knee_rate(runs)
            found.append(
                {
                    "name": name,
                    "value": knee,
                    "target_at_least": TARGET_KNEE_RATE,
                    "status": "PASS" if knee is not None and knee >= TARGET_KNEE_RATE else "MISS",
                    "how": f"{where}; rates "
                    + ", ".join(f"{r.target_rate:g}" for r in sorted(runs, key=_rate)),
                }
            )
        if self.latency is not None and self.latency.cpu_s:
            value = self.latency.cpu_ms_per_event
            found.append(
                {
                    "name": "pipeline.cpu_ms_per_event",
                    "value": round(value, 3),
                    "target_at_most": TARGET_PIPELINE_CPU_MS,
                    "status": "PASS" if value <= TARGET_PIPELINE_CPU_MS else "MISS",
                    "how": f"at {self.latency.target_rate:g} events/s, summed over "
                    + ", ".join(self.latency.cpu_s),
                }
            )
        return found


def _rate(result: LatencyResult) -> float:
    return result.target_rate


def _rotated(items: Sequence[str], by: int) -> list[str]:
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


async def router_suite(
    root: Path, options: RouterOptions, log: Callable[[str], None]
) -> RouterSuite:
    """(e) and (f) against one fresh nats-server at the default ``sync_interval``; (f′) the
    same rates with the roles pinned apart."""
    # The pinned run builds on this module's latency pieces, so it is imported here.
    from bench.pinned_latency import pinned_latency_run

    server = NatsServerProcess(store_dir=root / "nats-router")
    server.start()
    workload = build_router_workload(
        projects=options.projects, events_per_project=options.events_per_project
    )
    warmup = build_router_workload(
        projects=options.projects,
        events_per_project=max(options.events_per_project // 10, 10),
        prefix="router-warm",
    )
    wide = build_router_workload(
        projects=options.wide_projects,
        events_per_project=max(workload.events // options.wide_projects, 1),
        prefix="router-wide",
    )
    suite = RouterSuite(workload, wide=wide)
    results: dict[str, list[ConsumeResult]] = {kind: [] for kind in _KINDS}
    wide_results: dict[str, list[ConsumeResult]] = {kind: [] for kind in _WIDE_KINDS}
    try:
        settings = run_settings(root / "unused-router", server.url)
        nc = await connect_nats(settings, name="bench-router")
        cpu = ServerCpu(server)
        kinds: dict[str, Callable[[RouterWorkload, str], Awaitable[ConsumeResult]]] = {
            "raw_fetch_ack": lambda wl, tag: raw_fetch_ack_run(server.url, settings, wl, cpu, tag),
            "projector": lambda wl, tag: projector_run(
                server.url, wl, root / f"router-state-{tag}", cpu
            ),
            "faststream": lambda wl, tag: faststream_run(
                server.url, wl, root / f"router-faststream-{tag}", cpu, tag
            ),
        }
        log(f"router: warm-up on {warmup.events} other events")
        for kind, run in kinds.items():
            await _publish(nc, settings, warmup)
            await run(warmup, f"warm-{kind}")
        for rep in range(options.repeats):
            for kind in _rotated(_KINDS, rep):
                await _publish(nc, settings, workload)
                result = await kinds[kind](workload, f"{kind}-{rep}")
                results[kind].append(result)
                log(f"router {kind} #{rep + 1}: {result.run.events_per_s:,.0f} events/s")
            for kind in _rotated(_WIDE_KINDS, rep):
                await _publish(nc, settings, wide)
                result = await kinds[kind](wide, f"{kind}-wide-{rep}")
                wide_results[kind].append(result)
                log(
                    f"router {kind} @{len(wide.projects)} projects #{rep + 1}: "
                    f"{result.run.events_per_s:,.0f} events/s"
                )
        for rate, seconds in (
            (options.latency_rate, options.latency_s),
            *((r, options.knee_s) for r in options.knee_rates),
        ):
            await reset_streams(nc, settings)  # the plan's stable Event IDs repeat per run
            _settle_disk()
            log(
                f"router latency: {rate:g} events/s for {seconds:g} s over "
                f"{options.latency_projects} projects"
            )
            latency = await latency_run(
                server.url,
                root / f"router-latency-{rate:g}",
                rate=rate,
                seconds=seconds,
                projects=options.latency_projects,
                server_cpu=cpu,
            )
            p50, p99 = latency.percentile(50), latency.percentile(99)
            log(f"router latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
            if suite.latency is None:
                suite.latency = latency
            else:
                suite.knee.append(latency)
        layout = pinned_layout()
        for rate, seconds in (
            (options.latency_rate, options.latency_s),
            *((r, options.knee_s) for r in options.knee_rates),
        ):
            if layout is None:
                log("router latency, pinned: skipped (this machine offers one CPU)")
                break
            await reset_streams(nc, settings)
            _settle_disk()
            log(f"router latency, pinned: {rate:g} events/s for {seconds:g} s")
            pinned = await pinned_latency_run(
                server.url,
                root / f"router-latency-pinned-{rate:g}",
                rate=rate,
                seconds=seconds,
                projects=options.latency_projects,
                layout=layout,
                server_cpu=cpu,
            )
            log(
                f"router latency, pinned: p50 {pinned.percentile(50):.1f} ms, "
                f"p99 {pinned.percentile(99):.1f} ms"
            )
            suite.pinned.append(pinned)
        await nc.close()
    finally:
        server.stop()

    where_wide = f"one stream, {wide.events:,} events of {len(wide.projects)} projects"
    for kind, runs in wide_results.items():
        suite.figures.append(
            Figure(
                f"router.{kind}@{len(wide.projects)}_projects",
                "events/s",
                f"{_DESCRIPTIONS[kind]}; {where_wide}",
                tuple(r.run.events_per_s for r in runs),
            )
        )
    suite.diagnostics.append(
        Figure(
            f"router.projector.fetched@{len(wide.projects)}_projects",
            "per event",
            "records JetStream delivered per event applied with the wide workload",
            tuple(r.fetched / r.run.events for r in wide_results["projector"]),
        )
    )
    where = f"one stream, {workload.events:,} events of {len(workload.projects)} projects"
    for kind, runs in results.items():
        suite.figures.append(
            Figure(
                f"router.{kind}",
                "events/s",
                f"{_DESCRIPTIONS[kind]}; {where}",
                tuple(r.run.events_per_s for r in runs),
            )
        )
        suite.diagnostics += [
            Figure(
                f"router.{kind}.client_cpu",
                "us/event",
                f"CPU time of the benchmark process per event ({kind})",
                tuple(r.run.client_cpu_s / r.run.events * 1e6 for r in runs),
            ),
            Figure(
                f"router.{kind}.server_cpu",
                "us/event",
                f"CPU time of nats-server per event ({kind})",
                tuple(r.run.server_cpu_s / r.run.events * 1e6 for r in runs),
            ),
        ]
    suite.diagnostics += [
        Figure(
            "router.projector.fetched",
            "per event",
            "records JetStream delivered per event applied (above 1: records delivered again; "
            "the records the 15-call apply budget defers are held for the next run, not "
            "delivered again)",
            tuple(r.fetched / r.run.events for r in results["projector"]),
        ),
        Figure(
            "router.projector.runs",
            "runs",
            "nudge-shaped runs (fresh run context, 2 consumes) the drain took",
            tuple(float(r.router_runs) for r in results["projector"]),
        ),
    ]
    if suite.latency is not None:
        latency = suite.latency
        suite.figures += [
            Figure(
                f"router.latency_p{q}",
                "ms",
                f"p{q} commit-to-view latency at {latency.target_rate:g} events/s offered, "
                "nudge on (actor COMMIT -> publisher -> InProcessNudge -> view COMMIT)",
                (latency.percentile(q),),
            )
            for q in (50, 99)
        ]
        suite.diagnostics += [
            Figure(
                "router.latency_offered",
                "events/s",
                "actor commits per second during the paced load",
                (latency.offered_rate,),
            ),
            Figure(
                "router.latency_applied",
                "events/s",
                "events into the views per second, first actor commit to last view commit",
                (latency.applied_rate,),
            ),
        ]
        for name, of, what in (
            ("to_stream", latency.to_stream_ms, "actor COMMIT -> stored on the stream"),
            ("to_view", latency.to_view_ms, "stored on the stream -> view COMMIT"),
        ):
            suite.diagnostics += [
                Figure(
                    f"router.latency_{name}_p{q}",
                    "ms",
                    f"p{q} of the {what} share of the latency (the stream's timestamps)",
                    (latency.percentile(q, of),),
                )
                for q in (50, 99)
            ]
    for paced, suffix, where in (
        *((knee, "", "") for knee in suite.knee),
        *((pinned, "_pinned", ", the roles pinned apart") for pinned in suite.pinned),
    ):
        suite.diagnostics += [
            Figure(
                f"router.latency_p{q}@{paced.target_rate:g}{suffix}",
                "ms",
                f"p{q} commit-to-view latency at {paced.target_rate:g} events/s offered"
                f"{where} ({paced.write_s:.0f} s)",
                (paced.percentile(q),),
            )
            for q in (50, 99)
        ]
    return suite


def router_ratios(figures: Sequence[Figure]) -> list[Ratio]:
    """The router's ratios: the projector against the raw consumer and against FastStream."""
    by_name = {f.name: f for f in figures}
    projector = by_name["router.projector"]
    return [
        Ratio(
            "router.projector/raw_fetch_ack",
            projector,
            by_name["router.raw_fetch_ack"],
            TARGET_PROJECTOR_VS_RAW,
        ),
        Ratio(
            "router.projector/faststream",
            projector,
            by_name["router.faststream"],
            TARGET_PROJECTOR_VS_FASTSTREAM,
        ),
        Ratio(
            "router.faststream/raw_fetch_ack",
            by_name["router.faststream"],
            by_name["router.raw_fetch_ack"],
        ),
        *(
            Ratio(
                f"router.projector/raw_fetch_ack@{suffix}",
                by_name[f"router.projector@{suffix}"],
                by_name[f"router.raw_fetch_ack@{suffix}"],
                TARGET_PROJECTOR_VS_RAW_WIDE,
            )
            for suffix in sorted(
                name.split("@", 1)[1]
                for name in by_name
                if name.startswith("router.projector@") and name.endswith("_projects")
            )
        ),
    ]
