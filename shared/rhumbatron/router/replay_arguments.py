"""A replay's arguments, checked: the subscription, the stream, and times that are
timezone-aware and have a UTC day (see :mod:`rhumbatron.router.replay`).
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from rhumbatron.errors import ReplayError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT

__all__ = ["check_aware", "check_stream", "parse_subscription", "utc_day_of"]


def parse_subscription(value: Subscription | str) -> Subscription:
    try:
        return Subscription(value)
    except ValueError:
        raise ReplayError(
            f"subscription {value!r} is unknown; pass one of "
            f"{', '.join(s.value for s in Subscription)}"
        ) from None


def check_stream(stream_index: int) -> None:
    if not 0 <= stream_index < EVENT_STREAM_COUNT:
        raise ReplayError(
            f"stream {stream_index} is outside 0..{EVENT_STREAM_COUNT - 1}; pass the index of "
            "an event stream (EVENTS_00 … EVENTS_07)"
        )


def check_aware(name: str, moment: datetime) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ReplayError(
            f"{name}={moment.isoformat()} has no timezone; pass a timezone-aware time (UTC)"
        )


def utc_day_of(moment: datetime, name: str) -> date:
    try:
        return moment.astimezone(UTC).date()
    except OverflowError:
        raise ReplayError(
            f"{name}={moment.isoformat()} has no UTC day (it is outside the calendar's range); "
            "pass a time between the years 1 and 9999 in UTC"
        ) from None
