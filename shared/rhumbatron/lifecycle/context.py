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
    from rhumbatron.lifecycle.world import LifecycleWorld
    from rhumbatron.messaging.commands import CommandBus
    from rhumbatron.messaging.event_log import EventLogClient
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.router.handlers import ProjectViewProjector

__all__ = ["EventReader", "LifecycleContext", "LifecycleWithWorld", "LookupContext"]


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


class HasWorld(Protocol):
    """The lifecycle's reads across a project's actors."""

    @property
    def world(self) -> LifecycleWorld: ...


class EventReader(Protocol):
    """The router's project views and its event log: where an event a request names is."""

    @property
    def projector(self) -> ProjectViewProjector: ...

    async def event_log(self) -> EventLogClient: ...


class LifecycleWithWorld(LifecycleContext, Protocol):
    """A lifecycle context that also reads across the actors (a project's requests)."""

    def lifecycle(self) -> HasWorld: ...


class LookupContext(Protocol):
    """What finding a Change, Task, claim or event reads: the settings, the clock, the
    actors, the lifecycle's world and the router's event reads."""

    settings: Settings
    clock: Clock

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard: ...

    def lifecycle(self) -> HasWorld: ...

    def router(self) -> EventReader: ...
