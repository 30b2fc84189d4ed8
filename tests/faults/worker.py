"""Fault-test helpers, and a worker script the tests run as a separate process.

Run as ``python tests/faults/worker.py <command> ...`` with ``RHUMBATRON_*`` in the
environment (state dir, NATS URL, ``RHUMBATRON_CRASH_AT``). A crash point kills the worker
with ``os._exit(137)``: no cleanup, like a power cut of that one process.

Commands:

* ``publish <actor_key> [rounds]``: run ``publish_due`` on the actor up to ``rounds`` times
  (stopping once nothing is pending), print one JSON line per report.
* ``claim <project_id> <resource>``: acquire a claim on ``resource`` (one actor transaction).
* ``route <mode> [args] [--routed-log=PATH] [--gate]``: bootstrap a router from the
  environment and run it once, printing one JSON line (the run's report). Modes: ``consume
  <stream> <subscription>`` (one subscription's consume, as a nudge or sweep runs it),
  ``nudge <stream>``, ``sweep <ISO-8601 UTC minute>``, ``drain``. With ``--routed-log`` the
  causal rules append every Event ID they route to that file (see :class:`RoutedLog`). With
  ``--gate`` the worker connects, prints ``{"ready": true}`` and waits for a line on stdin
  before it runs: a test starts several and releases them at once (see
  :func:`release_gated`).
* ``commands <queue> --dir=PATH [--block=ID,ID] [--fail] [--until-empty]``: bootstrap the
  queue runtime from the environment and poll ``queue`` once (``--until-empty``: again until
  its consumer has nothing pending or unacknowledged), printing one JSON line per poll. The
  handler is :class:`CommandEffects` on ``PATH``; ``--block`` makes the handler of those
  command IDs print ``{"blocked": id}`` and wait for ever (the test kills the worker), and
  ``--fail`` makes every delivery fail.

Imported by the tests (``from .worker import ...``) for the helpers below.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rhumbatron.actors.actor import Actor, ActorRef
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.shard_commands import AcquireClaim, AppendChangeEvents
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.queue_consumer import Delivery
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.protocol.queue_consumers import consumer_name
from rhumbatron.router.handlers import RunContext
from rhumbatron.router.records import APPLIED, RecordOutcome
from rhumbatron.runtime.bootstrap import bootstrap

WORKER = Path(__file__).resolve()
CALLER = Caller("tenant-faults", "system:fault-test", "corr-faults")


# --------------------------------------------------------------------------- helpers


def write_change_events(
    shard: ResourceShard, change_id: str, count: int, *, start: int = 0, chunk: int = 50
) -> list[str]:
    """Append ``count`` agent.woke facts to ``change_id``; return their IDs in outbox order."""
    ids: list[str] = []
    for first in range(start, start + count, chunk):
        last = min(first + chunk, start + count)
        facts = tuple(
            ChangeFact("agent.woke", {"agentId": f"agent-{i}"}, key=f"wake-{i}")
            for i in range(first, last)
        )
        result = shard.apply(
            CALLER, AppendChangeEvents(change_id=change_id, status="running", facts=facts)
        )
        assert result.events_added == len(facts)
        ids.extend(e.event_id for e in result.transition.facts)
    return ids


def outbox_rows(actor: Actor) -> list[sqlite3.Row]:
    """Every outbox row of ``actor``, in outbox (seq) order."""
    return list(actor.connection.execute("SELECT * FROM outbox ORDER BY seq"))


def projects_on_distinct_streams(count: int, prefix: str = "proj") -> list[str]:
    """``count`` project IDs whose event streams all differ."""
    chosen: dict[int, str] = {}
    n = 0
    while len(chosen) < count:
        candidate = f"{prefix}-{n}"
        chosen.setdefault(stream_index(candidate), candidate)
        n += 1
    return list(chosen.values())


@dataclass(frozen=True)
class StreamEntry:
    """One stored message of an event stream."""

    seq: int
    message_id: str
    project_id: str


async def read_stream(js: Any, index: int) -> list[StreamEntry]:
    """Every message stored on ``EVENTS_0<index>``, in stream order."""
    name = event_stream_name(index)
    info = await js.stream_info(name)
    entries: list[StreamEntry] = []
    if info.state.messages == 0:
        return entries
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await _get_msg(js, name, seq)
        body = json.loads(msg.data)
        entries.append(StreamEntry(seq, msg.headers["Nats-Msg-Id"], body["projectId"]))
    return entries


async def _get_msg(js: Any, name: str, seq: int, *, timeout_s: float = 30.0) -> Any:
    """``js.get_msg``, waiting out "JetStream temporarily unavailable" (503): a cluster whose
    killed node was just restarted answers so while its stream's replicas catch up."""
    from nats.js.errors import ServiceUnavailableError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await js.get_msg(name, seq)
        except ServiceUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # a bounded poll of the cluster's recovery


