"""(f′) Commit-to-view latency with the roles in processes of their own, pinned apart.

The one-box latency run (:func:`bench.router.latency_run`) has the publisher and the router
share one process and event loop, as the local invoker runs them. In the cloud each is a
Lambda function with a CPU of its own. Here each role is a process pinned to its CPUs
(:func:`bench.pinning.pinned_layout`): the actors' writer, the publisher (its own runtime,
draining the alarms the writer announces to it directly, as the alarm invoke does), and the
router (this process: ``InProcessNudge`` → ``EventRouter.nudge``, started by the nudges the
publisher sends it, as the async nudge invoke does), with nats-server pinned too. The view
side is stamped as in the one-box run, by the view connections' trace callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.jetstream import BenchError, ServerCpu
from bench.pinning import CommitCounter, PinnedLayout, pin_process
from bench.router import (
    LatencyResult,
    _create_project_roots,
    _process_cpu_s,
    _stored_at,
    _ViewCommits,
    _writer_process,
    apply_what_is_left,
    latency_plan,
    latency_result,
)
from rhumbatron.core.heap import freeze_startup_heap
from rhumbatron.core.settings import load_settings
from rhumbatron.protocol.ids import stream_index
from rhumbatron.router.handlers import NoCausalRules
from rhumbatron.router.nudge import InProcessNudge
from rhumbatron.runtime.bootstrap import bootstrap

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

__all__ = ["pinned_latency_run"]


class _PipeNudge:
    """The publisher's nudge in the pinned run: the stream's index, sent to the router's
    process (the async invoke of the router-nudge function in the cloud)."""

    def __init__(self, to_router: Connection) -> None:
        self._to_router = to_router

    async def nudge(self, stream_index: int) -> None:
        self._to_router.send(("nudge", stream_index))


def _publisher_process(
    alarms_in: Connection,
    control: Connection,
    state_dir: Path,
    url: str,
    cpus: frozenset[int],
) -> None:
    """The publisher's process: pinned to ``cpus``, it drains every alarm the writer
    announces and nudges the router through ``control``."""
    pin_process(os.getpid(), cpus)
    asyncio.run(_publish_alarms(alarms_in, control, state_dir, url))


async def _publish_alarms(
    alarms_in: Connection, control: Connection, state_dir: Path, url: str
) -> None:
    """Fire alarms as they are announced. ``finish`` from the router's process: drain what is
    announced, then answer ``("finished", fires, commits)`` (counts since the last answer);
    ``exit``: stop."""
    settings = load_settings(state_dir=state_dir, nats_url=url, network_filesystem=False)
    app = bootstrap(settings, nudge=_PipeNudge(control))
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    commits = CommitCounter()
    commits.start()
    fires = 0
    finishing = exiting = warm = False

    def take_alarms() -> None:
        try:
            while alarms_in.poll():
                now = app.clock.now()
                for key in alarms_in.recv():
                    app.alarms.alarm_set(key, now)
                wake.set()
        except EOFError:  # the writer is done and gone
            loop.remove_reader(alarms_in.fileno())

    def take_control() -> None:
        nonlocal finishing, exiting
        try:
            message = control.recv()
        except EOFError:  # the router's process is gone: nothing left to publish for
            message = "exit"
            loop.remove_reader(control.fileno())
        take_alarms()  # what the writer sent before it reported done is all in the pipe
        if message == "finish":
            finishing = True
        elif message == "exit":
            exiting = True
        wake.set()

    loop.add_reader(alarms_in.fileno(), take_alarms)
    loop.add_reader(control.fileno(), take_control)
    try:
        while not exiting:
            await wake.wait()
            wake.clear()
            reports = await app.drain_alarms()
            fires += len(reports)
            unclean = [r for r in reports if r.failed or r.retry_wait or r.error or r.unavailable]
            if unclean:
                raise BenchError(f"the publisher did not publish cleanly: {unclean[0]}")
            if finishing and not wake.is_set():
                if not warm:  # the warm-up's writes are published: warm, as a container
                    freeze_startup_heap()
                    warm = True
                cpus = sorted(os.sched_getaffinity(0))
                control.send(("finished", fires, commits.counts.total(), cpus))
                fires, finishing = 0, False
                commits.counts.clear()
    finally:
        commits.stop()
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(alarms_in.fileno())
            loop.remove_reader(control.fileno())
        await app.close()


async def pinned_latency_run(
    url: str,
    state_dir: Path,
    *,
    rate: float,
    seconds: float,
    projects: int,
    layout: PinnedLayout,
    server_cpu: ServerCpu,
) -> LatencyResult:
    """The latency run of :func:`bench.router.latency_run` with the writer, the publisher,
    the router (this process) and nats-server each pinned as ``layout`` says. Every process
    is given back every CPU afterwards."""
    every_cpu = frozenset(os.sched_getaffinity(0))
    settings = load_settings(state_dir=state_dir, nats_url=url, network_filesystem=False)
    nudge = InProcessNudge()
    app = bootstrap(settings, nudge=nudge, causal_routing=NoCausalRules())
    loop = asyncio.get_running_loop()
    views = _ViewCommits()
    router_commits = CommitCounter()
    project_ids, warm, plan = latency_plan(rate, seconds, projects)
    committed_at: dict[str, float] = {}
    writer_commits: dict[str, int] = {}
    warmed: asyncio.Future[None] = loop.create_future()
    done: asyncio.Future[tuple[float, float]] = loop.create_future()
    finished: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    nudging: set[asyncio.Task[None]] = set()  # nudges being handed to InProcessNudge
    cpus_by_role: dict[str, tuple[int, ...]] = {}

    context = multiprocessing.get_context("spawn")
    from_writer, writer_end = context.Pipe()
    alarms_out, alarms_in = context.Pipe()
    to_publisher, publisher_end = context.Pipe()
    writer = context.Process(
        target=_writer_process,
        args=(writer_end, state_dir, url, warm, plan, rate, alarms_out, layout.writer),
        name="bench-latency-writer",
    )
    publisher = context.Process(
        target=_publisher_process,
        args=(alarms_in, publisher_end, state_dir, url, layout.publisher),
        name="bench-latency-publisher",
    )

    def on_writer() -> None:
        try:
            while from_writer.poll():
                message = from_writer.recv()
                if message[0] == "commit":
                    committed_at[message[1]] = message[2]
                elif message[0] == "warm-done":
                    warmed.set_result(None)
                elif message[0] == "done":
                    done.set_result((message[1], message[2]))
                    writer_commits.update(message[3])
                    cpus_by_role["writer (actors)"] = tuple(message[4])
        except EOFError:
            loop.remove_reader(from_writer.fileno())
            for future in (warmed, done):
                if not future.done():
                    future.set_exception(BenchError("the latency writer process died"))

    def on_publisher() -> None:
        try:
            while to_publisher.poll():
                message = to_publisher.recv()
                if message[0] == "nudge":
                    task = loop.create_task(nudge.nudge(message[1]))
                    nudging.add(task)
                    task.add_done_callback(nudging.discard)
                elif message[0] == "finished":
                    finished.put_nowait((message[1], message[2]))
                    cpus_by_role["publisher"] = tuple(message[3])
        except EOFError:
            loop.remove_reader(to_publisher.fileno())
            finished.put_nowait((-1, -1))

    async def finish_publishing() -> tuple[int, int]:
        """Every announced alarm fired and every nudge run ended: ``(fires, commits)``."""
        to_publisher.send("finish")
        fires, commits = await asyncio.wait_for(finished.get(), timeout=seconds * 10 + 60)
        if fires < 0:
            raise BenchError("the latency publisher process died")
        while nudging:  # nudges received before the answer reach InProcessNudge first
            await asyncio.gather(*nudging)
        await nudge.settle()
        return fires, commits

    def cpu_now() -> dict[str, float]:
        return {
            "router": time.process_time(),
            "publisher": _process_cpu_s(publisher.pid),
            "writer (actors)": _process_cpu_s(writer.pid),
            "nats-server": server_cpu.seconds(),
        }

    try:
        await app.ensure_streams()
        router = app.router()
        _create_project_roots(app, project_ids)
        for index in sorted({stream_index(p) for p in project_ids}):
            router.projector.views(index).connection.set_trace_callback(views.tracer())
        pin_process(os.getpid(), layout.router)
        if server_cpu.pid is not None:
            pin_process(server_cpu.pid, layout.nats_server)
        publisher.start()
        writer.start()
        for end in (writer_end, alarms_out, alarms_in, publisher_end):
            end.close()
        loop.add_reader(from_writer.fileno(), on_writer)
        loop.add_reader(to_publisher.fileno(), on_publisher)
        await asyncio.wait_for(warmed, timeout=60)
        await finish_publishing()  # the publisher's process froze its heap before answering
        freeze_startup_heap()  # and the router's process (this one) is warm now too
        committed_at.clear()
        runs_before = nudge.runs
        cpu_before = cpu_now()
        router_commits.start()
        from_writer.send("go")
        write_s, late_max = await asyncio.wait_for(done, timeout=seconds * 10 + 60)
        fires, publisher_commits = await finish_publishing()
        cpu_after = cpu_now()
        cpus_by_role["router"] = tuple(sorted(os.sched_getaffinity(0)))
        if server_cpu.pid is not None:
            cpus_by_role["nats-server"] = tuple(sorted(os.sched_getaffinity(server_cpu.pid)))
        commits = {
            "actors (writer)": writer_commits.get("all", 0),
            "publisher": publisher_commits,
            "router": router_commits.stop().get("all", 0),
        }
        applied_by_nudges = sum(1 for e in committed_at if e in views.committed_at)
        await apply_what_is_left(router, {stream_index(p) for p in project_ids})
        nudge_runs = nudge.runs - runs_before
        stored_at = await _stored_at(await app.nats(), {stream_index(p) for p in project_ids})
    finally:
        router_commits.stop()
        for connection in (from_writer, to_publisher):
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(connection.fileno())
        with contextlib.suppress(OSError):
            to_publisher.send("exit")
        for process in (writer, publisher):
            if process.pid is not None:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
        from_writer.close()
        to_publisher.close()
        pin_process(os.getpid(), every_cpu)
        if server_cpu.pid is not None:
            with contextlib.suppress(OSError):
                pin_process(server_cpu.pid, every_cpu)
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
        cpu_s={k: cpu_after[k] - cpu_before[k] for k in cpu_before},
        commits=commits,
        layout="pinned: " + layout.describe(),
        cpus_by_role=cpus_by_role,
    )
