"""``python -m bench.soak [--events N] [--days D]``: the data plane at volume (issue #17, V1).

The embedded stack (nats-server, moto's S3, SQLite files in a temp directory) runs every role
the way the cloud does, on an injected clock that lives through whole simulated days:

* every ``write_every_min`` simulated minutes the actors commit that slot's events
  (``task.ready`` facts on a bounded set of Tasks, so no table grows by entities), over
  ``projects`` projects on all eight streams, one hot project taking ``hot_share`` of them;
* the outbox publisher drains the alarms those commits announced, and the router runs the
  nudges the publisher sent (projector and causal router; the archiver, analytics and reactions
  too when drain mode is on, as it is when sized for 10⁸ a day);
* every simulated minute the alarm scan and the sweep tick run, the 04:17 daily maintenance and
  the 5-minute release sweeps included, so every prune happens on its own cadence.

The deployment is sized for ``sizing`` events a day (``expected_events_per_day``). The
retentions are shortened to ``retention_days`` (the stream's, the claims', the outbox's, the
metrics'), the way the tests shrink numbers for speed: a table reaches its steady state after
one retention, so at one day every table that grows with events must be flat from the second
simulated day on, which is what V1 of RELIABILITY.md asks. After the load the sweep alone runs
until every consumer's lag is 0.

Checks (each printed PASS or FAIL; the exit status is 1 when one fails):

* every event reached the streams (nothing lost), every project view applied every event, the
  archive holds every event exactly once by ID (read back from S3), and no dead letter;
* every consumer's lag is 0 after the load;
* every table's rows and every kind of file's size are flat from the second day on (at most
  ``FLAT_TOLERANCE`` above the second day's);
* no ceiling warning fired at the run's rate.

Prints: sustained events/s, CPU µs per event by role (this process's CPU in each role's phase;
the moto S3 server runs in it too and lands in the router's), SQLite commits per event by role
(:func:`~rhumbatron.actors.storage.observe_commits`), S3 PUTs per 1,000 events, nudges and alarm
fires per 1,000 events, and the USD per million events at 10⁶, 10⁷ and 10⁸ a day from the
cost model (:mod:`rhumbatron.operator.cost_model`) fed with what the run measured. Writes
``bench/soak-results.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import os
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.jetstream import ServerCpu
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.actors.storage import observe_commits
from rhumbatron.cli.progress import progress_on_stderr
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.progress import ProgressCallback
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.messaging.nudge import RecordingNudge
from rhumbatron.operator.cost_model import CostBreakdown, EfsMode, Workload, cost_per_million
from rhumbatron.operator.inspect import file_kind, inspect_state, totals
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name, stable_event_id
from rhumbatron.queues.dead_letter import open_letter_counts
from rhumbatron.router.event_router import EventRouter
from rhumbatron.router.nudge_turn import nudge_in_turn
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

__all__ = ["FLAT_TOLERANCE", "SoakPlan", "SoakResult", "run_soak"]

RESULTS_PATH = Path(__file__).resolve().parent / "soak-results.json"

#: The issue's targets (``targets``): the run's size and time, commits, cost.
TARGET_EVENTS = 1_000_000
TARGET_WALL_S = 20 * 60.0
TARGET_COMMITS_PER_EVENT = 0.5
TARGET_USD_PER_MILLION = 5.0
#: How far above the second day's a table's rows or a file kind's size may end a later day.
FLAT_TOLERANCE = 0.10
#: Tables smaller than this many rows on the second day are judged against it instead, so a
#: table of a handful of rows is not "growing" by one.
_FLAT_FLOOR_ROWS = 100
#: Simulated minutes the sweep alone gets after the load to bring every lag to 0.
_CATCH_UP_MAX_MIN = 240
_MINUTES_PER_DAY = 1_440
_TENANT = "soak"
# Commits that are not "beside the actor's own": the actor's own, and the set-up's.
_NOT_BESIDE = ("actor", "setup")
_EVENT_TYPE = "task.ready"


@dataclass(frozen=True, slots=True)
class SoakPlan:
    """What one soak sends, over how long, and how the deployment is sized."""

    events: int = 1_000_000
    days: int = 4
    projects: int = 64
    hot_share: float = 0.10
    changes_per_project: int = 2
    tasks_per_change: int = 8
    write_every_min: int = 5
    #: The sweep ticks on every fifth minute (the release sweeps: minutes 4, 9, 14 …, which
    #: visit all eight streams in turn) and at the daily maintenance minute. The minutes
    #: between would visit a stream the nudges already drained (drain mode is on at this
    #: sizing), and each tick costs tens of milliseconds whatever the volume: a day of
    #: every-minute ticks would cost the soak more than its events.
    sweep_every_min: int = 5
    sizing: int = 100_000_000
    retention_days: float = 1.0
    start: datetime = datetime(2027, 1, 4, tzinfo=UTC)

    def check(self) -> None:
        """Refuse a plan that cannot show what the soak is for, naming the value."""
        if self.projects < EVENT_STREAM_COUNT:
            raise ValueError(
                f"--projects {self.projects}: at least {EVENT_STREAM_COUNT}, one per stream"
            )
        if self.days < 3:
            raise ValueError(f"--days {self.days}: at least 3, to see day 3 against day 2")
        if not 0 < self.hot_share < 1:
            raise ValueError(f"--hot-share {self.hot_share}: a fraction between 0 and 1")
        if _MINUTES_PER_DAY % self.write_every_min:
            raise ValueError(
                f"--write-every-min {self.write_every_min}: must divide a day's 1,440 minutes"
            )
        if self.events < self.slots:
            raise ValueError(f"--events {self.events}: at least one per slot ({self.slots})")

    @property
    def slots(self) -> int:
        return self.days * _MINUTES_PER_DAY // self.write_every_min


@dataclass
class DayFigures:
    """A simulated day's end: rows per table, and per kind of file the bytes of its pages in
    use and of its WAL files."""

    day: int
    events_so_far: int
    rows: dict[str, int]
    used_bytes: dict[str, int]
    wal_bytes: dict[str, int]


@dataclass
class SoakResult:
    plan: SoakPlan
    events: int = 0
    wall_s: float = 0.0
    cpu_s_by_role: dict[str, float] = field(default_factory=dict)
    commits_by_role: dict[str, int] = field(default_factory=dict)
    nudges: int = 0
    alarm_fires: int = 0
    s3_puts: int = 0
    days: list[DayFigures] = field(default_factory=list)
    lost: int = 0
    unapplied: int = 0
    unarchived: int = 0
    archived_twice: int = 0
    dead_letters: int = 0
    lag_after: int = 0
    catch_up_minutes: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def commits_per_event(self) -> float:
        """SQLite commits per event of every role but the actor's own transaction (and the
        set-up's project roots)."""
        beside = sum(n for role, n in self.commits_by_role.items() if role not in _NOT_BESIDE)
        return beside / max(self.events, 1)

    def growth_after_day1(self) -> dict[str, float]:
        """For every table and kind of file, how far above its second day's figure a later
        day ended, as a fraction (0 when flat or falling)."""
        if len(self.days) < 3:
            return {}
        second, later = self.days[1], self.days[2:]
        growth: dict[str, float] = {}
        for name, base in second.rows.items():
            peak = max(day.rows.get(name, 0) for day in later)
            growth[f"rows {name}"] = max(0.0, (peak - base) / max(base, _FLAT_FLOOR_ROWS))
        for name, base_bytes in second.used_bytes.items():
            peak = max(day.used_bytes.get(name, 0) for day in later)
            growth[f"bytes {name}"] = max(0.0, (peak - base_bytes) / max(base_bytes, 1))
        for name in {n for day in later for n in day.rows} - set(second.rows):
            peak = max(day.rows.get(name, 0) for day in later)
            growth[f"rows {name}"] = peak / _FLAT_FLOOR_ROWS
        return growth

    def workload(self) -> Workload:
        """The cost model's workload, from what this run measured."""
        events = max(self.events, 1)
        # The Lambda roles: the actor's transaction runs in its caller (a workflow step), the
        # NATS nodes are the cluster's own line of the model.
        lambda_s = sum(
            s for role, s in self.cpu_s_by_role.items() if role in ("publisher", "router", "sweep")
        )
        return Workload(
            commits_per_event={
                role: n / events for role, n in self.commits_by_role.items() if role != "setup"
            },
            lambda_ms_per_event=lambda_s * 1_000 / events,
            lambda_invocations_per_event=(self.nudges + self.alarm_fires) / events,
            s3_puts_per_event=self.s3_puts / events,
        )

    def checks(self) -> dict[str, bool]:
        growth = self.growth_after_day1()
        return {
            "nothing lost": self.lost == 0,
            "every view applied every event": self.unapplied == 0,
            "archived once each": self.unarchived == 0 and self.archived_twice == 0,
            "no dead letter": self.dead_letters == 0,
            "lag 0 after the load": self.lag_after == 0,
            "flat from day 2": bool(growth) and max(growth.values()) <= FLAT_TOLERANCE,
            "no ceiling warning": not self.warnings,
        }

    def cheapest_at_1e8(self) -> CostBreakdown:
        """The USD per million events at 10⁸ a day in the cheaper EFS mode whose write IOPS
        one file system allows (Elastic, whose cap is far higher, when neither fits)."""
        costs = [cost_per_million(10**8, mode, self.workload()) for mode in EfsMode]
        fitting = [c for c in costs if c.efs_iops_fit] or costs[:1]
        return min(fitting, key=lambda c: c.total)

    def targets(self) -> dict[str, bool]:
        """The issue's targets: a million events in under 20 minutes, at most 0.5 commits per
        event beside the actor's own, at most $5 per million at 10⁸ a day."""
        return {
            f"{TARGET_EVENTS:,} events in under {TARGET_WALL_S / 60:.0f} minutes": (
                self.events >= TARGET_EVENTS and self.wall_s < TARGET_WALL_S
            ),
            f"commits per event beside the actor's own <= {TARGET_COMMITS_PER_EVENT}": (
                self.commits_per_event <= TARGET_COMMITS_PER_EVENT
            ),
            f"USD per million at 1e8 a day <= {TARGET_USD_PER_MILLION:g}": (
                self.cheapest_at_1e8().total <= TARGET_USD_PER_MILLION
            ),
        }


