"""Shared fixtures: a real nats-server per test on a free loopback port, temp state dirs,
a manual clock, and the composition root wired to them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.messaging.nudge import RecordingNudge
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A real nats-server with JetStream, its store in this test's temp dir."""
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3ServerProcess]:
    """One moto S3 server per test module; each test makes its own bucket on it."""
    server = S3ServerProcess()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def settings(tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url=nats_server.url)


@pytest_asyncio.fixture
async def nc(nats_server: NatsServerProcess, settings: Settings) -> AsyncIterator[NATS]:
    """A plain nats-py connection to this test's server, the event streams ensured: for the
    tests of what one sender sends, below the composition root."""
    import nats

    from rhumbatron.messaging.streams import ensure_streams

    client = await nats.connect(nats_server.url)
    await ensure_streams(client.jetstream(), settings)
    yield client
    await client.close()


@pytest.fixture
def offline_settings(tmp_path: Path) -> Settings:
    """Settings for tests that never touch NATS (actors, outbox state machine)."""
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")


@pytest.fixture
def local_time_far_from_utc() -> Iterator[None]:
    """The process's local time zone set to UTC-5 (TZ), restored afterwards: a test of a UTC
    rule that must not lean on the host's zone (CI's is UTC, where local time is UTC)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TZ", "EST+05")
        time.tzset()
        try:
            yield
        finally:
            patch.undo()
            time.tzset()


@pytest.fixture
def nudge() -> RecordingNudge:
    return RecordingNudge()


@pytest_asyncio.fixture
async def app(
    settings: Settings, clock: ManualClock, nudge: RecordingNudge
) -> AsyncIterator[Rhumbatron]:
    """The composition root on a real nats-server, streams created, on a manual clock."""
    runtime = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink(), nudge=nudge)
    await runtime.ensure_streams()
    yield runtime
    await runtime.close()
