"""Building the reactions consumer's parts from the composition root.

``EventRouter(reactions=...)`` takes a :class:`~rhumbatron.reactions.consumer.Reactions`;
:func:`reactions_for` builds it from a :class:`~rhumbatron.runtime.bootstrap.Rhumbatron`
and a registry, :func:`no_reactions` is what a router without a registry runs (every event
matches nothing and is acked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from rhumbatron.errors import ConfigurationError
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.consumer import NoSubscriptions, Reactions, ShardFacts
from rhumbatron.reactions.deliveries import ReactionEffects

if TYPE_CHECKING:
    from rhumbatron.reactions.ports import SubscriptionSource
    from rhumbatron.reactions.webhook_ledger import Disablement
    from rhumbatron.reactions.webhook_retries import WebhookRetrier
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["LazyHttpClient", "no_reactions", "reactions_for", "webhook_retrier_for"]


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
    app: Rhumbatron, *, http: LazyHttpClient | None = None, limits: ReactionSettings | None = None
) -> WebhookRetrier:
    """The webhook retry pass of ``app``: its product database, registry and shards."""
    from rhumbatron.reactions.registry import SubscriptionRegistry
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
    app: Rhumbatron,
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


class _Unbound:
    """The effects of a router with no registry: never reached, since nothing matches."""

    def __call__(self) -> httpx.AsyncClient:
        raise ConfigurationError("no reaction registry is bound to this router (reactions=)")

    async def send(self, command: Command) -> object:
        raise ConfigurationError(
            f"no reaction registry is bound to this router; cannot send {command.command_id}"
        )

    def budget_exceeded(self, event: Event, *, subscription_id: str, limit: int, day: str) -> None:
        raise ConfigurationError(
            f"no reaction registry is bound to this router; cannot record {event.event_id}"
        )

    def reaction_disabled(self, disablement: Disablement) -> None:
        raise ConfigurationError(
            "no reaction registry is bound to this router; cannot record the disabling of "
            f"{disablement.subscription_id}"
        )


def no_reactions() -> Reactions:
    """Reactions with no registry: every event matches nothing and is applied."""
    unbound = _Unbound()
    return Reactions(
        registry=NoSubscriptions(),
        effects=ReactionEffects(http=unbound, engine=None, send_command=unbound.send),
        facts=unbound,
    )
