"""The queue handlers' port onto the process: what the agent-wakeups and dead-letter
consumers read, and nothing else. The composition root's runtime satisfies it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings
    from rhumbatron.messaging.queue_consumer import QueueConsumerRuntime
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase

__all__ = ["QueueContext"]


class QueueContext(Protocol):
    """The settings, the clock and sinks, the product database, the queue runtime and the
    actors of one process."""

    settings: Settings
    clock: Clock

    @property
    def metrics_sink(self) -> MetricsSink: ...

    def product(self) -> ProductDatabase: ...

    async def queue_runtime(self) -> QueueConsumerRuntime: ...

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard: ...

    def project_tenant(self, project_id: str) -> str | None: ...
