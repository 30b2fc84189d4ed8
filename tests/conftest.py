"""Shared fixtures: a real nats-server per test on a free loopback port, temp state dirs,
a manual clock, and the composition root wired to them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import LocalStackError
from rhumbatron.messaging.nudge import RecordingNudge
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A real nats-server with JetStream, its store in this test's temp dir."""
    server = start_on_free_ports(tmp_path / "nats")
    yield server
    server.stop()


def start_on_free_ports(store_dir: Path, attempts: int = 3) -> NatsServerProcess:
    """Start a nats-server on free loopback ports. A port found free can be taken by another
    process before the server binds it (other suites run on this machine too): the server
    then exits at once with "address already in use", and it is started again on new ports."""
    for attempt in range(1, attempts + 1):
        server = NatsServerProcess(store_dir=store_dir)
        try:
            server.start()
            return server
        except LocalStackError:
            log = store_dir.parent / f"{server.name}.log"
            taken = log.exists() and "address already in use" in log.read_text()
            server.stop()
            if not taken or attempt == attempts:
                raise
    raise AssertionError("unreachable")


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


@pytest.fixture
def offline_settings(tmp_path: Path) -> Settings:
    """Settings for tests that never touch NATS (actors, outbox state machine)."""
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")


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
