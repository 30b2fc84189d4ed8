"""Time as a port: production reads the system clock, tests move a :class:`ManualClock`.

Every duration and cap in the specification is measured against an injected clock, so a test
can jump a backoff of five minutes without sleeping.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock", "parse_timestamp", "utc_day"]


class Clock(Protocol):
    """Wall-clock time in UTC."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass: a real wait on the system clock, a jump on a manual one."""
        ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; for tests and deterministic replays."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError(f"ManualClock start {start!r} must be timezone-aware (UTC)")

    def now(self) -> datetime:
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Move forward by ``seconds`` at once, and let other tasks run."""
        self.advance(seconds)
        await asyncio.sleep(0)

    def advance(self, seconds: float = 0.0, **kwargs: float) -> datetime:
        """Move forward by ``seconds`` (and/or ``minutes=``, ``hours=``, ``days=``)."""
        delta = timedelta(seconds=seconds, **kwargs)
        if delta < timedelta(0):
            raise ValueError(f"a clock never moves backwards (asked to move by {delta})")
        self._now += delta
        return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when``; it may not be earlier than now."""
        if when < self._now:
            raise ValueError(f"a clock never moves backwards ({when} is before {self._now})")
        self._now = when


def utc_day(moment: datetime) -> str:
    """The UTC calendar day of ``moment`` as ``YYYY-MM-DD``: the unit of every daily cap."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def parse_timestamp(value: str | None) -> datetime | None:
    """A stored ISO-8601 timestamp; empty or unreadable is None (the row records no time)."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
