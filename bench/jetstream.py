"""(a) raw nats-py JetStream publishing and (b) ``OutboxPublisher.publish_due``, timed.

Every timed run starts on empty event streams (deleted and created again by
:func:`~rhumbatron.messaging.streams.ensure_streams`), so no run's messages are dropped by the
duplicate window of an earlier run, and ends by checking that the streams hold exactly the
workload's events. Besides wall time, each run records the CPU time spent by this process
(the client) and by the nats-server process, which tells where a slow figure loses its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.workload import RawMessage, Workload, copy_state
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.publisher import PublishReport
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.messaging.sender import (
    EventSender,
    FastBatchAck,
    JetStreamSender,
    OutgoingMessage,
    StoredMessage,
)
from rhumbatron.messaging.streams import ensure_streams
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.testing import SenderWrapper

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js.client import JetStreamContext

__all__ = [
    "BenchError",
    "RunResult",
    "ServerCpu",
    "TimedSender",
    "measure",
    "publish_due_run",
    "raw_pipelined",
    "raw_sequential",
    "reset_streams",
    "run_settings",
    "stored_events",
]


class BenchError(RuntimeError):
    """A run did not do what it was timed for (lost, duplicated or refused messages)."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """One timed run: wall seconds, CPU seconds of client and server, time inside the sender."""

    events: int
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float
    sender_s: float | None = None

    @property
    def events_per_s(self) -> float:
        """Throughput of the run: events over wall seconds."""
        return self.events / self.wall_s


class ServerCpu:
    """Reads the CPU time (user + system) a running nats-server has used, from ``/proc``.

    The process is found by its command line, which names the configuration file that
    :class:`NatsServerProcess` writes beside the store directory.
    """

    def __init__(self, server: NatsServerProcess) -> None:
        config = str(server.store_dir.parent / f"{server.name}.conf")
        self._stat: Path | None = None
        proc = Path("/proc")
        for entry in proc.iterdir() if proc.is_dir() else ():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if config.encode() in argv:
                self._stat = entry / "stat"
                break
        self._tick_s = 1 / os.sysconf("SC_CLK_TCK")

    @property
    def pid(self) -> int | None:
        """The server's process ID (None when ``/proc`` did not show it)."""
        return None if self._stat is None else int(self._stat.parent.name)

    def seconds(self) -> float:
        """CPU seconds used so far; 0 when ``/proc`` is not available."""
        if self._stat is None:
            return 0.0
        fields = self._stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * self._tick_s


class TimedSender(SenderWrapper):
    """An :class:`EventSender` that adds up the wall time spent inside the real sender."""

    def __init__(self, inner: EventSender) -> None:
        super().__init__(inner)
        self.seconds = 0.0

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        """Send one message through the wrapped sender, timing it."""
        started = time.perf_counter()
        try:
            return await self.inner.send(stream, message)
        finally:
            self.seconds += time.perf_counter() - started

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        """Send an atomic batch through the wrapped sender, timing it."""
        started = time.perf_counter()
        try:
            return await self.inner.send_batch(stream, messages)
        finally:
            self.seconds += time.perf_counter() - started

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        """Send a fast-ingest batch through the wrapped sender, timing it."""
        started = time.perf_counter()
        try:
            return await self.inner.send_fast_batch(stream, messages)
        finally:
            self.seconds += time.perf_counter() - started


async def measure(
    events: int, server_cpu: ServerCpu, run: Callable[[], Awaitable[float | None]]
) -> RunResult:
    """Time ``run`` (wall and CPU). ``run`` may return the seconds spent in its sender."""
    cpu0, server0 = time.process_time(), server_cpu.seconds()
    started = time.perf_counter()
    sender_s = await run()
    wall = time.perf_counter() - started
    return RunResult(
        events,
        wall,
        time.process_time() - cpu0,
        server_cpu.seconds() - server0,
        sender_s,
    )


async def reset_streams(nc: NATS, settings: Settings) -> None:
    """Delete the event streams and create them again, empty, with the package's settings."""
    from nats.js.errors import NotFoundError

    js = nc.jetstream()
    for index in range(EVENT_STREAM_COUNT):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(event_stream_name(index))
    await ensure_streams(js, settings)


async def stored_events(nc: NATS) -> int:
    """How many messages the eight event streams hold together."""
    js = nc.jetstream()
    total = 0
    for index in range(EVENT_STREAM_COUNT):
        info = await js.stream_info(event_stream_name(index))
        total += int(info.state.messages or 0)
    return total


