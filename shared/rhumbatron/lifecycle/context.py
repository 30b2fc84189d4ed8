"""The lifecycle's port onto the process: what its requests, commands and integration module
read, and nothing else. The composition root's runtime satisfies it; a test may pass its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rhumbatron.actors.project_root import ProjectRoot
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings
    from rhumbatron.messaging.commands import CommandBus
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase

__all__ = ["LifecycleContext"]


class LifecycleContext(Protocol):
    """The settings, the clock and sinks, the product database, the command bus and the
    actors of one process."""

    settings: Settings
    clock: Clock

    @property
    def metrics_sink(self) -> MetricsSink: ...

    def product(self) -> ProductDatabase: ...

    async def command_bus(self) -> CommandBus: ...

    def project_root(self, project_id: str) -> ProjectRoot: ...

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard: ...

    def project_tenant(self, project_id: str) -> str | None: ...
