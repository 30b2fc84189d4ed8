"""How a connection's errors are logged: the first error of an outage is a warning, the
retries after it are debug lines, and a reconnect (an info line naming the connection) starts
the count again, so the next outage warns again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rhumbatron.messaging.connection import _ConnectionErrors

_LOGGER = "rhumbatron.messaging.connection"


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == _LOGGER]
    caplog.clear()
    return lines


def test_each_outage_warns_once_and_a_reconnect_is_an_info_line_naming_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=_LOGGER)
    errors = _ConnectionErrors("router")
    errors.connected = True
    lost = ConnectionResetError("reset by peer")

    async def outage_and_back() -> None:
        await errors.on_error(lost)
        await errors.on_error(lost)
        await errors.on_reconnected()

    # GIVEN a connected client, WHEN its server goes away and it retries, THEN the first error
    #   is a warning and the retry a debug line; the reconnect is one info line
    asyncio.run(outage_and_back())
    first = [
        (logging.WARNING, "nats connection router: ConnectionResetError: reset by peer"),
        (logging.DEBUG, "nats connection router: ConnectionResetError: reset by peer"),
        (logging.INFO, "nats connection router: reconnected"),
    ]
    assert _lines(caplog) == first
    # AND the next outage warns again
    asyncio.run(outage_and_back())
    assert _lines(caplog) == first


def test_the_first_connects_failures_are_debug_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=_LOGGER)
    errors = _ConnectionErrors("api")  # not connected yet: these end in one error instead
    asyncio.run(errors.on_error(ConnectionRefusedError("refused")))
    assert _lines(caplog) == [
        (logging.DEBUG, "nats connection api: ConnectionRefusedError: refused")
    ]
