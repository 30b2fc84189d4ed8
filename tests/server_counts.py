"""Waiting, within a bound, for a count JetStream keeps to reach its expected value.

An ack or a term is flushed to the server before a poll returns, but the server applies it on
the consumer's own goroutine: a work-queue message leaves the stream a moment later. A test
that reads the stream's counts right after a consumer ran reads them through this helper.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_for(check: Callable[[], Awaitable[bool]], *, timeout_s: float, what: str) -> None:
    """Poll ``check`` until it holds; an AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)  # polling server state with a deadline, not a fixed wait


async def settles_to(read: Callable[[], Awaitable[object]], expected: object) -> None:
    """Assert that ``read()`` reaches ``expected`` within 5 s (pytest shows the last value)."""
    last: object = None

    async def reached() -> bool:
        nonlocal last
        last = await read()
        return last == expected

    try:
        await wait_for(reached, timeout_s=5.0, what=f"{expected!r}")
    except AssertionError:
        assert last == expected  # pytest shows the difference
        raise