async def raw_sequential(
    js: JetStreamContext, messages: Sequence[RawMessage], *, ack_timeout_s: float
) -> None:
    """Publish each message with ``Nats-Msg-Id`` and await its PubAck before the next."""
    for message in messages:
        ack = await js.publish(
            message.subject,
            message.data,
            timeout=ack_timeout_s,
            headers={"Nats-Msg-Id": message.message_id},
        )
        if ack.duplicate:
            raise BenchError(f"{message.message_id} was a duplicate: streams not reset?")


async def raw_pipelined(
    js: JetStreamContext,
    messages: Sequence[RawMessage],
    *,
    window: int,
    ack_timeout_s: float,
) -> None:
    """Publish ``window`` messages with ``publish_async``, await their PubAcks, repeat.

    nats-py's ``publish_async`` futures have no timeout of their own, so each window's acks
    are awaited under :func:`asyncio.wait_for`.
    """
    for start in range(0, len(messages), window):
        futures = [
            await js.publish_async(
                message.subject, message.data, headers={"Nats-Msg-Id": message.message_id}
            )
            for message in messages[start : start + window]
        ]
        acks = await asyncio.wait_for(asyncio.gather(*futures), timeout=ack_timeout_s)
        if any(ack.duplicate for ack in acks):
            raise BenchError("a pipelined publish was a duplicate: streams not reset?")


def run_settings(
    state_dir: Path,
    nats_url: str,
    rows_per_project: int = 100,
    concurrency: int | None = None,
    batch_mode: str | None = None,
) -> Settings:
    """The package's defaults (WAL, synchronous=FULL, ``publish_batch_mode`` auto, 100 rows
    per project, ``publish_concurrency`` 16) unless a variant overrides one."""
    overrides: dict[str, object] = {"publish_max_rows_per_project": rows_per_project}
    if concurrency is not None:
        overrides["publish_concurrency"] = concurrency
    if batch_mode is not None:
        overrides["publish_batch_mode"] = batch_mode
    return load_settings(
        state_dir=state_dir, nats_url=nats_url, network_filesystem=False, **overrides
    )


async def publish_due_run(
    nc: NATS,
    nats_url: str,
    workload: Workload,
    work_dir: Path,
    server_cpu: ServerCpu,
    *,
    concurrency: int | None = None,
    rows_per_project: int = 100,
    batch_mode: str | None = None,
    profile: cProfile.Profile | None = None,
) -> RunResult:
    """Drain a fresh copy of the workload's outboxes the way the system does; time it.

    Every actor's alarm is announced (as its writes announced it) and
    :meth:`Rhumbatron.drain_alarms` — the local invoker — fires alarms until nothing is due:
    ``OutboxPublisher.fire_alarm`` → ``publish_due`` per actor, ``publish_concurrency`` actors
    at once (the package default unless ``concurrency`` overrides it), an actor again while
    the 100-row cap left rows due. Actor files are opened before the clock starts (a warm
    container has them open); the publisher shares the benchmark's NATS connection.
    ``batch_mode`` overrides ``publish_batch_mode``. ``profile`` (cProfile) covers the timed
    part only.
    """
    settings = run_settings(
        copy_state(workload, work_dir), nats_url, rows_per_project, concurrency, batch_mode
    )
    sender = TimedSender(JetStreamSender(nc, ack_timeout_s=settings.publish_ack_timeout_s))
    sink = RecordingAlarmSink()
    app = bootstrap(settings, sender=sender, alarms=sink)
    await app.publisher()
    for ref in app.actor_refs():
        _ = app.actor(ref).connection
        sink.alarm_set(ref.key, app.clock.now())
    reports: list[PublishReport] = []

    async def run() -> float:
        if profile is not None:
            profile.enable()
        try:
            reports.extend(await app.drain_alarms())
        finally:
            if profile is not None:
                profile.disable()
        return sender.seconds

    try:
        result = await measure(workload.events, server_cpu, run)
    finally:
        await app.close()
    unclean = [
        r for r in reports if r.failed or r.retry_wait or r.duplicates or r.busy or r.unavailable
    ]
    if unclean:
        raise BenchError(f"publish_due did not publish cleanly: {unclean[0]}")
    published = sum(r.published for r in reports)
    if published != workload.events:
        raise BenchError(f"publish_due published {published} of {workload.events} events")
    return result
