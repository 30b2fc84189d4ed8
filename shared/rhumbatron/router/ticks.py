"""The sweep's tick arithmetic: which stream a minute visits, and which housekeeping it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rhumbatron.protocol.ids import EVENT_STREAM_COUNT

if TYPE_CHECKING:
    from datetime import datetime

    from rhumbatron.core.settings import Settings

__all__ = ["tick_kind"]


def tick_kind(settings: Settings, now: datetime) -> tuple[int, bool, bool]:
    """``(stream index, maintenance tick?, release-sweep tick?)`` for the minute of ``now``
    (UTC): the stream is the minute of the day mod 8; the release sweep ticks at minutes
    4, 9, 14 … of every hour (``release_sweep_every_min`` = 5)."""
    minute_of_day = now.hour * 60 + now.minute
    every = settings.release_sweep_every_min
    return (
        minute_of_day % EVENT_STREAM_COUNT,
        minute_of_day == settings.maintenance_minute_of_day,
        now.minute % every == every - 1,
    )
