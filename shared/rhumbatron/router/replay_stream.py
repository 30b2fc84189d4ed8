"""The stream rewind's reader: a short-lived replay consumer on an event stream, read up to
the stream's end at the start of the replay (see :mod:`rhumbatron.router.replay`, which says
why a replay does not move the durable cursor).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from rhumbatron.core.progress import ProgressCallback
from rhumbatron.core.settings import Settings
from rhumbatron.errors import MessagingError, NatsUnavailableError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.ids import event_stream_name
from rhumbatron.router.event_router import EventRouter
from rhumbatron.router.records import decode_records
from rhumbatron.router.replay_batches import ReplayTally, replay_batch

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.js.api import ConsumerConfig, ConsumerInfo

    from rhumbatron.messaging.pull import Puller

__all__ = ["RewindTally", "nats_errors", "read_replay_consumer", "undelivered_count"]


class RewindTally(ReplayTally, Protocol):
    """What a rewind reads and writes on its report besides the batch counts: where the read
    began (``first_seq``) and ends (``last_seq``), or the time it starts at (``start``)."""

    first_seq: int | None
    last_seq: int | None
    start: datetime | None


async def read_replay_consumer(
    router: EventRouter,
    nc: NATS,
    stream_index: int,
    subscription: Subscription,
    report: RewindTally,
    *,
    progress: ProgressCallback | None = None,
) -> None:
    """Create the replay consumer, feed its batches to the subscription up to
    ``report.last_seq``, and delete it (also on failure); ``progress`` hears the stream
    positions read after each batch."""
    from rhumbatron.messaging.pull import Puller

    settings = router.settings
    stream = event_stream_name(stream_index)
    assert report.last_seq is not None
    name = f"replay-{subscription.value}-{uuid.uuid4().hex[:12]}"
    config = _replay_consumer_config(settings, name, subscription, report)
    js = nc.jetstream()
    await js.add_consumer(stream, config)
    puller = Puller(
        nc,
        stream,
        name,
        settings.router_fetch_timeout_s,
        keep_late_s=settings.router_ack_wait_s / 2,
    )

    async def undelivered() -> int:
        return undelivered_count(await js.consumer_info(stream, name))

    try:
        await _feed(
            router,
            puller,
            stream_index,
            subscription,
            report,
            undelivered=undelivered,
            progress=progress,
        )
    finally:
        await puller.close()
        with contextlib.suppress(Exception):
            # Best effort: the inactivity threshold removes it anyway.
            await js.delete_consumer(stream, name)


def undelivered_count(info: ConsumerInfo) -> int:
    """What a consumer still owes its reader: the records it has not delivered yet and those
    it delivered that were not acknowledged (a pull the reader gave up on, answered late).
    A rewind whose pull brought nothing ends only when this is 0."""
    return int(info.num_pending or 0) + int(info.num_ack_pending or 0)


def _replay_consumer_config(
    settings: Settings, name: str, subscription: Subscription, report: RewindTally
) -> ConsumerConfig:
    """The replay consumer: from the report's start time or first sequence, each record
    read once, removed by the server once idle."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    by_time = report.start is not None
    return ConsumerConfig(
        name=name,
        description=f"replay of {subscription.value} (deleted when the replay ends)",
        deliver_policy=DeliverPolicy.BY_START_TIME if by_time else DeliverPolicy.BY_START_SEQUENCE,
        opt_start_time=report.start if by_time else None,
        opt_start_seq=None if by_time else report.first_seq,
        # Ack-all on the last record of each batch: one ack per batch, and nothing is ever
        # redelivered into a later batch (max_deliver=1) — the replay reads each record once.
        ack_policy=AckPolicy.ALL,
        ack_wait=settings.router_ack_wait_s,
        max_deliver=1,
        max_ack_pending=settings.router_max_ack_pending,
        # A replay that dies leaves a consumer that the server removes once idle this long.
        inactive_threshold=settings.router_ack_wait_s,
    )


async def _feed(
    router: EventRouter,
    puller: Puller,
    stream_index: int,
    subscription: Subscription,
    report: RewindTally,
    *,
    undelivered: Callable[[], Awaitable[int]],
    progress: ProgressCallback | None,
) -> None:
    """Pull the replay consumer's batches and replay each, up to ``report.last_seq``. A pull
    that brings nothing ends the read only when the consumer has nothing ``undelivered``
    (the records up to ``last_seq`` are gone: removed since the replay began): a server slow
    to answer, or not answering, must not end a replay short as if it were whole."""
    last_seq = report.last_seq
    assert last_seq is not None
    first_batch = True
    while True:
        messages = await puller.pull(router.settings.router_fetch_max_records)
        if not messages:
            if await undelivered():
                continue  # late: the next pull takes what arrives meanwhile
            break
        await max(messages, key=_seq).ack()
        decoded = decode_records(messages, stream_index, router.project_owners)
        records = [r for r in decoded if r.stream_seq <= last_seq]
        if records and first_batch:
            # Where the read really began: the first event at the time asked, or the
            # stream's first one when the sequence asked has already expired.
            report.first_seq = min(r.stream_seq for r in records)
            first_batch = False
        await replay_batch(router, stream_index, subscription, records, report)
        read_to = max(_seq(m) for m in messages)
        if progress is not None and report.first_seq is not None:
            first = report.first_seq
            progress(min(read_to, last_seq) - first + 1, last_seq - first + 1)
        if read_to >= last_seq:
            break


def _seq(msg: Msg) -> int:
    return msg.metadata.sequence.stream


@contextlib.contextmanager
def nats_errors(stream: str) -> Iterator[None]:
    """NATS and JetStream failures of a rewind of ``stream`` as the package's errors."""
    from nats.errors import Error as NatsError
    from nats.js.errors import APIError, NotFoundError

    try:
        yield
    except NotFoundError as exc:
        raise MessagingError(
            f"stream {stream} does not exist ({exc.description}); create the streams "
            "(rhumbatron up, or any runtime's ensure_streams) and replay again"
        ) from exc
    except APIError as exc:
        raise MessagingError(
            f"JetStream refused the replay of {stream}: {exc.description} (code {exc.err_code})"
        ) from exc
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"cannot reach JetStream to replay {stream}: {type(exc).__name__}: {exc}; "
            "replay again once NATS answers (the claims make a repeat harmless)"
        ) from exc
