"""Every durable cursor of the deployment and how far behind it is: ``GET /consumers``.

A durable cursor is a JetStream durable consumer the system reads with: one per event
stream and :class:`~rhumbatron.messaging.event_log.Subscription` (``EVENTS_NN`` ×
``causal-router`` …), and one per command queue (``q-<queue>`` on ``COMMANDS``).
:func:`read_cursors` lists them all, in that order, each with its lag as JetStream reports
it in ``consumer_info``: records not yet delivered (``num_pending``), delivered and not yet
acknowledged (``num_ack_pending``), and the stream sequence and time of its last delivery.

The list is built from the enum and the queue table, never from what the server happens to
hold: a cursor not created yet is listed with ``exists = False`` and lags by every record it
would read, so a subscription or queue that never started shows up as lag, not as nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS, consumer_name

if TYPE_CHECKING:
    from nats.js import JetStreamContext

__all__ = [
    "CursorKind",
    "CursorLag",
    "DurableCursor",
    "durable_cursors",
    "find_cursor",
    "pause_cursor",
    "read_cursors",
    "resume_cursor",
]


class CursorKind(StrEnum):
    """What a cursor reads: an event stream for a subscription, or a command queue."""

    EVENT = "event"
    COMMAND = "command"


@dataclass(frozen=True, slots=True)
class DurableCursor:
    """One durable consumer the system reads with; ``reads`` is its subscription or queue."""

    kind: CursorKind
    stream: str
    consumer: str
    reads: str
    #: The subject a command cursor is filtered to; None for an event cursor (whole stream).
    filter_subject: str | None = None


@dataclass(frozen=True, slots=True)
class CursorLag:
    """A cursor's lag as JetStream reports it.

    ``last_delivered_seq`` is the stream sequence of the last record delivered (0: none yet),
    ``last_delivered_at`` when that was (None when the server has no time for it). A cursor
    that does not exist yet has ``exists = False``, ``num_pending`` = every record it would
    read, and nothing delivered.
    """

    cursor: DurableCursor
    num_pending: int
    num_ack_pending: int
    last_delivered_seq: int
    last_delivered_at: datetime | None
    exists: bool = True
    #: Until when an operator paused it (JetStream delivers nothing to it meanwhile).
    paused_until: datetime | None = None


def durable_cursors() -> list[DurableCursor]:
    """Every durable cursor: each event stream × each subscription, then each command queue.

    Iterates :class:`Subscription` and the queue table, so a subscription or queue added
    there is listed without a change here.
    """
    events = [
        DurableCursor(
            CursorKind.EVENT, event_stream_name(index), subscription.value, subscription.value
        )
        for index in range(EVENT_STREAM_COUNT)
        for subscription in Subscription
    ]
    commands = [
        DurableCursor(
            CursorKind.COMMAND,
            COMMAND_STREAM,
            consumer_name(queue),
            queue,
            filter_subject=command_subject(queue),
        )
        for queue in QUEUE_CONSUMERS
    ]
    return events + commands


async def read_cursors(js: JetStreamContext) -> list[CursorLag]:
    """The lag of every durable cursor (:func:`durable_cursors` order), read side by side.

    JetStream errors other than "not found" (no responders, a timeout) propagate: the caller
    decides whether NATS being down is a 503 or a gap in a metric.
    """
    return list(await asyncio.gather(*(_read(js, cursor) for cursor in durable_cursors())))


async def _read(js: JetStreamContext, cursor: DurableCursor) -> CursorLag:
    from nats.js.errors import NotFoundError

    try:
        info = await js.consumer_info(cursor.stream, cursor.consumer)
    except NotFoundError:
        return CursorLag(cursor, await _unread(js, cursor), 0, 0, None, exists=False)
    delivered = info.delivered
    return CursorLag(
        cursor,
        num_pending=info.num_pending or 0,
        num_ack_pending=info.num_ack_pending or 0,
        last_delivered_seq=delivered.stream_seq if delivered is not None else 0,
        last_delivered_at=delivered.last_active if delivered is not None else None,
        paused_until=_paused_until(info),
    )


def _paused_until(info: object) -> datetime | None:
    """When a paused consumer resumes by itself (None: it is not paused)."""
    if not getattr(info, "paused", False):
        return None
    until = getattr(getattr(info, "config", None), "pause_until", None)
    return datetime.fromisoformat(until) if isinstance(until, str) else None


def find_cursor(stream: str, consumer: str) -> DurableCursor:
    """The system's durable cursor ``consumer`` on ``stream``; raises
    :class:`~rhumbatron.errors.CursorNotFoundError` for any other (an operator may pause
    only the system's own cursors)."""
    from rhumbatron.errors import CursorNotFoundError

    for cursor in durable_cursors():
        if (cursor.stream, cursor.consumer) == (stream, consumer):
            return cursor
    raise CursorNotFoundError(
        f"no durable cursor {consumer!r} on {stream!r}; GET /consumers lists them"
    )


async def pause_cursor(js: JetStreamContext, cursor: DurableCursor, until: datetime) -> datetime:
    """Pause ``cursor`` until ``until`` (UTC): JetStream delivers it nothing meanwhile, so
    its subscription or queue waits, nothing lost; it resumes by itself then. Returns
    ``until`` as the server keeps it."""
    answer = await js.pause_consumer(
        cursor.stream, cursor.consumer, until.isoformat().replace("+00:00", "Z")
    )
    return datetime.fromisoformat(str(answer.pause_until)) if answer.pause_until else until


async def resume_cursor(js: JetStreamContext, cursor: DurableCursor) -> None:
    """Resume a paused ``cursor`` now (a cursor not paused stays as it is)."""
    await js.resume_consumer(cursor.stream, cursor.consumer)


async def _unread(js: JetStreamContext, cursor: DurableCursor) -> int:
    """What a cursor not created yet would read: the whole stream, or its queue's subject."""
    from nats.js.errors import NotFoundError

    try:
        info = await js.stream_info(cursor.stream, subjects_filter=cursor.filter_subject)
    except NotFoundError:
        # The stream itself is not there yet (streams not ensured): nothing to read.
        return 0
    if cursor.filter_subject is None:
        return info.state.messages
    return (info.state.subjects or {}).get(cursor.filter_subject, 0)
