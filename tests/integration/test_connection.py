"""Connecting to NATS: "nobody answers" is its own error, raised within a bound."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from rhumbatron.core.settings import load_settings
from rhumbatron.errors import NatsUnavailableError
from rhumbatron.messaging.connection import connect_nats
from rhumbatron_dev.local.nats_server import NatsServerProcess, free_port

pytestmark = pytest.mark.integration


async def test_connecting_where_no_server_listens_fails_within_twice_the_connect_timeout(
    tmp_path: Path,
) -> None:
    # GIVEN a loopback port nobody listens on
    settings = load_settings(
        state_dir=tmp_path, nats_url=f"nats://127.0.0.1:{free_port()}", nats_connect_timeout_s=0.5
    )
    # WHEN we connect
    started = time.monotonic()
    with pytest.raises(NatsUnavailableError, match="RHUMBATRON_NATS_URL"):
        await connect_nats(settings)
    # THEN it gives up within the bound instead of retrying for ever
    assert time.monotonic() - started < 2 * 0.5 + 1.0


async def test_a_connection_reconnects_by_itself_after_a_server_restart(
    nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    # GIVEN a connected client (F15)
    nc = await connect_nats(load_settings(state_dir=tmp_path, nats_url=nats_server.url))
    try:
        # WHEN the server is restarted under it
        nats_server.kill()
        nats_server.start()
        # THEN the client gets a round trip through again without being told to reconnect
        assert await _round_trip_within(nc, seconds=10)
    finally:
        await nc.close()


async def _round_trip_within(nc: NATS, *, seconds: float) -> bool:
    """Poll a condition (a PING/PONG round trip) until it holds or the deadline passes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await nc.flush(timeout=1)
            return True
        except Exception:  # still disconnected or reconnecting
            await asyncio.sleep(0.05)  # yield to the client's reconnect task
    return False