# --------------------------------------------------------------------------- the workload


def soak_settings(plan: SoakPlan, state_dir: Path, nats_url: str, s3_url: str) -> Settings:
    """The spec's defaults, sized for ``plan.sizing`` a day, retentions at ``retention_days``
    (and the windows the retention rule nests around them shortened with them)."""
    days = plan.retention_days
    return load_settings(
        state_dir=state_dir,
        nats_url=nats_url,
        s3_endpoint_url=s3_url,
        network_filesystem=False,
        expected_events_per_day=plan.sizing,
        event_stream_max_age_days=days,
        processed_events_retention_days=days,
        outbox_published_retention_days=days,
        event_metrics_retention_days=days,
        lag_metrics_retention_days=days,
        max_consumer_lag_s=min(3_600.0, days * 86_400 / 8),
        replay_window_days=days / 2,
    )


def soak_projects(count: int) -> list[str]:
    """``count`` project IDs, dealt over the eight streams in turn (the hot one first)."""
    from bench.router import _projects_on

    per_stream = math.ceil(count / EVENT_STREAM_COUNT)
    by_stream = [_projects_on(s, per_stream, "soak") for s in range(EVENT_STREAM_COUNT)]
    return [by_stream[i % EVENT_STREAM_COUNT][i // EVENT_STREAM_COUNT] for i in range(count)]


@dataclass(frozen=True, slots=True)
class _Fact:
    project: str
    change_id: str
    task_id: str
    key: str

    @property
    def event_id(self) -> str:
        return stable_event_id(self.change_id, _EVENT_TYPE, self.task_id, self.key)


def facts_of(plan: SoakPlan, projects: Sequence[str], first: int, last: int) -> list[_Fact]:
    """Events ``first`` … ``last - 1`` of the run: every ``1 / hot_share``-th on the hot
    project, the rest round-robin over the others; Changes and Tasks cycle, so the Tasks a
    project holds stay bounded while every event has its own key."""
    hot_every = round(1 / plan.hot_share)
    others = projects[1:]
    facts = []
    for n in range(first, last):
        project = projects[0] if n % hot_every == 0 else others[n % len(others)]
        change = n % plan.changes_per_project
        task = (n // plan.changes_per_project) % plan.tasks_per_change
        facts.append(_Fact(project, f"{project}-chg-{change}", f"t-{task}", f"n{n}"))
    return facts


def write_facts(app: Rhumbatron, facts: Sequence[_Fact]) -> int:
    """Commit ``facts``: one transaction per Change of the slot. Returns the transactions."""
    by_change: dict[tuple[str, str], list[_Fact]] = defaultdict(list)
    for fact in facts:
        by_change[(fact.project, fact.change_id)].append(fact)
    for (project, change_id), group in by_change.items():
        caller = Caller(_TENANT, "system:soak", f"corr-{change_id}")
        app.resource_shard(project, change_resource_key(change_id)).apply(
            caller,
            AppendChangeEvents(
                change_id=change_id,
                status="running",
                facts=tuple(
                    ChangeFact(_EVENT_TYPE, {"agent_role": "builder"}, task_id=f.task_id, key=f.key)
                    for f in group
                ),
            ),
        )
    return len(by_change)


# --------------------------------------------------------------------------- measuring


class _Roles:
    """Which role the run is in, and the CPU seconds and commits each role spent."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.role = "setup"
        self.cpu_s: defaultdict[str, float] = defaultdict(float)
        self.commits: Counter[str] = Counter()
        self.commits_by_file: Counter[tuple[str, str]] = Counter()
        self._kinds: dict[Path, str] = {}

    def on_commit(self, path: Path) -> None:
        self.commits[self.role] += 1
        kind = self._kinds.get(path)
        if kind is None:
            kind = self._kinds[path] = file_kind(path, self.state_dir)
        self.commits_by_file[(self.role, kind)] += 1

    @contextmanager
    def playing(self, role: str) -> Iterator[None]:
        before, cpu = self.role, time.process_time()
        self.role = role
        try:
            yield
        finally:
            self.cpu_s[role] += time.process_time() - cpu
            self.role = before


def table_figures(state_dir: Path) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Rows per ``kind.table`` over every SQLite file; per kind of file, the bytes its pages in
    use take (the WAL's included) and those of its WAL files (:mod:`rhumbatron.operator.
    inspect`). The files on disk lag the pages in use until a checkpoint, so the flat check
    reads the pages."""
    by_kind = totals(inspect_state(state_dir))
    return by_kind.rows, by_kind.used_bytes, by_kind.wal_bytes


# --------------------------------------------------------------------------- the run


async def _route(router: EventRouter, nudge: RecordingNudge) -> int:
    """Run the nudges the publisher sent, as the nudge function does: each stream in its
    nudge turn (:func:`~rhumbatron.router.nudge_turn.nudge_in_turn`: again while a run leaves
    records waiting, then its held records released). Returns the runs."""
    streams = sorted(set(nudge.nudged))
    nudge.nudged.clear()
    runs = 0
    for index in streams:
        turn = await nudge_in_turn(router, index, hold_s=router.settings.router_nudge_turn_s)
        runs += turn.runs
    return runs


async def _lag(router: EventRouter) -> int:
    return sum(lag.num_pending + lag.num_ack_pending for lag in await router.consumer_lags())


@contextmanager
def _schedule_fires_kept_two_days() -> Iterator[None]:
    """The sweep's tick facts remembered two days (their setting's least), not seven, for the
    run: a table that grows with time, not events, is then flat from the third day. (The
    schedule settings are read from the environment.)"""
    name = "RHUMBATRON_SCHEDULE_FIRE_RETENTION_DAYS"
    before = os.environ.get(name)
    os.environ[name] = "2"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


async def run_soak(
    plan: SoakPlan, root: Path, *, progress: ProgressCallback | None = None
) -> SoakResult:
    """Run ``plan`` on a fresh embedded stack under ``root``; see the module docstring."""
    from rhumbatron_dev.local.stack import LocalStack

    plan.check()
    result = SoakResult(plan)
    with _schedule_fires_kept_two_days(), LocalStack(root / "stack") as stack:
        assert stack.s3 is not None
        settings = soak_settings(plan, root / "state", stack.nats.url, stack.s3.endpoint_url)
        stack.s3.client().create_bucket(Bucket=settings.evidence_bucket)
        server_cpu = ServerCpu(stack.nats)
        clock = ManualClock(plan.start)
        nudge = RecordingNudge()
        app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink(), nudge=nudge)
        roles = _Roles(settings.state_dir)
        stop_observing = observe_commits(roles.on_commit)
        try:
            await _load(app, plan, clock, nudge, roles, result, server_cpu, progress)
            await _verify(app, plan, stack.s3.client(), result)
        finally:
            stop_observing()
            await app.close()
    return result


async def _load(
    app: Rhumbatron,
    plan: SoakPlan,
    clock: ManualClock,
    nudge: RecordingNudge,
    roles: _Roles,
    result: SoakResult,
    server_cpu: ServerCpu,
    progress: ProgressCallback | None,
) -> None:
    await app.ensure_streams()
    router = app.router()
    projects = soak_projects(plan.projects)
    for project in projects:
        app.project_root(project).create_project(
            Caller(_TENANT, "system:soak", f"corr-{project}"), name=project
        )
    started, server_before = time.perf_counter(), server_cpu.seconds()
    written = 0
    for slot in range(plan.slots):
        upto = plan.events * (slot + 1) // plan.slots
        with roles.playing("actor"):
            write_facts(app, facts_of(plan, projects, written, upto))
        written = upto
        with roles.playing("publisher"):
            result.alarm_fires += len(await app.drain_alarms())
        with roles.playing("router"):
            result.nudges += await _route(router, nudge)
        for _ in range(plan.write_every_min):
            await _minute(app, plan, clock, roles, result, nudge)
        minutes = (slot + 1) * plan.write_every_min
        if minutes % _MINUTES_PER_DAY == 0:
            day = minutes // _MINUTES_PER_DAY
            rows, used_bytes, wal_bytes = table_figures(app.settings.state_dir)
            result.days.append(DayFigures(day, written, rows, used_bytes, wal_bytes))
            if progress is not None:
                rate = written / (time.perf_counter() - started)
                note = f"soak: day {day} of {plan.days}, {written:,} events, {rate:,.0f} events/s"
                progress(written, plan.events, note)
        elif progress is not None:
            progress(written, plan.events)
    # After the load, the sweep alone (and the nudges its publishes send) brings the lag to 0.
    while await _lag(router) and result.catch_up_minutes < _CATCH_UP_MAX_MIN:
        await _minute(app, plan, clock, roles, result, nudge)
        result.catch_up_minutes += 1
    result.wall_s = time.perf_counter() - started
    result.events = written
    result.cpu_s_by_role = dict(roles.cpu_s)
    result.cpu_s_by_role["nats-server"] = server_cpu.seconds() - server_before
    result.commits_by_role = dict(roles.commits)
    result.lag_after = await _lag(router)


async def _minute(
    app: Rhumbatron,
    plan: SoakPlan,
    clock: ManualClock,
    roles: _Roles,
    result: SoakResult,
    nudge: RecordingNudge,
) -> None:
    """One simulated minute: on a sweep minute (every ``sweep_every_min``-th, and the daily
    maintenance minute) the alarm scan, then the sweep tick; then a minute on."""
    now = clock.now()
    minute_of_day = now.hour * 60 + now.minute
    every = plan.sweep_every_min
    if not (
        minute_of_day % every == every - 1
        or minute_of_day == app.settings.maintenance_minute_of_day
    ):
        clock.advance(minutes=1)
        return
    with roles.playing("publisher"):
        result.alarm_fires += len((await app.fire_due_alarms()).reports)
    with roles.playing("sweep"):
        tick = await app.sweep_tick(clock.now())
    result.warnings.extend(tick.router.warnings)
    if nudge.nudged:
        with roles.playing("router"):
            result.nudges += await _route(app.router(), nudge)
    clock.advance(minutes=1)


async def _verify(app: Rhumbatron, plan: SoakPlan, s3: Any, result: SoakResult) -> None:
    """Count what is missing: on the streams, in the views, in the archive; dead letters."""
    projects = soak_projects(plan.projects)
    expected = {f.event_id for f in facts_of(plan, projects, 0, result.events)}
    total = result.events + plan.projects  # and each project's project.created
    js = (await app.nats()).jetstream()
    stored = 0
    for index in range(EVENT_STREAM_COUNT):
        stored += (await js.stream_info(event_stream_name(index))).state.messages
    router = app.router()
    ours = set(projects)
    applied = others = 0
    for index in range(EVENT_STREAM_COUNT):
        connection = router.projector.views(index).connection
        for project, count in connection.execute(
            "SELECT project_id, events_applied FROM view_project"
        ):
            if project in ours:
                applied += count
            else:  # the clock project's schedule.fired, one per sweep tick
                others += count
    # The streams also carry the clock project's events, every one applied (lag is 0).
    result.lost = total - (stored - others)
    result.unapplied = total - applied
    seen: Counter[str] = Counter()
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=app.settings.evidence_bucket):
        for entry in page.get("Contents", []):
            result.s3_puts += 1
            body = s3.get_object(Bucket=app.settings.evidence_bucket, Key=entry["Key"])
            for line in gzip.decompress(body["Body"].read()).splitlines():
                seen[json.loads(line)["eventId"]] += 1
    created = len(seen.keys() - expected)  # the project.created events
    result.unarchived = len(expected - seen.keys()) + max(0, plan.projects - created)
    result.archived_twice = sum(1 for n in seen.values() if n > 1)
    result.dead_letters = sum(open_letter_counts(app.product().connection).values())


# --------------------------------------------------------------------------- the report


def format_result(result: SoakResult) -> str:
    events = max(result.events, 1)
    lines = [
        f"soak: {result.events:,} events over {result.plan.days} simulated days, "
        f"{result.plan.projects} projects on {EVENT_STREAM_COUNT} streams "
        f"(one hot at {result.plan.hot_share:.0%}), sized for {result.plan.sizing:,.0f} a day",
        f"sustained {result.events / result.wall_s:,.0f} events/s ({result.wall_s:,.0f} s), "
        f"lag 0 after {result.catch_up_minutes} simulated minutes of sweeps",
        "CPU µs per event by role: "
        + ", ".join(
            f"{r} {s * 1e6 / events:,.0f}" for r, s in sorted(result.cpu_s_by_role.items())
        ),
        "SQLite commits per event by role: "
        + ", ".join(f"{r} {n / events:.4f}" for r, n in sorted(result.commits_by_role.items())),
        f"commits per event beside the actor's own: {result.commits_per_event:.3f} (target <= 0.5)",
        f"S3 PUTs per 1,000 events: {result.s3_puts * 1000 / events:.1f}; nudges per 1,000: "
        f"{result.nudges * 1000 / events:.1f}; alarm fires per 1,000: "
        f"{result.alarm_fires * 1000 / events:.1f}",
    ]
    lines.append("rows by table at each day's end (tables with rows):")
    names = sorted({n for day in result.days for n, v in day.rows.items() if v})
    for name in names:
        lines.append(
            f"  {name:<40}" + "".join(f"{day.rows.get(name, 0):>12,}" for day in result.days)
        )
    lines.append("bytes by kind of file at each day's end (pages in use / WAL files):")
    for kind in sorted({k for day in result.days for k in day.used_bytes}):
        lines.append(
            f"  {kind:<40}"
            + "".join(
                f"{day.used_bytes.get(kind, 0):>12,}/{day.wal_bytes.get(kind, 0):,}"
                for day in result.days
            )
        )
    growth = result.growth_after_day1()
    if growth:
        worst = max(growth, key=lambda name: growth[name])
        lines.append(f"largest growth after day 1: {growth[worst]:.1%} ({worst})")
    workload = result.workload()
    for per_day in (10**6, 10**7, 10**8):
        costs = [cost_per_million(per_day, mode, workload) for mode in EfsMode]
        lines.append(
            f"USD per million events at {per_day:.0e} a day: "
            + ", ".join(
                f"{c.efs_mode} {c.total:.2f} (peak EFS write IOPS "
                f"{c.efs_write_iops_at_peak:,.0f}{'' if c.efs_iops_fit else ', too many'})"
                for c in costs
            )
        )
    lines.append(
        f"lost {result.lost}, unapplied {result.unapplied}, unarchived {result.unarchived}, "
        f"archived twice {result.archived_twice}, dead letters {result.dead_letters}, "
        f"lag after {result.lag_after}, ceiling warnings {len(result.warnings)}"
    )
    for warning in sorted(set(result.warnings)):
        lines.append(f"  warning: {warning}")
    for name, ok in result.checks().items():
        lines.append(f"{'PASS' if ok else 'FAIL'}: {name}")
    cheapest = result.cheapest_at_1e8()
    judged = result.events >= TARGET_EVENTS
    lines.append(
        f"targets (the cost in {cheapest.efs_mode} mode, ${cheapest.total:.2f} per million)"
        + (
            ""
            if judged
            else f"; not judged: {result.events:,} events, the targets' run is {TARGET_EVENTS:,}"
        )
        + ":"
    )
    for name, ok in result.targets().items():
        verdict = ("PASS" if ok else "FAIL") if judged else ("met" if ok else "missed")
        lines.append(f"{verdict}: {name}")
    return "\n".join(lines)


def results_json(result: SoakResult) -> dict[str, Any]:
    growth = result.growth_after_day1()
    at_1e8 = result.cheapest_at_1e8()
    return {
        "soak.events": result.events,
        "soak.lost": result.lost,
        "soak.unarchived": result.unarchived,
        "soak.max_table_growth_after_day1": round(max(growth.values(), default=0.0), 4),
        "soak.commits_per_event": round(result.commits_per_event, 4),
        "soak.usd_per_million_at_1e8": round(at_1e8.total, 2),
        "soak.usd_per_million_at_1e8_mode": str(at_1e8.efs_mode),
        "soak.usd_per_million_at_1e8_by_mode": {
            str(mode): round(cost_per_million(10**8, mode, result.workload()).total, 2)
            for mode in EfsMode
        },
        "soak.wall_s": round(result.wall_s, 1),
        "soak.targets": result.targets(),
        "soak.events_per_s": round(result.events / result.wall_s, 1),
        "soak.checks": result.checks(),
        "soak.plan": {k: str(v) for k, v in asdict(result.plan).items()},
        "soak.commits_by_role": result.commits_by_role,
        "soak.cpu_us_per_event_by_role": {
            r: round(s * 1e6 / max(result.events, 1), 1) for r, s in result.cpu_s_by_role.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.splitlines()[0]
    )
    defaults = SoakPlan()
    parser.add_argument("--events", type=int, default=defaults.events)
    parser.add_argument("--days", type=int, default=defaults.days)
    parser.add_argument("--projects", type=int, default=defaults.projects)
    parser.add_argument("--hot-share", type=float, default=defaults.hot_share)
    parser.add_argument("--write-every-min", type=int, default=defaults.write_every_min)
    parser.add_argument("--sizing", type=int, default=defaults.sizing)
    parser.add_argument("--retention-days", type=float, default=defaults.retention_days)
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    plan = SoakPlan(
        events=args.events,
        days=args.days,
        projects=args.projects,
        hot_share=args.hot_share,
        write_every_min=args.write_every_min,
        sizing=args.sizing,
        retention_days=args.retention_days,
    )
    try:
        plan.check()
    except ValueError as exc:
        parser.error(str(exc))
    with (
        tempfile.TemporaryDirectory(prefix="rhumbatron-soak-") as root,
        progress_on_stderr("soak", json_output=False, notes_off_terminal=True) as progress,
    ):
        result = asyncio.run(run_soak(plan, Path(root), progress=progress))
    print(format_result(result))
    args.out.write_text(json.dumps(results_json(result), indent=2, sort_keys=True) + "\n")
    # A shorter run is a partial soak: its checks count, its targets are only shown.
    judged = result.events >= TARGET_EVENTS
    passed = all(result.checks().values()) and (not judged or all(result.targets().values()))
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
