"""What the reactions consumer needs from the rest of the system, as small structural ports.

The subscription registry (``reactions.subscription_registry``) is written alongside this
consumer; the consumer depends only on the shape of its answer, so any registry with a
``matching`` method serves, including a test's own. The three reaction kinds are told apart
by ``kind``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.webhook_ledger import Disablement

__all__ = [
    "AgentReactionLike",
    "FactSink",
    "GovernanceLike",
    "ReactionLike",
    "SubscriptionLike",
    "SubscriptionSource",
    "WebhookReactionLike",
    "WorkflowReactionLike",
]


class AgentReactionLike(Protocol):
    """Wake an agent (``agent.wake`` through the normal command path)."""

    @property
    def kind(self) -> Literal["agent"]: ...

    @property
    def agent_id(self) -> str: ...


class WebhookReactionLike(Protocol):
    """POST a signed, pointer-only body to ``url``; ``secrets`` newest first (two in rotation)."""

    @property
    def kind(self) -> Literal["webhook"]: ...

    @property
    def url(self) -> str: ...

    @property
    def secrets(self) -> Sequence[str]: ...

    @property
    def timeout_s(self) -> float | None:
        """Its own bound on one request (None: ``webhook_timeout_s``)."""
        ...


class WorkflowReactionLike(Protocol):
    """Start the engine's ``workflow`` once per (event, subscription)."""

    @property
    def kind(self) -> Literal["workflow"]: ...

    @property
    def workflow(self) -> str: ...


ReactionLike = AgentReactionLike | WebhookReactionLike | WorkflowReactionLike


class GovernanceLike(Protocol):
    """A subscription's governance: its cooldown (None: the default) and whether it is on."""

    @property
    def cooldown_s(self) -> float | None: ...

    @property
    def enabled(self) -> bool: ...


class SubscriptionLike(Protocol):
    """One subscription as the registry answers it."""

    @property
    def subscription_id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def reaction(self) -> ReactionLike: ...

    @property
    def governance(self) -> GovernanceLike: ...

    @property
    def endpoint_disabled(self) -> object | None:
        """Set when the platform disabled the subscription for a failing endpoint: its
        matches are kept as skipped deliveries (a webhook's), to be replayed."""
        ...


class SubscriptionSource(Protocol):
    """The registry as the consumer asks it: the tenant's subscriptions matching an event."""

    def matching(self, tenant_id: str, event: Event) -> Sequence[SubscriptionLike]:
        """Every enabled subscription of ``tenant_id`` whose selector matches ``event``, and
        every one disabled for a failing endpoint (``endpoint_disabled``)."""
        ...


class FactSink(Protocol):
    """Writes a fact the reactions record about themselves (``budget.exceeded``) through an
    actor's outbox, so it reaches the log like every other fact."""

    def budget_exceeded(
        self,
        event: Event,
        *,
        subscription_id: str,
        limit: int,
        day: str,
    ) -> None:
        """Record that the tenant of ``event`` ran out of its daily reaction budget."""
        ...

    def reaction_disabled(self, disablement: Disablement) -> None:
        """Record that a webhook subscription was disabled (``reaction.disabled``)."""
        ...
