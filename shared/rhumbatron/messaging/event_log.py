"""The event log as the router reads it: 8 streams × 5 subscriptions, one durable each.

Each subscription is a durable JetStream pull consumer named after it (``causal-router`` …)
on each ``EVENTS_NN`` stream, with explicit ack and the ack wait from the settings. The client
creates (or updates) a consumer at its first read in a process, as the spec's EventLogClient
does, and pulls at most ``router_fetch_max_records`` records at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from rhumbatron.core.settings import Settings
from rhumbatron.errors import ConsumerGoneError
from rhumbatron.messaging.pull import ConsumerChange, Puller, ensure_consumer
from rhumbatron.protocol.ids import event_stream_name

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.js.api import ConsumerConfig

__all__ = ["ConsumerLag", "EventLogClient", "Subscription", "consumer_config"]


class Subscription(StrEnum):
    """The subscriptions of every event stream: the spec's four, and ``reactions`` (seed 002:
    every reaction is one more consumer with a durable cursor, issue #7)."""

    CAUSAL_ROUTER = "causal-router"
    PROJECT_VIEW_PROJECTOR = "project-view-projector"
    AUDIT_ARCHIVER = "audit-archiver"
    ANALYTICS_PROJECTOR = "analytics-projector"
    REACTIONS = "reactions"


@dataclass(frozen=True, slots=True)
class ConsumerLag:
    """How far one durable consumer is behind: records not yet delivered, and delivered
    records not yet acknowledged."""

    stream: str
    consumer: str
    num_pending: int
    num_ack_pending: int
    exists: bool = True


def consumer_config(subscription: Subscription, settings: Settings) -> ConsumerConfig:
    """The durable pull consumer of ``subscription``: explicit ack, the spec's ack wait, and
    no server-side delivery limit (the router counts failures itself and dead-letters on the
    5th, so JetStream must never silently stop redelivering)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    return ConsumerConfig(
        durable_name=subscription.value,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=settings.router_ack_wait_s,
        max_deliver=-1,
        max_ack_pending=settings.router_max_ack_pending,
    )


@dataclass
class EventLogClient:
    """Reads the event streams for the router over one NATS connection."""

    nc: NATS
    settings: Settings
    _pullers: dict[tuple[int, Subscription], Puller] = field(default_factory=dict)
    consumer_changes: dict[tuple[int, Subscription], ConsumerChange] = field(default_factory=dict)

    async def _puller(self, stream_index: int, subscription: Subscription) -> Puller:
        key = (stream_index, subscription)
        puller = self._pullers.get(key)
        if puller is None:
            stream = event_stream_name(stream_index)
            self.consumer_changes[key] = await ensure_consumer(
                self.nc.jetstream(), stream, consumer_config(subscription, self.settings)
            )
            puller = Puller(
                self.nc,
                stream,
                subscription.value,
                self.settings.router_fetch_timeout_s,
                keep_late_s=self.settings.router_ack_wait_s / 2,
            )
            self._pullers[key] = puller
        return puller

    async def fetch(
        self, stream_index: int, subscription: Subscription, max_records: int
    ) -> list[Msg]:
        """At most ``max_records`` records of ``subscription`` on stream ``stream_index``.

        Never more than ``router_fetch_max_records`` (the spec's 100). An empty list is a
        normal outcome.
        """
        batch = min(max_records, self.settings.router_fetch_max_records)
        puller = await self._puller(stream_index, subscription)
        try:
            return await puller.pull(batch)
        except ConsumerGoneError:
            # Deleted under a warm process: create it again (from the stream's start, as at
            # a first read; the claims make the re-read apply nothing twice) and pull once more.
            await puller.close()
            del self._pullers[(stream_index, subscription)]
            puller = await self._puller(stream_index, subscription)
            return await puller.pull(batch)

    def hold(self, stream_index: int, subscription: Subscription, messages: list[Msg]) -> None:
        """Keep ``messages`` of the last fetch, unsettled, for the next fetch of the same
        subscription and stream in this process (:meth:`Puller.hold`)."""
        puller = self._pullers.get((stream_index, subscription))
        if puller is not None:
            puller.hold(messages)

    async def prefetch(
        self, stream_index: int, subscription: Subscription, max_records: int
    ) -> None:
        """Ask now for the next fetch's records (:meth:`Puller.prefetch`), so it finds them
        here; a consumer not read yet in this process is left alone."""
        puller = self._pullers.get((stream_index, subscription))
        if puller is not None:
            await puller.prefetch(min(max_records, self.settings.router_fetch_max_records))

    async def release_held(self, stream_index: int, subscription: Subscription) -> list[Msg]:
        """Every message kept for a next fetch of ``subscription`` on stream
        ``stream_index``, no longer kept: the caller nacks them, so any reader gets them at
        once."""
        puller = self._pullers.get((stream_index, subscription))
        return [] if puller is None else await puller.release()

    async def lag(self, stream_index: int, subscription: Subscription) -> ConsumerLag:
        """The consumer's lag; a consumer not created yet lags by the whole stream."""
        from nats.js.errors import NotFoundError

        js = self.nc.jetstream()
        stream = event_stream_name(stream_index)
        try:
            info = await js.consumer_info(stream, subscription.value)
        except NotFoundError:
            state = (await js.stream_info(stream)).state
            return ConsumerLag(stream, subscription.value, state.messages, 0, exists=False)
        return ConsumerLag(
            stream, subscription.value, info.num_pending or 0, info.num_ack_pending or 0
        )

    async def read_at(self, stream_index: int, stream_seq: int) -> bytes | None:
        """The record stored at ``stream_seq`` of stream ``stream_index``; None when the
        stream no longer holds it (its max age, or a purge)."""
        from nats.js.errors import NotFoundError

        try:
            message = await self.nc.jetstream().get_msg(
                event_stream_name(stream_index), seq=stream_seq
            )
        except NotFoundError:
            return None
        return bytes(message.data or b"")

    async def close(self) -> None:
        for puller in self._pullers.values():
            await puller.close()
        self._pullers.clear()