async def read_project_stream(js: Any, project_id: str) -> list[str]:
    """The Event IDs of ``project_id`` on its stream, in stream order."""
    entries = await read_stream(js, stream_index(project_id))
    return [e.message_id for e in entries if e.project_id == project_id]


async def wait_until(predicate: Any, *, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)  # polling a condition with a deadline, not a fixed wait


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment with no RHUMBATRON_* but the state dir, NATS URL and
    ``extra`` (``crash_at="after_puback"`` -> ``RHUMBATRON_CRASH_AT=after_puback``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env["RHUMBATRON_STATE_DIR"] = str(settings.state_dir)
    env["RHUMBATRON_NATS_URL"] = settings.nats_url
    env["RHUMBATRON_JOURNAL_MODE"] = settings.journal_mode
    env["RHUMBATRON_PUBLISH_BATCH_MODE"] = settings.publish_batch_mode
    for name, value in extra.items():
        env[f"RHUMBATRON_{name.upper()}"] = value
    return env


def start_worker(
    args: list[str], env: dict[str, str], *, stdin: bool = False
) -> subprocess.Popen[str]:
    """Start this file as a worker process (``stdin``: with a pipe to its standard input)."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        env=env,
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def release_gated(workers: list[subprocess.Popen[str]]) -> None:
    """Wait until every ``--gate`` worker is connected and ready, then let all of them go.

    Blocking reads of the ready line: the barrier is the workers' own signal, not a sleep.
    """
    for worker in workers:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert json.loads(line or "{}").get("ready"), f"worker not ready: {line!r}"
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()


def run_worker(
    args: list[str], env: dict[str, str], timeout_s: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run this file as a worker process to its end (or its crash point)."""
    return subprocess.run(
        [sys.executable, str(WORKER), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def state_counts(rows: Iterable[sqlite3.Row]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return counts


class RoutedLog:
    """Causal rules whose one effect is a line per routed Event ID, appended to ``path``.

    Each ``route`` call is one ``O_APPEND`` write, in the kernel before ``route`` returns, so a
    worker killed right after routing (``after_apply``) still leaves its effect on disk: the
    file is what a crash test counts effects in, across the crashed and the recovering router.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def acts_on(self, event: Event) -> bool:
        return True  # its one effect is a line per Event: every Event is routed

    async def route(
        self, events: Sequence[Event], traces: Mapping[str, str] | None = None
    ) -> dict[str, RecordOutcome]:
        if events:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, "".join(f"{e.event_id}\n" for e in events).encode())
            finally:
                os.close(fd)
        return {event.event_id: APPLIED for event in events}

    def routed(self) -> list[str]:
        """Every routed Event ID, once per time it was routed, in routing order."""
        if not self.path.exists():
            return []
        return self.path.read_text().split()


class CommandEffects:
    """A command handler whose effect is a line per command ID in ``effects.log``, written at
    most once per ID, as a real handler keys its effect on the command ID; every delivery it
    sees, effect or not, is a line ``<command ID> <delivery>`` in ``deliveries.log``.

    Each line is one ``O_APPEND`` write, in the kernel before the handler returns, so a
    worker killed after its handler (``before_ack``) still leaves the effect on disk. Only
    one process handles commands at a time in the tests (the crashed one is dead before the
    recovering one starts), so the check-then-append needs no lock.
    """

    def __init__(
        self, directory: Path, *, block: frozenset[str] = frozenset(), fail: bool = False
    ) -> None:
        self.effects_path = directory / "effects.log"
        self.deliveries_path = directory / "deliveries.log"
        self.block = block
        self.fail = fail

    async def __call__(self, command: Command, delivery: Delivery) -> None:
        _append(self.deliveries_path, f"{command.command_id} {delivery.delivered}\n")
        if command.command_id in self.block:
            print(json.dumps({"blocked": command.command_id}))
            sys.stdout.flush()
            await asyncio.Event().wait()  # held until the test kills this process
        if self.fail:
            raise RuntimeError(f"{command.command_id} fails on every delivery")
        if command.command_id not in self.effects():
            _append(self.effects_path, f"{command.command_id}\n")

    def effects(self) -> list[str]:
        """Command IDs with an effect, in the order the effects were made."""
        return self.effects_path.read_text().split() if self.effects_path.exists() else []

    def deliveries(self) -> list[tuple[str, int]]:
        """``(command ID, delivery number)`` of every delivery handled, in order."""
        if not self.deliveries_path.exists():
            return []
        pairs = (line.split() for line in self.deliveries_path.read_text().splitlines())
        return [(command_id, int(n)) for command_id, n in pairs]


def _append(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- worker commands


async def _publish(actor_key: str, rounds: int) -> None:
    app = bootstrap(load_settings())
    try:
        actor = app.actor(ActorRef.parse(actor_key))
        publisher = await app.publisher()
        for _ in range(rounds):
            report = await publisher.publish_due(actor)
            print(json.dumps({k: v for k, v in asdict(report).items() if k != "alarm"}))
            sys.stdout.flush()
            pending = actor.connection.execute(
                "SELECT COUNT(*) FROM outbox WHERE state IN ('pending', 'retry_wait')"
            ).fetchone()[0]
            if pending == 0:
                break
            if report.busy:
                await asyncio.sleep(0.005)  # the other publisher holds the actor: poll again
    finally:
        await app.close()


def _claim(project_id: str, resource: str) -> None:
    app = bootstrap(load_settings())
    shard = app.resource_shard(project_id, resource)
    result = shard.apply(
        CALLER, AcquireClaim(resource=resource, agent_id="agent-1", ttl=timedelta(minutes=5))
    )
    print(json.dumps({"events_added": result.events_added}))


async def _route(mode: str, args: list[str], routed_log: Path | None, gate: bool) -> None:
    app = bootstrap(load_settings(), causal_routing=RoutedLog(routed_log) if routed_log else None)
    try:
        router = app.router()
        if gate:
            await router.event_log()  # connected before the start line
            print(json.dumps({"ready": True}))
            sys.stdout.flush()
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        report: Any
        if mode == "consume":
            index, subscription = int(args[0]), Subscription(args[1])
            run = RunContext(
                stream_index=index,
                now_s=app.clock.now().timestamp(),
                apply_calls_left=app.settings.router_apply_calls_per_run,
            )
            report = asdict(
                await router.consume(
                    run,
                    subscription,
                    consumes=app.settings.router_consumes_per_run,
                    batch=app.settings.router_fetch_max_records,
                )
            )
        elif mode == "nudge":
            report = asdict(await router.nudge(int(args[0])))
        elif mode == "sweep":
            report = asdict((await router.sweep(now=datetime.fromisoformat(args[0]))).run)
        elif mode == "drain":
            report = await router.drain()
        else:
            raise SystemExit(f"unknown route mode {mode!r}")
        print(json.dumps({"mode": mode, "report": report}))
        sys.stdout.flush()
    finally:
        await app.close()


async def _commands(queue: str, handler: CommandEffects, until_empty: bool) -> None:
    app = bootstrap(load_settings())
    try:
        runtime = await app.queue_runtime()
        js = (await app.nats()).jetstream()
        deadline = time.monotonic() + 30.0
        while True:
            report = await runtime.poll(queue, handler)
            print(json.dumps(asdict(report)))
            sys.stdout.flush()
            if not until_empty or time.monotonic() > deadline:
                break
            if not report.fetched:
                info = await js.consumer_info(COMMAND_STREAM, consumer_name(queue))
                if not info.num_pending and not info.num_ack_pending:
                    break
                await asyncio.sleep(0.02)  # a nak is handled by the server asynchronously
    finally:
        await app.close()


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "publish":
        asyncio.run(_publish(args[0], int(args[1]) if len(args) > 1 else 1))
    elif command == "claim":
        _claim(args[0], args[1])
    elif command == "route":
        logs = [a.split("=", 1)[1] for a in args if a.startswith("--routed-log=")]
        positional = [a for a in args if not a.startswith("--")]
        gate = "--gate" in args
        asyncio.run(_route(positional[0], positional[1:], Path(logs[-1]) if logs else None, gate))
    elif command == "commands":
        options: dict[str, str] = {}
        for arg in args:
            if arg.startswith("--") and "=" in arg:
                name, value = arg[2:].split("=", 1)
                options[name] = value
        handler = CommandEffects(
            Path(options["dir"]),
            block=frozenset(filter(None, options.get("block", "").split(","))),
            fail="--fail" in args,
        )
        asyncio.run(_commands(args[0], handler, "--until-empty" in args))
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
