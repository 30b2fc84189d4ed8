"""``python -m bench.run``: every Rhumbatron benchmark in one run, tables, ``results.json``.

(a) raw nats-py JetStream publish of the workload's envelopes, sequential and pipelined;
(b) ``OutboxPublisher.publish_due`` draining the same events from pre-filled actor outboxes;
(c) actor transactions against plain sqlite3 in WAL and DELETE journal modes;
(d) (a) and (b) again with nats-server at ``sync_interval: always``;
(e) the event router's project-view-projector draining one stream, against a raw nats-py
    fetch + ack consumer and a FastStream batch pull subscriber doing the same work;
(f) commit-to-view latency with the in-process nudge on, at a steady offered load;
(g) the command queues' runtime against a raw fetch + ack consumer (``bench/commands.py``);
(h) cold starts: each Lambda function's handler module imported in a fresh interpreter, against
    its limit (``bench/cold_start.py``), run first, before any nats-server starts.

Each nats-server runs in a fresh temp dir on free loopback ports. Every measurement is warmed
up, then repeated with the kinds interleaved (their order rotates each repeat); a figure is
the median of its repeats, a ratio the median of its per-repeat ratios. When the
default-sync publish target is missed, one extra ``publish_due`` run is profiled.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cold_start import ColdStartOptions, cold_start_suite, format_cold_starts
from bench.commands import CommandOptions, command_suite
from bench.jetstream import (
    BenchError,
    RunResult,
    ServerCpu,
    measure,
    publish_due_run,
    raw_pipelined,
    raw_sequential,
    reset_streams,
    run_settings,
    stored_events,
)
from bench.machine import machine_info
from bench.profiling import format_rows, top_rows
from bench.report import Figure, Ratio, format_figures, format_ratios
from bench.router import RouterOptions, format_latency, router_ratios, router_suite
from bench.transactions import ActorWriter, PlainWriter, sample_envelope
from bench.workload import Workload, build_workload
from rhumbatron.messaging.connection import connect_nats
from rhumbatron_dev.local.nats_server import NatsServerProcess

RESULTS_PATH = Path(__file__).with_name("results.json")

#: Target floors on the issue's 2-core machine.
TARGET_DUE_VS_PIPELINED_DEFAULT = 0.7
TARGET_DUE_VS_PIPELINED_ALWAYS = 1.5
TARGET_ACTOR_VS_PLAIN = 0.5

#: The two server configurations: label → nats-server ``sync_interval``.
SYNC_INTERVALS = {"sync_default": "2m", "sync_always": "always"}

_DESCRIPTIONS = {
    "raw_sequential": "(a) raw nats-py js.publish with Nats-Msg-Id, each PubAck awaited",
    "raw_pipelined": "(a) raw nats-py js.publish_async with Nats-Msg-Id, acks awaited per window",
    "publish_due": (
        "(b) the system's drain: Rhumbatron.drain_alarms -> fire_alarm -> publish_due, "
        "package defaults (100 rows per project, 16 actors at once, publish_batch_mode auto: "
        "fast batches at a periodic sync, atomic where the deployment syncs always)"
    ),
    "publish_due_serial": "(b') the same drain with publish_concurrency=1 (one actor at a time)",
    "publish_due_rows1000": "(b'') the same drain with publish_max_rows_per_project=1000",
    "publish_due_atomic": "(b3) the same drain with publish_batch_mode=atomic",
    "publish_due_fast": "(b4) the same drain with publish_batch_mode=fast",
}

#: What ``publish_batch_mode: auto`` resolves to for each server configuration: periodic
#: sync is the local default (fast batches); ``sync_interval: always`` is what the cloud's
#: RHUMBATRON_REQUIRE_DURABLE_JETSTREAM demands, and there auto picks atomic batches. A
#: single bench server cannot be the 3-replica cluster that setting also checks, so the
#: choice is passed as the setting instead.
AUTO_BATCH_MODE = {"sync_default": "fast", "sync_always": "atomic"}
_MODE_OF_KIND = {"publish_due_atomic": "atomic", "publish_due_fast": "fast"}


@dataclass(frozen=True, slots=True)
class Options:
    """The run's knobs (command-line flags)."""

    repeats: int
    projects: int
    actors_per_project: int
    events_per_actor: int
    window: int
    transactions: int
    ack_timeout_s: float
    profile: bool
    router: RouterOptions


