"""``python -m bench.cluster_stall``: the write stall a stream leader's death causes.

A 3-node loopback JetStream cluster (R3, ``sync_interval: always``) takes a steady offered
load of events written to one actor and published by the every-minute scan, run back to back
as the local host runs it. Once the stream holds some events its leader is SIGKILLed. Printed,
per repeat:

* the re-election: from the kill until the stream names a new leader (a watcher polls
  ``stream_info`` every 20 ms);
* the write stall: the longest gap between two rows' PubAcks (``published_at``) from the
  kill on; the time during which nothing written reached the log;
* the attempts the publisher counted during it (0 is the rule: a log between leaders refuses
  nothing).

The stall can only be as short as the re-election plus one publish retry
(``publish_unavailable_retry_s``, 0.5 s); a stall much longer than that is attempts burnt or
backoffs waited. Every node runs the same ``nats-server`` binary on free loopback ports, in a
fresh temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.messaging.connection import connect_nats
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import start_cluster

PROJECT = "bench-stall"
CALLER = Caller("bench", "system:bench", correlation_id="bench-stall")


@dataclass(frozen=True, slots=True)
class StallResult:
    """One repeat: seconds from the kill to a new leader, the longest PubAck gap after the
    kill, and the attempts the publisher counted."""

    reelection_s: float
    stall_s: float
    attempts: int


async def _streams_ready(app: Rhumbatron, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await app.ensure_streams()
            return
        except Exception:  # no meta leader yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def one_repeat(root: Path, *, rate: int, seconds: float) -> StallResult:
    """Offer ``rate`` events a second for ``seconds``; kill the stream leader a third in."""
    nodes = start_cluster(root, cluster_name="rhumbatron-bench")
    settings = load_settings(
        state_dir=root / "state",
        nats_url=",".join(node.url for node in nodes),
        stream_replicas=3,
        require_durable_jetstream=False,
    )
    app = bootstrap(settings)
    try:
        await _streams_ready(app)
        shard = app.resource_shard(PROJECT, change_resource_key("chg-0"))
        stream = event_stream_name(stream_index(PROJECT))
        stop = asyncio.Event()

        async def write() -> None:
            n = 0
            started = time.monotonic()
            while not stop.is_set():
                due = started + n / rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                fact = ChangeFact("agent.woke", {"agentId": f"a-{n}"}, key=f"w-{n}")
                await asyncio.to_thread(
                    shard.apply,
                    CALLER,
                    AppendChangeEvents(change_id="chg-0", status="running", facts=(fact,)),
                )
                n += 1

        async def publish() -> None:
            while not stop.is_set():
                await app.fire_due_alarms()
                await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(write()), asyncio.create_task(publish())]
        await asyncio.sleep(seconds / 3)
        leader = (await (await app.nats()).jetstream().stream_info(stream)).cluster.leader  # type: ignore[union-attr]
        victim = next(node for node in nodes if node.name == leader)
        # The watcher talks to a node that lives: its own reconnect must not be measured.
        survivor = next(node for node in nodes if node is not victim)
        watcher = await connect_nats(
            settings.model_copy(update={"nats_url": survivor.url}), name="bench-watcher"
        )
        js = watcher.jetstream(timeout=0.25)
        killed_at = time.time()
        victim.kill()
        reelection_s = float("nan")
        while time.time() - killed_at < seconds:
            try:
                info = await js.stream_info(stream)
                if info.cluster is not None and info.cluster.leader not in (None, leader):
                    reelection_s = time.time() - killed_at
                    break
            except Exception:  # between leaders: the API does not answer
                pass
            await asyncio.sleep(0.02)
        await asyncio.sleep(max(0.0, seconds * 2 / 3 - (time.time() - killed_at)))
        stop.set()
        await asyncio.gather(*tasks)
        await app.fire_due_alarms()
        await watcher.close()
        rows = list(
            shard.connection.execute(
                "SELECT published_at, attempts FROM outbox WHERE published_at IS NOT NULL "
                "ORDER BY published_at"
            )
        )
        acks = [killed_at] + [r["published_at"] for r in rows if r["published_at"] >= killed_at]
        stall_s = max(b - a for a, b in itertools.pairwise(acks)) if len(acks) > 1 else 0
        attempts = sum(r[0] for r in shard.connection.execute("SELECT attempts FROM outbox"))
        return StallResult(reelection_s, stall_s, attempts)
    finally:
        await app.close()
        for node in nodes:
            node.stop()


async def main_async(repeats: int, rate: int, seconds: float) -> list[StallResult]:
    results = []
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory(prefix="rhumbatron-stall-") as tmp:
            result = await one_repeat(Path(tmp), rate=rate, seconds=seconds)
        print(
            f"repeat {repeat + 1}: re-election {result.reelection_s:.2f} s, "
            f"write stall {result.stall_s:.2f} s, attempts counted {result.attempts}",
            flush=True,
        )
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_stall", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=int, default=50, help="events offered per second")
    parser.add_argument("--seconds", type=float, default=24.0, help="length of one repeat")
    args = parser.parse_args()
    results = asyncio.run(main_async(args.repeats, args.rate, args.seconds))
    print(
        f"median: re-election {statistics.median(r.reelection_s for r in results):.2f} s, "
        f"write stall {statistics.median(r.stall_s for r in results):.2f} s, "
        f"attempts counted {sum(r.attempts for r in results)} in {len(results)} repeats"
    )


if __name__ == "__main__":
    main()
