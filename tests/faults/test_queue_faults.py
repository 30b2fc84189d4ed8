"""Faults of the command queues, against a real nats-server (RELIABILITY F13, F23).

A worker that dies is a separate process (``worker.py commands …``), killed with SIGKILL
while its handlers are held, or killing itself at a named point (``RHUMBATRON_CRASH_AT``);
the worker that recovers runs in this process. Both use :class:`CommandEffects`: an effect
file with a line per command ID (written at most once per ID, as real handlers key their
effects on the command ID) and a log of every delivery handled. The ack wait is 3 s, so what
a dead worker held comes back within a bounded poll.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio

from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.messaging.commands import DELIVERIES_HEADER
from rhumbatron.messaging.queue_consumer import PollReport, QueueConsumerRuntime
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.queue_consumers import consumer_name
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from server_counts import settles_to, wait_for

from .worker import CommandEffects, run_worker, start_worker, worker_env

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

QUEUE = "integration"  # batch 10, concurrency 2, 3 retries, dead-letter queue
ACK_WAIT_S = 3.0
IN_PROGRESS_S = 1.0
#: How long a test waits for what JetStream redelivers after the ack wait.
REDELIVERY_BOUND_S = 20.0


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def queue_settings(tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    """The settings of the dying worker and of the recovering one: a 3 s ack wait, and no
    retry delay on the queue (a test override of the table's 30 s)."""
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        command_ack_wait_s=ACK_WAIT_S,
        command_in_progress_s=IN_PROGRESS_S,
        queue_retry_delay_s={QUEUE: 0.0},
    )


@pytest_asyncio.fixture
async def app(queue_settings: Settings) -> AsyncIterator[Rhumbatron]:
    """The recovering side, in this process; it also sends the commands."""
    runtime = bootstrap(queue_settings)
    await runtime.ensure_streams()
    yield runtime
    await runtime.close()


def env(settings: Settings, **extra: str) -> dict[str, str]:
    """The worker's environment: the same settings, plus ``extra`` (``crash_at=…``)."""
    return worker_env(
        settings,
        command_ack_wait_s=str(settings.command_ack_wait_s),
        command_in_progress_s=str(settings.command_in_progress_s),
        queue_retry_delay_s=json.dumps(settings.queue_retry_delay_s),
        **extra,
    )


# --------------------------------------------------------------------------- helpers


async def send_commands(app: Rhumbatron, count: int) -> list[str]:
    """``count`` new agent.wake commands on the queue; their IDs in queue order."""
    bus = await app.command_bus()
    tag = uuid.uuid4().hex[:8]
    ids = []
    for n in range(count):
        command = Command.create(
            command_id=f"cmd_{tag}_{n:02d}",
            command_type="agent.wake",
            project_id="acme-web",
            created_at=datetime.now(UTC),
            payload={"agentId": f"agent-{n}", "reason": "task.ready"},
        )
        assert not (await bus.send(QUEUE, command)).duplicate
        ids.append(command.command_id)
    return ids


async def subject_counts(app: Rhumbatron) -> dict[str, int]:
    """Messages stored on the COMMANDS stream, by subject."""
    js = (await app.nats()).jetstream()
    info = await js.stream_info(COMMAND_STREAM, subjects_filter="cmd.>")
    return dict(info.state.subjects or {})


async def consumer_backlog(app: Rhumbatron) -> tuple[int, int]:
    """``(num_pending, num_ack_pending)`` of the queue's consumer, as the server counts."""
    js = (await app.nats()).jetstream()
    info = await js.consumer_info(COMMAND_STREAM, consumer_name(QUEUE))
    return int(info.num_pending or 0), int(info.num_ack_pending or 0)


async def poll_until(
    runtime: QueueConsumerRuntime,
    handler: CommandEffects,
    done: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float = REDELIVERY_BOUND_S,
) -> list[PollReport]:
    """Poll the queue until ``done()``; between empty polls, wait for the server's timers."""
    reports: list[PollReport] = []
    deadline = time.monotonic() + timeout_s
    while not await done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {timeout_s}s: {reports}")
        report = await runtime.poll(QUEUE, handler)
        reports.append(report)
        if not report.fetched:
            await asyncio.sleep(0.05)  # the ack wait is a server timer
    return reports


async def read_line(worker: subprocess.Popen[str], timeout_s: float = 20.0) -> dict[str, object]:
    """The worker's next JSON line on stdout (a blocking read, off the event loop)."""
    assert worker.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), timeout_s)
    assert line, f"the worker ended early: {worker.poll()} {worker.stderr and worker.stderr.read()}"
    return dict(json.loads(line))


# --------------------------------------------------------------------------- F23


