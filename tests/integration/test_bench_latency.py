"""The latency benchmark's pinned run (issue #16, ``make bench``): its logic on a short run,
on the embedded nats-server. Figures are printed by the bench, not judged here."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from bench.jetstream import ServerCpu
from bench.pinned_latency import pinned_latency_run
from bench.pinning import pin_process, pinned_layout
from bench.router import LatencyResult, RouterSuite, _ViewCommits, build_router_workload

from rhumbatron.actors.row_statements import write_rows
from rhumbatron.router.projections import VIEW_SCHEMA
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration


def _allowed_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets of every thread of ``pid``, from ``/proc``."""
    found: set[frozenset[int]] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.add(frozenset(os.sched_getaffinity(int(task.name))))
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning apart needs two CPUs")
def test_pinning_a_process_pins_every_one_of_its_threads() -> None:
    # GIVEN a process running four threads
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, sys\n"
            "e = threading.Event()\n"
            "ts = [threading.Thread(target=e.wait) for _ in range(3)]\n"
            "[t.start() for t in ts]\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read(); e.set()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        # WHEN it is pinned to one CPU
        one = frozenset({min(os.sched_getaffinity(0))})
        pin_process(child.pid, one)
        # THEN every thread runs there, not only the one whose ID is the process's
        assert len(list(Path(f"/proc/{child.pid}/task").iterdir())) == 4
        assert _allowed_cpus(child.pid) == {one}
    finally:
        child.communicate("")


def test_the_layout_splits_the_write_side_from_the_read_side_and_needs_two_cpus() -> None:
    layout = pinned_layout(frozenset({3, 1, 2}))
    assert layout is not None
    assert layout.writer == layout.publisher == frozenset({1})
    assert layout.router == layout.nats_server == frozenset({2})
    assert pinned_layout(frozenset({0})) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning apart needs two CPUs")
async def test_the_pinned_run_times_every_event_to_its_view_and_counts_each_roles_commits(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    layout = pinned_layout()
    assert layout is not None
    every_cpu = _allowed_cpus(os.getpid())

    # WHEN 40 actor commits go through writer, publisher and router in their own processes
    result = await pinned_latency_run(
        nats_server.url,
        tmp_path / "state",
        rate=20.0,
        seconds=2.0,
        projects=4,
        layout=layout,
        server_cpu=ServerCpu(nats_server),
    )

    # THEN every event was timed from its actor's commit to its view's commit
    assert result.events == len(result.latencies_ms) == 40
    assert min(result.latencies_ms) > 0
    # AND each role's work was counted where it ran: one actor commit per event, the
    #   publisher's commits on the actor files, the router's on its view stores
    assert result.commits["actors (writer)"] == 40
    assert 0 < result.commits["publisher"] <= 40
    assert 0 < result.commits["router"] <= 40
    assert result.publish_fires > 0 and result.nudge_runs > 0
    assert set(result.cpu_s) == {"router", "publisher", "writer (actors)", "nats-server"}
    assert all(seconds > 0 for seconds in result.cpu_s.values())
    assert result.layout.startswith("pinned: ")
    # AND each role ran on its CPUs during the load, as its own process saw them
    assert result.cpus_by_role == {
        "writer (actors)": tuple(sorted(layout.writer)),
        "publisher": tuple(sorted(layout.publisher)),
        "router": tuple(sorted(layout.router)),
        "nats-server": tuple(sorted(layout.nats_server)),
    }
    # AND this process and nats-server have every CPU back
    assert _allowed_cpus(os.getpid()) == every_cpu
    server_pid = ServerCpu(nats_server).pid
    assert server_pid is not None
    assert _allowed_cpus(server_pid) == {frozenset(os.sched_getaffinity(0))}


def _run(target: float, offered: float, p99_ms: float) -> LatencyResult:
    events = int(target * 4)
    return LatencyResult(
        target_rate=target,
        events=events,
        write_s=events / offered,
        apply_s=events / offered,
        latencies_ms=tuple([1.0] * (events - events // 50) + [p99_ms] * (events // 50)),
        writer_late_max_ms=0.0,
        events_after_load=0,
        nudge_runs=events,
        publish_fires=events,
        projects=8,
    )


def test_the_knee_is_the_highest_rate_offered_in_full_within_the_p99() -> None:
    # GIVEN a sweep whose writer kept up to 500/s, and fell behind at 750 and 1,000
    suite = RouterSuite(workload=build_router_workload(projects=1, events_per_project=1))
    suite.knee = [
        _run(250, 250, 5.0),
        _run(500, 499, 40.0),
        _run(750, 707, 30.0),  # p99 within the target, but 750/s was never offered
        _run(1000, 717, 30.0),
    ]
    # THEN the runs that could not offer their rate count as no pass, and the knee is 500
    assert [r.status for r in suite.knee] == ["PASS", "PASS", "SHORT", "SHORT"]
    assert suite.knee_rate() == 500


def test_every_event_of_a_view_commit_is_timed_however_many_rows_one_statement_holds() -> None:
    # GIVEN the latency bench's tracer on a view connection
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(VIEW_SCHEMA)
    views = _ViewCommits()
    db.set_trace_callback(views.tracer())
    feed = (
        "INSERT INTO project_events (event_id, project_id, stream_seq, event_type, change_id, "
        "task_id, actor, occurred_at, applied_at_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    rows = [
        (
            f"evt-{n}",
            "prj-a",
            n,
            "task.ready",
            None,
            f"t{n}",
            "system:x",
            "2026-12-05T00:00:00Z",
            1.0,
        )
        for n in range(70)
    ]
    # WHEN a fetch's feed rows go as multi-row statements (64 + 4 + 2) and commit
    db.execute("BEGIN")
    write_rows(db, feed, rows)
    assert not views.committed_at  # nothing is timed before its COMMIT
    db.execute("COMMIT")
    # THEN each event has its commit time, and only those
    assert set(views.committed_at) == {f"evt-{n}" for n in range(70)}
