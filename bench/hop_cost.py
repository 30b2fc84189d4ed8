"""``python -m bench.hop_cost [--events N]``: what one alarm fire and one nudge run cost, by
the number of events each carries.

One project root and one resource-shard actor on a real nats-server. For each ``k`` of
1, 2, 5, 10, 20 and 50, rounds of: ``k`` actor transactions (one ``task.ready`` each), one alarm
fire that publishes the ``k`` rows, one nudge run of the router that applies them (the
projector, then the causal router with no rules). Printed per event: the CPU of the writes,
of the fire and of the nudge run (this process and its threads, ``time.process_time``) and
the nats-server's CPU over the rounds (from ``/proc``). Then the CPU one thread hop costs
(``asyncio.to_thread`` of a no-op): each commit that runs off the event loop pays it.

This is the cost model behind the pipeline's CPU per event at 500 events/s
(``pipeline.cpu_ms_per_event``): under that load a fire carries about one row and a run about
one event, and the table shows what carrying more would save. Not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.ids import stream_index
from rhumbatron.router.event_router import EventRouter
from rhumbatron.router.handlers import NoCausalRules
from rhumbatron.router.reports import RunReport
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .jetstream import ServerCpu

CALLER = Caller("bench", "system:bench", correlation_id="bench-hop-cost")
EVENTS_PER_HOP = (1, 2, 5, 10, 20, 50)
_PROJECT = "hop-cost"


@dataclass(frozen=True)
class HopCost:
    """Microseconds of CPU per event with ``events_per_hop`` events in each fire and run."""

    events_per_hop: int
    write_us: float
    fire_us: float
    nudge_us: float
    server_us: float

    @property
    def total_us(self) -> float:
        return self.write_us + self.fire_us + self.nudge_us + self.server_us


async def measure(events: int) -> list[HopCost]:
    """The costs for each ``k`` of :data:`EVENTS_PER_HOP`, about ``events`` events each."""
    root = Path(tempfile.mkdtemp(prefix="rhumbatron-hop-cost-"))
    server = NatsServerProcess(store_dir=root / "nats")
    server.start()
    try:
        settings = load_settings(
            state_dir=root / "state", nats_url=server.url, network_filesystem=False
        )
        app = bootstrap(settings, alarms=RecordingAlarmSink(), causal_routing=NoCausalRules())
        try:
            return await _rounds(app, ServerCpu(server), events)
        finally:
            await app.close()
    finally:
        server.stop()


async def _rounds(app: Rhumbatron, server: ServerCpu, events: int) -> list[HopCost]:
    await app.ensure_streams()
    router = app.router()
    app.project_root(_PROJECT).create_project(CALLER, name="hop cost")
    shard = app.resource_shard(_PROJECT, change_resource_key("chg-1"))
    publisher = await app.publisher()
    stream = stream_index(_PROJECT)
    written = 0

    def write() -> None:
        nonlocal written
        written += 1
        fact = ChangeFact("task.ready", {"agent_role": "builder"}, task_id=f"t{written}")
        shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=(fact,)))

    for _ in range(20):  # warm: files, consumers and pull subscriptions open
        write()
        await publisher.fire_alarm(shard)
        await router.nudge(stream)
    costs: list[HopCost] = []
    for k in EVENTS_PER_HOP:
        rounds = max(events // k, 10)
        await _drain(router, stream)
        applied = 0
        write_s = fire_s = nudge_s = 0.0
        server_before = server.seconds()
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(k):
                write()
            write_s += time.process_time() - started
            started = time.process_time()
            fired = await publisher.fire_alarm(shard)
            fire_s += time.process_time() - started
            started = time.process_time()
            ran = await router.nudge(stream)
            nudge_s += time.process_time() - started
            if fired.published != k:
                raise RuntimeError(f"a round of {k} published {fired.published}")
            applied += _projected(ran)
        server_s = server.seconds() - server_before
        applied += await _drain(router, stream)  # an event a run missed, applied after
        if applied != rounds * k:
            raise RuntimeError(f"{rounds} rounds of {k} applied {applied} events")
        per_event = 1e6 / (rounds * k)
        costs.append(
            HopCost(
                k,
                write_s * per_event,
                fire_s * per_event,
                nudge_s * per_event,
                server_s * per_event,
            )
        )
    return costs


def _projected(run: RunReport) -> int:
    """Events the run's projector applied (the causal router counts its own)."""
    return run.subscriptions[Subscription.PROJECT_VIEW_PROJECTOR.value].applied


async def _drain(router: EventRouter, stream: int) -> int:
    """Nudge until a run applies nothing; how many it applied."""
    applied = 0
    while moved := _projected(await router.nudge(stream)):
        applied += moved
    return applied


def format_costs(costs: list[HopCost]) -> str:
    lines = ["events/hop  write  fire  nudge  nats-server  sum   (µs of CPU per event)"]
    lines += [
        f"{c.events_per_hop:>10} {c.write_us:>6.0f} {c.fire_us:>5.0f} {c.nudge_us:>6.0f} "
        f"{c.server_us:>12.0f} {c.total_us:>5.0f}"
        for c in costs
    ]
    return "\n".join(lines)


async def thread_hop_us(hops: int = 5_000) -> float:
    """Microseconds of CPU (both threads) one ``asyncio.to_thread`` of a no-op costs: what
    each commit run off the event loop pays on top of its own work."""
    started = time.process_time()
    for _ in range(hops):
        await asyncio.to_thread(int)
    return (time.process_time() - started) / hops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=600, help="events per row of the table")
    print(format_costs(asyncio.run(measure(parser.parse_args().events))))
    print(f"one thread hop (asyncio.to_thread of a no-op): {asyncio.run(thread_hop_us()):.0f} µs")


if __name__ == "__main__":
    main()
