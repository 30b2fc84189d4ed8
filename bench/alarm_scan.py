"""``python -m bench.alarm_scan [--actors N] [--due K]``: what the every-minute scan costs.

N project-root actor files in a fresh state directory, all published once; then K of them
write again, and the scan runs two ways on the same files in the same run:

* **full walk**: every actor file opened to read its alarm (the scan before the due-actor
  index, and the index's daily walk);
* **indexed**: the due-actor index listed, only its due actors opened.

Printed per way: the wall and CPU milliseconds of one scan (median of the repeats), the actor
files it opened, and the ratio full walk / indexed. Sending goes to an in-memory sender: the
point is what finding the work costs, not publishing it.

Then the sweep's outbox backlog gauge, the same two ways, with K actors holding a pending row:
every actor file read (``every_actor=True``, the gauge before) and the index's marked actors.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.testing import MemorySender

CALLER = Caller("bench", "system:bench", correlation_id="bench-alarm-scan")


def _write(app: Rhumbatron, projects: list[str]) -> None:
    """One promotion in each of ``projects``: a pending row and an alarm each."""
    for project in projects:
        root = app.project_root(project)
        state = root.state()
        assert state is not None
        root.promote(
            CALLER,
            candidate_id=f"c-{len(root.promoted_candidate_ids())}",
            artifact_id="a",
            expected_generation=state.canonical_generation,
        )


async def one_scan(
    app: Rhumbatron, clock: ManualClock, due: list[str], *, full: bool
) -> tuple[float, float, int]:
    _write(app, due)
    await app.close()  # a fresh container: nothing open
    if full:
        (app.settings.state_dir / "alarms" / ".complete").unlink()
    clock.advance(minutes=1)
    wall, cpu = time.perf_counter(), time.process_time()
    scan = await app.fire_due_alarms()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert sum(r.published for r in scan.reports) >= len(due), scan
    return wall * 1e3, cpu * 1e3, scan.actors_visited


async def measure(root: Path, actors: int, due: int, repeats: int) -> None:
    clock = ManualClock()
    settings = load_settings(state_dir=root / "state", nats_url="nats://127.0.0.1:1")
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink(), sender=MemorySender())
    projects = [f"p-{i:05d}" for i in range(actors)]
    started = time.monotonic()
    for project in projects:
        app.project_root(project).create_project(CALLER, name=project)
    await app.close()
    await app.fire_due_alarms()
    print(f"set up {actors} actor files in {time.monotonic() - started:.1f} s", flush=True)
    results: dict[str, list[tuple[float, float, int]]] = {"full walk": [], "indexed": []}
    for repeat in range(repeats):
        writers = projects[repeat * due : (repeat + 1) * due]
        results["full walk"].append(await one_scan(app, clock, writers, full=True))
        writers = projects[-(repeat + 1) * due : len(projects) - repeat * due]
        results["indexed"].append(await one_scan(app, clock, writers, full=False))
    gauge = await _gauge(app, clock, projects[repeats * due : (repeats + 1) * due], repeats)
    await app.close()
    medians = {}
    for way, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        medians[way] = wall
        print(f"{way:>9}: {wall:8.1f} ms wall, {cpu:8.1f} ms CPU, {runs[0][2]} actor files opened")
    print(
        f"full walk / indexed: {medians['full walk'] / medians['indexed']:.1f}x "
        f"({actors} actor files, {due} with due work)"
    )
    for way, (wall, cpu) in gauge.items():
        print(f"backlog gauge, {way:>9}: {wall:8.1f} ms wall, {cpu:8.1f} ms CPU")
    print(
        f"backlog gauge, every file / indexed: {gauge['every file'][0] / gauge['indexed'][0]:.1f}x"
    )


async def _gauge(
    app: Rhumbatron, clock: ManualClock, pending: list[str], repeats: int
) -> dict[str, tuple[float, float]]:
    """The backlog gauge's median wall and CPU ms, reading every file and the index, with a
    pending row in each of ``pending`` (written, not published)."""
    _write(app, pending)
    await app.close()
    medians: dict[str, tuple[float, float]] = {}
    pending_seen: set[int] = set()
    for way, every in (("every file", True), ("indexed", False)):
        runs = []
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            backlog = app.outbox_backlog(every_actor=every)
            runs.append(((time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3))
            pending_seen.add(backlog["pending"])
        medians[way] = (
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
        )
    # A promotion writes two events: both ways must count the same pending rows.
    assert len(pending_seen) == 1 and pending_seen.pop() >= len(pending), pending_seen
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=2_000)
    parser.add_argument("--due", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-alarm-scan-") as root:
        asyncio.run(measure(Path(root), args.actors, args.due, args.repeats))


if __name__ == "__main__":
    main()
