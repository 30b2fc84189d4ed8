"""Fixtures of the fault tests: a nats-server that fsyncs every write, so a SIGKILL of the
server loses nothing it acknowledged (RELIABILITY: the default 2-minute fsync interval can)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rhumbatron_dev.local.nats_server import NatsServerProcess


@pytest.fixture
def durable_nats(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A real nats-server with ``sync_interval: always``, its store in this test's temp dir."""
    server = NatsServerProcess(store_dir=tmp_path / "nats-durable", sync_interval="always")
    server.start()
    yield server
    server.stop()