@dataclass
class Suite:
    """What one part of the run produced."""

    figures: list[Figure] = field(default_factory=list)
    diagnostics: list[Figure] = field(default_factory=list)
    profile: list[dict[str, Any]] = field(default_factory=list)
    profile_text: str = ""


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _rotated(items: Sequence[str], by: int) -> list[str]:
    """``items`` rotated: each repeat runs the kinds in a different order (no position bias)."""
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


async def _publish_suite(
    label: str, root: Path, workload: Workload, warmup: Workload, options: Options
) -> Suite:
    """(a) and (b) against one fresh nats-server with the label's ``sync_interval``."""
    sync_interval = SYNC_INTERVALS[label]
    server = NatsServerProcess(store_dir=root / f"nats-{label}", sync_interval=sync_interval)
    server.start()
    suite = Suite()
    try:
        settings = run_settings(root / f"unused-{label}", server.url)
        nc = await connect_nats(settings, name=f"bench-{label}")
        js = nc.jetstream(timeout=options.ack_timeout_s)
        cpu = ServerCpu(server)
        timeout = options.ack_timeout_s

        def raw(kind: str, wl: Workload) -> Callable[[], Awaitable[float | None]]:
            async def run() -> None:
                if kind == "raw_sequential":
                    await raw_sequential(js, wl.messages, ack_timeout_s=timeout)
                else:
                    await raw_pipelined(
                        js, wl.messages, window=options.window, ack_timeout_s=timeout
                    )

            return run

        async def one(kind: str, wl: Workload, tag: str) -> RunResult:
            await reset_streams(nc, settings)
            if kind.startswith("raw_"):
                result = await measure(wl.events, cpu, raw(kind, wl))
            else:
                result = await publish_due_run(
                    nc,
                    server.url,
                    wl,
                    root / f"state-{label}-{tag}",
                    cpu,
                    concurrency=1 if kind == "publish_due_serial" else None,
                    rows_per_project=1000 if kind == "publish_due_rows1000" else 100,
                    batch_mode=_MODE_OF_KIND.get(kind, AUTO_BATCH_MODE[label]),
                )
            stored = await stored_events(nc)
            if stored != wl.events:
                raise BenchError(f"{kind}: the streams hold {stored} of {wl.events} events")
            return result

        _log(f"sync_interval={sync_interval}: warm-up on {warmup.events} other events")
        for kind in _DESCRIPTIONS:
            await one(kind, warmup, f"warm-{kind}")

        results: dict[str, list[RunResult]] = {kind: [] for kind in _DESCRIPTIONS}
        for rep in range(options.repeats):
            for kind in _rotated(list(_DESCRIPTIONS), rep):
                result = await one(kind, workload, f"{kind}-{rep}")
                results[kind].append(result)
                _log(
                    f"sync_interval={sync_interval} {kind} #{rep + 1}: "
                    f"{result.events_per_s:,.0f} events/s"
                )

        due = statistics.median(
            n.events_per_s / d.events_per_s
            for n, d in zip(results["publish_due"], results["raw_pipelined"], strict=True)
        )
        if label == "sync_default" and (options.profile or due < TARGET_DUE_VS_PIPELINED_DEFAULT):
            _log("profiling one more publish_due run (cProfile)")
            profile = cProfile.Profile()
            await reset_streams(nc, settings)
            profiled = await publish_due_run(
                nc,
                server.url,
                workload,
                root / f"state-{label}-profile",
                cpu,
                batch_mode=AUTO_BATCH_MODE[label],
                profile=profile,
            )
            suite.profile = top_rows(profile, profiled.wall_s)
            suite.profile_text = format_rows(suite.profile, profiled.wall_s)
        await nc.drain()
    finally:
        server.stop()

    for kind, runs in results.items():
        where = f"nats-server sync_interval={sync_interval}"
        suite.figures.append(
            Figure(
                f"{label}.{kind}",
                "events/s",
                f"{_DESCRIPTIONS[kind]}; {where}",
                tuple(r.events_per_s for r in runs),
            )
        )
        suite.diagnostics += [
            Figure(
                f"{label}.{kind}.client_cpu",
                "us/event",
                f"CPU time of the benchmark process per event ({kind}; {where})",
                tuple(r.client_cpu_s / r.events * 1e6 for r in runs),
            ),
            Figure(
                f"{label}.{kind}.server_cpu",
                "us/event",
                f"CPU time of nats-server per event ({kind}; {where})",
                tuple(r.server_cpu_s / r.events * 1e6 for r in runs),
            ),
        ]
        if kind.startswith("publish_due") and kind != "publish_due_serial":  # a share
            suite.diagnostics.append(
                Figure(
                    f"{label}.{kind}.in_sender",
                    "% wall",
                    "share of publish_due wall time spent inside JetStreamSender "
                    f"(encoding, network, server, ack); {where}",
                    tuple(100 * (r.sender_s or 0.0) / r.wall_s for r in runs),
                )
            )
    return suite


