"""``python -m bench.reconcile_cost [--events N]``: what reconciliation costs per 10⁵ events.

One nats-server in a fresh temp dir; N events written to actor files (spread over 8 resource
shards of one project) and published; then ``Rhumbatron.reconcile`` over that project's
stream, 3 times. Printed: the events checked, the seconds and the requests (JetStream API
calls, fetches of 1,000 headers and monitoring reads) of each run, and both scaled to 10⁵
events. The publish is set up, not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.protocol.ids import stream_index
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

PROJECT = "bench-reconcile"
CALLER = Caller("bench", "system:bench", correlation_id="bench-reconcile")


async def measure(root: Path, events: int, repeats: int) -> None:
    server = NatsServerProcess(store_dir=root / "nats")
    server.start()
    settings = load_settings(
        state_dir=root / "state",
        nats_url=server.url,
        nats_monitor_urls=f"http://127.0.0.1:{server.http_port}",
    )
    app = bootstrap(settings)
    try:
        await app.ensure_streams()
        started = time.monotonic()
        for n in range(0, events, 500):
            shard = app.resource_shard(PROJECT, change_resource_key(f"chg-{n // 500 % 8}"))
            facts = tuple(
                ChangeFact("agent.woke", {"agentId": f"a-{i}"}, key=f"w-{i}")
                for i in range(n, min(n + 500, events))
            )
            shard.apply(
                CALLER,
                AppendChangeEvents(change_id=f"chg-{n // 500 % 8}", status="running", facts=facts),
            )
            await app.fire_due_alarms()
        print(f"set up {events} published events in {time.monotonic() - started:.1f} s", flush=True)
        seconds, requests = [], []
        for repeat in range(repeats):
            report = await app.reconcile([stream_index(PROJECT)])
            [stream] = report.streams
            assert stream.expected == events and not stream.has_gap, stream
            seconds.append(report.seconds)
            requests.append(report.requests)
            print(
                f"run {repeat + 1}: {stream.expected} events checked on "
                f"{len(stream.replicas)} replica(s) in {report.seconds:.2f} s, "
                f"{report.requests} requests",
                flush=True,
            )
        scale = 100_000 / events
        print(
            f"per 10^5 events and replica: {statistics.median(seconds) * scale:.2f} s, "
            f"{statistics.median(requests) * scale:.0f} requests (median of {repeats})"
        )
    finally:
        await app.close()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile_cost", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rhumbatron-reconcile-") as tmp:
        asyncio.run(measure(Path(tmp), args.events, args.repeats))


if __name__ == "__main__":
    main()
