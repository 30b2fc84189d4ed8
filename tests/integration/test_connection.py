"""Connecting to NATS: "nobody answers" is its own error, raised within a bound; the client
names itself, takes several seeds, reconnects for ever and buffers nothing while cut off."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.errors import OutboundBufferLimitError

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


async def test_the_unavailable_error_names_the_url_the_bound_and_what_failed(
    tmp_path: Path,
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    settings = load_settings(state_dir=tmp_path, nats_url=url, nats_connect_timeout_s=0.5)
    with pytest.raises(NatsUnavailableError) as refused:
        await connect_nats(settings)
    # Word for word: the bound is twice the connect timeout, the cause is nats-py's error
    # type, and with no credentials configured nothing is said of credentials.
    assert re.fullmatch(
        re.escape(f"no NATS server answered at {url} within 1 s (")
        + r"(TimeoutError|NoServersError|ConnectionRefusedError|OSError)"
        + re.escape("); check RHUMBATRON_NATS_URL and that nats-server is running"),
        str(refused.value),
    ), str(refused.value)


@pytest.mark.parametrize("separator", [" , ", ","], ids=["spaced", "bare"])
async def test_the_client_takes_several_comma_separated_seeds_and_names_itself(
    nats_server: NatsServerProcess, tmp_path: Path, separator: str
) -> None:
    # GIVEN two seeds, the first of which nobody listens on
    seeds = f"nats://127.0.0.1:{free_port()}{separator}{nats_server.url}"
    settings = load_settings(state_dir=tmp_path, nats_url=seeds, nats_connect_timeout_s=0.5)
    # WHEN a role connects under its name
    nc = await connect_nats(settings, name="rhumbatron-queue-worker")
    try:
        await nc.flush(timeout=2)
        # THEN the server knows the connection by that name
        names = [c.get("name") for c in nats_server.connz()]
        assert names == ["rhumbatron-queue-worker"]
    finally:
        await nc.close()


async def test_a_client_given_no_name_is_known_to_the_server_as_rhumbatron(
    nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    # GIVEN a client connected as the runtime connects, with no name of its own
    nc = await connect_nats(load_settings(state_dir=tmp_path, nats_url=nats_server.url))
    try:
        await nc.flush(timeout=2)
        # THEN the server (its /connz, which operators read) knows it as rhumbatron
        assert [c.get("name") for c in nats_server.connz()] == ["rhumbatron"]
    finally:
        await nc.close()


async def test_a_publish_while_cut_off_fails_at_once_instead_of_piling_up(
    nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    # GIVEN a connected client whose server goes away
    nc = await connect_nats(load_settings(state_dir=tmp_path, nats_url=nats_server.url))
    try:
        nats_server.kill()
        await _until(lambda: nc.is_reconnecting)
        # WHEN something is published while it reconnects
        # THEN it is refused at once: nothing is buffered to go out later unseen
        with pytest.raises(OutboundBufferLimitError):
            await nc.publish("anything", b"")
    finally:
        await nc.close()


async def test_a_connection_reconnects_by_itself_after_a_server_restart(
    nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    # GIVEN a connected client (F15)
    nc = await connect_nats(load_settings(state_dir=tmp_path, nats_url=nats_server.url))
    try:
        # WHEN the server is down for 2 s (several reconnect waits), then starts again
        nats_server.kill()
        await _until(lambda: nc.is_reconnecting)
        await asyncio.sleep(2)  # the outage's length, not a synchronisation
        nats_server.start()
        # THEN the client gets a round trip through again without being told to reconnect
        assert await _round_trip_within(nc, seconds=10)
    finally:
        await nc.close()


async def test_a_cut_off_client_tries_its_server_again_every_quarter_second(
    nats_server: NatsServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a connected client, each of whose failed attempts is logged
    caplog.set_level(logging.DEBUG, logger="rhumbatron.messaging.connection")
    settings = load_settings(state_dir=tmp_path, nats_url=nats_server.url)
    nc = await connect_nats(settings, name="cut-off")
    try:
        # WHEN its server is down for 1.5 s
        nats_server.kill()
        await _until(lambda: nc.is_reconnecting)
        await asyncio.sleep(1.5)  # the outage's length, not a synchronisation
        # THEN it tried again about every 0.25 s (six times): a wait of 1.25 s would have
        #   allowed two
        attempts = [
            r for r in caplog.records if r.getMessage().startswith("nats connection cut-off:")
        ]
        assert len(attempts) >= 5, [r.getMessage() for r in attempts]
        # AND the outage's first error was its one warning, the retries debug lines
        levels = [r.levelno for r in attempts]
        assert levels[0] == logging.WARNING and set(levels[1:]) == {logging.DEBUG}
    finally:
        # Back before the close: a close that cancels an attempt at the moment it fails can
        # lose the cancellation (Python 3.11's wait_for), and the attempts then go on after
        # the test; against a server that answers, the next one ends them.
        nats_server.start()
        await nc.close()


async def _until(condition: Callable[[], bool], *, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)  # yield to the client's own tasks


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