def _transaction_suite(root: Path, options: Options) -> Suite:
    """(c) actor transactions and plain sqlite3 transactions, per journal mode."""
    envelope = sample_envelope(root / "sqlite-sample")
    suite = Suite()
    what = {
        "actor": "(c) ResourceShard.append_change_events: 1 state row + 1 outbox row",
        "plain": "(c) plain sqlite3: the same upsert + outbox INSERT in one transaction",
    }
    for mode in ("WAL", "DELETE"):
        actor = ActorWriter(root / f"sqlite-actor-{mode}", mode)
        plain = PlainWriter(root / f"sqlite-plain-{mode}" / "plain.sqlite", mode, envelope)
        writers: dict[str, ActorWriter | PlainWriter] = {"actor": actor, "plain": plain}
        samples: dict[str, list[float]] = {"actor": [], "plain": []}
        cpu: dict[str, list[float]] = {"actor": [], "plain": []}
        try:
            for writer in writers.values():
                writer.run("warm", max(options.transactions // 10, 50))
            for rep in range(options.repeats):
                for name in _rotated(list(writers), rep):
                    cpu0 = time.process_time()
                    elapsed = writers[name].run(f"r{rep}", options.transactions)
                    cpu[name].append((time.process_time() - cpu0) / options.transactions * 1e6)
                    rate = options.transactions / elapsed
                    samples[name].append(rate)
                    _log(f"journal_mode={mode} {name} #{rep + 1}: {rate:,.0f} transactions/s")
        finally:
            actor.close()
            plain.close()
        for name in writers:
            suite.figures.append(
                Figure(
                    f"{mode.lower()}.{name}_txn",
                    "txn/s",
                    f"{what[name]}; journal_mode={mode}, synchronous=FULL",
                    tuple(samples[name]),
                )
            )
            suite.diagnostics.append(
                Figure(
                    f"{mode.lower()}.{name}_txn.client_cpu",
                    "us/txn",
                    f"CPU time per transaction ({name}; journal_mode={mode})",
                    tuple(cpu[name]),
                )
            )
    return suite


def _ratios(figures: Sequence[Figure]) -> list[Ratio]:
    by_name = {f.name: f for f in figures}
    ratios: list[Ratio] = []
    for label, target in (
        ("sync_default", TARGET_DUE_VS_PIPELINED_DEFAULT),
        ("sync_always", TARGET_DUE_VS_PIPELINED_ALWAYS),
    ):
        due = by_name[f"{label}.publish_due"]
        ratios += [
            Ratio(
                f"{label}.publish_due/raw_pipelined",
                due,
                by_name[f"{label}.raw_pipelined"],
                target,
            ),
            Ratio(f"{label}.publish_due/raw_sequential", due, by_name[f"{label}.raw_sequential"]),
            *(
                Ratio(
                    f"{label}.{variant}/raw_pipelined",
                    by_name[f"{label}.{variant}"],
                    by_name[f"{label}.raw_pipelined"],
                )
                for variant in (
                    "publish_due_serial",
                    "publish_due_rows1000",
                    "publish_due_atomic",
                    "publish_due_fast",
                )
            ),
        ]
    for mode in ("wal", "delete"):
        ratios.append(
            Ratio(
                f"{mode}.actor_txn/plain_txn",
                by_name[f"{mode}.actor_txn"],
                by_name[f"{mode}.plain_txn"],
                TARGET_ACTOR_VS_PLAIN,
            )
        )
    return ratios


async def _main(options: Options, command: str) -> int:
    started = time.perf_counter()
    load_before = os.getloadavg()
    suites: list[Suite] = []
    with tempfile.TemporaryDirectory(prefix="rhumbatron-bench-") as tmp:
        root = Path(tmp)
        machine = machine_info(root)
        # First, on a machine no benchmark server loads yet: these are subprocess timings.
        cold = cold_start_suite(ColdStartOptions(repeats=options.repeats), root / "cold", _log)
        suites.append(Suite(figures=cold.figures, diagnostics=cold.diagnostics))
        _log(
            f"filling {options.projects} projects x {options.actors_per_project} actors x "
            f"{options.events_per_actor} events through actor transactions"
        )
        workload = build_workload(
            root / "template",
            projects=options.projects,
            actors_per_project=options.actors_per_project,
            events_per_actor=options.events_per_actor,
        )
        warmup = build_workload(
            root / "warmup-template",
            projects=4,
            actors_per_project=1,
            events_per_actor=max(options.events_per_actor // 4, 50),
            prefix="warm",
        )
        for label in SYNC_INTERVALS:
            suites.append(await _publish_suite(label, root, workload, warmup, options))
        suites.append(_transaction_suite(root, options))
        router = await router_suite(root, options.router, _log)
        suites.append(Suite(figures=router.figures, diagnostics=router.diagnostics))
        commands = await command_suite(
            CommandOptions(
                commands=10_000, repeats=options.repeats, queue="integration", warmup=1_000
            ),
            root / "commands",
            _log,
        )
        suites.append(Suite(figures=list(commands.figures), diagnostics=list(commands.diagnostics)))
    figures = [f for s in suites for f in s.figures]
    diagnostics = [f for s in suites for f in s.diagnostics]
    profile = next((s for s in suites if s.profile), None)
    ratios = [*_ratios(figures), *router_ratios(figures), *commands.ratios]
    elapsed = time.perf_counter() - started
    machine["loadavg_before"] = [round(x, 2) for x in load_before]
    machine["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]

    print(format_figures("figure", figures))
    print()
    print(format_ratios(ratios))
    print()
    for latency in [
        *([router.latency] if router.latency is not None else []),
        *(p for p in router.pinned if p.target_rate == options.router.latency_rate),
    ]:
        print(format_latency(latency))
        print()
    targets = router.targets()
    for target in targets:
        bound = (
            f">= {target['target_at_least']:g}"
            if "target_at_least" in target
            else f"<= {target['target_at_most']:g}"
        )
        print(f"{target['name']:<42}  {target['value']!s:>9}  {bound:<9}  {target['status']}")
    print()
    print(format_cold_starts(cold))
    print()
    print(format_figures("diagnostic", diagnostics))
    if profile is not None:
        print()
        print(profile.profile_text)
    print(
        f"\nworkload: {workload.describe()}\n"
        f"router workload: {router.workload.describe()}\n"
        f"machine: nproc={machine['nproc']}, {machine['cpu_model']}, python {machine['python']}, "
        f"nats-py {machine['nats_py']}, {machine['nats_server']}, sqlite {machine['sqlite']}, "
        f"load average before/after {machine['loadavg_before']} / {machine['loadavg_after']}\n"
        f"command: {command}  (from the repository root; `make bench`)  took {elapsed:.0f} s"
    )
    results = {
        "command": command,
        "make_target": "make bench",
        "elapsed_s": round(elapsed, 1),
        "machine": machine,
        "workload": workload.describe(),
        "options": {
            "repeats": options.repeats,
            "pipeline_window": options.window,
            "transactions_per_repeat": options.transactions,
            "ack_timeout_s": options.ack_timeout_s,
            "nats_sync_intervals": SYNC_INTERVALS,
            "router_repeats": options.router.repeats,
            "latency_rate_events_per_s": options.router.latency_rate,
            "latency_s": options.router.latency_s,
            "latency_projects": options.router.latency_projects,
            "latency_knee_rates": list(options.router.knee_rates),
            "latency_knee_s": options.router.knee_s,
            "router_wide_projects": options.router.wide_projects,
        },
        "router_workload": router.workload.describe(),
        "router_latency": router.latency.as_json() if router.latency is not None else None,
        "router_latency_knee": [k.as_json() for k in router.knee],
        "router_latency_pinned": [k.as_json() for k in router.pinned],
        "router_wide_workload": router.wide.describe() if router.wide is not None else None,
        "targets": targets,
        "cold_starts": cold.as_json(),
        "figures": [f.as_json() for f in figures],
        "ratios": [r.as_json() for r in ratios],
        "diagnostics": [f.as_json() for f in diagnostics],
        "publish_due_profile": profile.profile if profile is not None else [],
    }
    RESULTS_PATH.write_text(json.dumps(results, indent=2) + "\n")
    _log(f"wrote {RESULTS_PATH}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, run every benchmark, print the tables, write ``bench/results.json``."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per figure")
    parser.add_argument("--projects", type=int, default=8)
    parser.add_argument("--actors-per-project", type=int, default=2)
    parser.add_argument("--events-per-actor", type=int, default=750)
    parser.add_argument("--window", type=int, default=100, help="publish_async ack window")
    parser.add_argument("--transactions", type=int, default=2000, help="per repeat and mode")
    parser.add_argument("--ack-timeout-s", type=float, default=10.0)
    parser.add_argument(
        "--profile", action="store_true", help="profile a publish_due run even on PASS"
    )
    parser.add_argument("--router-projects", type=int, default=10, help="projects on EVENTS_00")
    parser.add_argument("--router-events-per-project", type=int, default=1000)
    parser.add_argument("--latency-rate", type=float, default=500.0, help="offered events/s")
    parser.add_argument("--latency-s", type=float, default=10.0, help="seconds of paced load")
    parser.add_argument("--latency-projects", type=int, default=8)
    parser.add_argument(
        "--latency-knee-rates",
        type=float,
        nargs="*",
        default=[100.0, 250.0, 750.0, 1000.0],
        help="the rate sweep's other offered rates, each run for 4 s after the main one",
    )
    parser.add_argument(
        "--router-wide-projects",
        type=int,
        default=50,
        help="projects on EVENTS_00 for the projector's second ratio",
    )
    args = parser.parse_args(argv)
    options = Options(
        repeats=args.repeats,
        projects=args.projects,
        actors_per_project=args.actors_per_project,
        events_per_actor=args.events_per_actor,
        window=args.window,
        transactions=args.transactions,
        ack_timeout_s=args.ack_timeout_s,
        profile=args.profile,
        router=RouterOptions(
            repeats=args.repeats,
            projects=args.router_projects,
            events_per_project=args.router_events_per_project,
            latency_rate=args.latency_rate,
            latency_s=args.latency_s,
            latency_projects=args.latency_projects,
            knee_rates=tuple(args.latency_knee_rates),
            wide_projects=args.router_wide_projects,
        ),
    )
    given = list(argv) if argv is not None else sys.argv[1:]
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *given])
    return asyncio.run(_main(options, command))


if __name__ == "__main__":
    raise SystemExit(main())