async def test_worker_killed_mid_batch_does_not_redo_finished_commands(
    app: Rhumbatron, queue_settings: Settings, tmp_path: Path
) -> None:
    # GIVEN ten commands, one batch, and a worker whose handlers of the 4th and 5th hang
    # (concurrency 2: both slots held) — a Lambda whose time ran out mid-batch
    ids = await send_commands(app, 10)
    finished, hung, unstarted = ids[:3], ids[3:5], ids[5:]
    worker = start_worker(
        ["commands", QUEUE, f"--dir={tmp_path}", f"--block={','.join(hung)}"],
        env(queue_settings),
    )
    try:
        blocked = {str((await read_line(worker))["blocked"]) for _ in hung}
        assert blocked == set(hung)

        async def finished_acked() -> bool:  # the server has the acks of the first three
            return await consumer_backlog(app) == (0, len(hung) + len(unstarted))

        await wait_for(finished_acked, timeout_s=10, what="the acks of the finished commands")

        # WHEN the worker is killed with SIGKILL
        worker.kill()
        assert worker.wait(timeout=10) == -9
    finally:
        if worker.poll() is None:
            worker.kill()
    effects = CommandEffects(tmp_path)
    assert effects.effects() == finished

    # THEN nothing it held comes back before the ack wait
    runtime = await app.queue_runtime()
    assert (await runtime.poll(QUEUE, effects)).fetched == 0

    # AND after it, the hung and unstarted commands come back, and only those
    async def all_done() -> bool:
        return len(effects.effects()) == len(ids)

    reports = await poll_until(runtime, effects, all_done)
    recovered = effects.deliveries()[len(finished) + len(hung) :]
    assert sorted(recovered) == sorted((i, 2) for i in [*hung, *unstarted])
    assert sum(r.done for r in reports) == len(hung) + len(unstarted)
    # every command's effect exactly once; the finished ones were never delivered again
    assert Counter(effects.effects()) == dict.fromkeys(ids, 1)
    delivered = Counter(i for i, _ in effects.deliveries())
    assert all(delivered[i] == 1 for i in finished)
    await settles_to(lambda: subject_counts(app), {})


async def test_worker_crashing_before_its_ack_redoes_only_the_idempotent_effect(
    app: Rhumbatron, queue_settings: Settings, tmp_path: Path
) -> None:
    # GIVEN ten commands and a worker that dies between a handler's return and its ack
    ids = await send_commands(app, 10)

    # WHEN it handles the batch
    crashed = run_worker(
        ["commands", QUEUE, f"--dir={tmp_path}"], env(queue_settings, crash_at="before_ack")
    )

    # THEN it died after making at most `concurrency` effects and acking none
    assert crashed.returncode == 137, crashed.stderr
    effects = CommandEffects(tmp_path)
    made_before_crash = effects.effects()
    assert 1 <= len(made_before_crash) <= 2
    assert await consumer_backlog(app) == (0, len(ids))

    # WHEN the batch comes back after the ack wait and is handled again
    runtime = await app.queue_runtime()

    async def queue_empty() -> bool:
        return (await subject_counts(app)) == {}

    await poll_until(runtime, effects, queue_empty)

    # THEN the commands done before the crash were delivered twice (at least once: their ack
    # never reached the server) but, keyed on the command ID, their effect happened once
    deliveries = Counter(i for i, _ in effects.deliveries())
    assert {i for i, n in deliveries.items() if n == 2} >= set(made_before_crash)
    assert Counter(effects.effects()) == dict.fromkeys(ids, 1)


# --------------------------------------------------------------------------- F13


async def test_a_command_failing_on_every_delivery_becomes_exactly_one_dead_letter(
    app: Rhumbatron, queue_settings: Settings, tmp_path: Path
) -> None:
    # GIVEN a command, and a worker whose handler fails on every delivery
    [command_id] = await send_commands(app, 1)

    # WHEN the worker polls until the queue's consumer has nothing left
    run = run_worker(
        ["commands", QUEUE, f"--dir={tmp_path}", "--fail", "--until-empty"], env(queue_settings)
    )

    # THEN it was delivered 1 + 3 times, then became one dead letter, and the work-queue
    # message is gone
    assert run.returncode == 0, run.stderr
    effects = CommandEffects(tmp_path)
    assert effects.deliveries() == [(command_id, n) for n in (1, 2, 3, 4)]
    assert effects.effects() == []
    await settles_to(lambda: subject_counts(app), {"cmd.dead-letter": 1})
    await settles_to(lambda: consumer_backlog(app), (0, 0))
    js = (await app.nats()).jetstream()
    letter = await js.get_last_msg(COMMAND_STREAM, "cmd.dead-letter")
    assert Command.parse(letter.data or b"").command_id == command_id
    assert (letter.headers or {})[DELIVERIES_HEADER] == "4"


async def test_a_worker_killed_after_the_dead_letter_send_still_leaves_one_dead_letter(
    app: Rhumbatron, queue_settings: Settings, tmp_path: Path
) -> None:
    # GIVEN a command that fails on every delivery, and a worker that dies right after the
    # dead-letter send, before it terminates the original
    [command_id] = await send_commands(app, 1)
    crashed = run_worker(
        ["commands", QUEUE, f"--dir={tmp_path}", "--fail", "--until-empty"],
        env(queue_settings, crash_at="after_dead_letter"),
    )
    assert crashed.returncode == 137, crashed.stderr
    assert await subject_counts(app) == {"cmd.dead-letter": 1, f"cmd.{QUEUE}": 1}

    # WHEN the original comes back after the ack wait and fails again
    effects = CommandEffects(tmp_path, fail=True)
    runtime = await app.queue_runtime()

    async def original_gone() -> bool:
        return f"cmd.{QUEUE}" not in await subject_counts(app)

    reports = await poll_until(runtime, effects, original_gone)

    # THEN the second dead-letter send was dropped as a duplicate of the first (same message
    # ID): still exactly one dead letter, and the original is terminated
    assert effects.deliveries() == [(command_id, n) for n in (1, 2, 3, 4, 5)]
    assert sum(r.dead_lettered for r in reports) == 1
    await settles_to(lambda: subject_counts(app), {"cmd.dead-letter": 1})
    await settles_to(lambda: consumer_backlog(app), (0, 0))
