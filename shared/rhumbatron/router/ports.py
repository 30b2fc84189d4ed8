"""The router's ports: what its sweep housekeeping reads of the router, and what a nudge
drives. :class:`~rhumbatron.router.event_router.EventRouter` satisfies both; the modules that
take them (``lag``, ``maintenance``, ``nudge``) need not import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from rhumbatron.actors.storage import SqliteStore
    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings
    from rhumbatron.messaging.event_log import ConsumerLag, Subscription
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.router.handlers import ProjectViewProjector, RecordHandler, RunContext
    from rhumbatron.router.reports import RunReport, SubscriptionReport
    from rhumbatron.router.stream_state import StreamState

__all__ = ["ConsumingRouter", "MaintainedRouter", "NudgedRouter", "TurnedRouter"]


class MaintainedRouter(Protocol):
    """What a sweep tick's lag recording and the daily maintenance read of the router."""

    @property
    def settings(self) -> Settings: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def product(self) -> SqliteStore: ...

    @property
    def metrics_sink(self) -> MetricsSink: ...

    @property
    def s3(self) -> Callable[[], S3Client]: ...

    @property
    def outbox_backlog(self) -> Callable[[], dict[str, int]] | None: ...

    @property
    def prune_reaction_history(self) -> Callable[[float, int], int]: ...

    def stream_state(self, stream_index: int) -> StreamState: ...

    @property
    def projector(self) -> ProjectViewProjector: ...

    async def consumer_lags(self) -> list[ConsumerLag]: ...


class ConsumingRouter(Protocol):
    """What the passes over other streams (``other_streams``) drive: a subscription's
    consumes on a stream, and its handler (the archiver's objects written)."""

    @property
    def settings(self) -> Settings: ...

    def run_context(self, stream_index: int) -> RunContext: ...

    def handler(self, stream_index: int, subscription: Subscription) -> RecordHandler: ...

    async def consume(
        self,
        run: RunContext,
        subscription: Subscription,
        *,
        consumes: int,
        batch: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> SubscriptionReport: ...

    async def release_held(self, stream_index: int | None = None) -> int: ...


class NudgedRouter(Protocol):
    """What a nudge runs: the projector and the causal router of one stream."""

    async def nudge(
        self,
        stream_index: int,
        *,
        should_stop: Callable[[], bool] | None = None,
        settle: bool = True,
    ) -> RunReport: ...

    async def release_held(self, stream_index: int | None = None) -> int: ...


class TurnedRouter(NudgedRouter, Protocol):
    """What a nudge in its stream's turn needs (``nudge_turn``): the clock and the stream's
    state file, where the turn is kept."""

    @property
    def clock(self) -> Clock: ...

    def stream_state(self, stream_index: int) -> StreamState: ...
