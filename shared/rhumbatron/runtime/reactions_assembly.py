"""Building the reactions consumer's parts in the composition root.

:func:`reactions_for` builds the :class:`~rhumbatron.reactions.consumer.Reactions` the
router's ``reactions`` handler runs, from the runtime (a :class:`ReactionsHost`) and a
registry; :func:`webhook_retrier_for` the sweep's webhook retry pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import httpx

from rhumbatron.protocol.envelopes import Command
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.consumer import Reactions
from rhumbatron.reactions.deliveries import ReactionEffects
from rhumbatron.reactions.reaction_facts import ShardFacts

if TYPE_CHECKING:
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.reactions.ports import SubscriptionSource
    from rhumbatron.reactions.webhook_retries import WebhookRetrier
    from rhumbatron.runtime.lifecycle_assembly import Lifecycle

__all__ = ["LazyHttpClient", "ReactionsHost", "reactions_for", "webhook_retrier_for"]


class ReactionsHost(Protocol):
    """What the reactions' parts are built from: the runtime's settings, clock and sinks, its
    product database, its project shards and its lifecycle (the workflow engine, the sender
    of agent wakes)."""

    settings: Settings
    clock: Clock

    @property
    def metrics_sink(self) -> MetricsSink: ...

    def product(self) -> ProductDatabase: ...

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard: ...

    def lifecycle(self) -> Lifecycle: ...


@dataclass
class LazyHttpClient:
    """One :class:`httpx.AsyncClient` for every webhook reaction of a process, made on first
    use (nothing heavy at import or bootstrap); :meth:`aclose` closes it."""

    _client: httpx.AsyncClient | None = field(default=None, init=False)

    def __call__(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def webhook_retrier_for(
    app: ReactionsHost,
    *,
    http: LazyHttpClient | None = None,
    limits: ReactionSettings | None = None,
) -> WebhookRetrier:
    """The webhook retry pass of ``app``: its product database, registry and shards."""
    from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
    from rhumbatron.reactions.webhook_retries import WebhookRetrier

    return WebhookRetrier(
        product=app.product(),
        registry=SubscriptionRegistry(app.product(), app.settings, app.clock),
        http=http or LazyHttpClient(),
        facts=ShardFacts(app.resource_shard, app.clock),
        settings=app.settings,
        clock=app.clock,
        metrics_sink=app.metrics_sink,
        limits=limits or ReactionSettings(),
    )


def reactions_for(
    app: ReactionsHost,
    registry: SubscriptionSource,
    *,
    http: LazyHttpClient | None = None,
    limits: ReactionSettings | None = None,
) -> Reactions:
    """The reactions of ``app``: its workflow engine, its lifecycle sender for wakes, its
    project shards for ``budget.exceeded``."""
    lifecycle = app.lifecycle()

    async def send(command: Command) -> object:
        return await lifecycle.sender.send(command)

    return Reactions(
        registry=registry,
        effects=ReactionEffects(
            http=http or LazyHttpClient(), engine=lifecycle.engine, send_command=send
        ),
        facts=ShardFacts(app.resource_shard, app.clock),
        limits=limits or ReactionSettings(),
    )
