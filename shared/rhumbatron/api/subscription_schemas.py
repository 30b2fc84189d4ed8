"""The subscriptions API's request and response bodies: frozen pydantic models, camelCase on
the wire, like :mod:`rhumbatron.api.schemas`.

A webhook's secrets are never shown, except one the very request generated (shown once); the
request model puts no bounds on them, as a refused value is quoted in a 422 and a secret
must never be (the route checks their number, without quoting them).
"""

from datetime import UTC, datetime
from typing import Annotated, Literal, Self, TypeAlias

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.agents.url_safety import display_url
from rhumbatron.protocol.values import AGENT_ID
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import (
    MAX_COOLDOWN_S,
    SUBSCRIPTION_NAME_PATTERN,
    WORKFLOW_NAME_PATTERN,
    AgentReaction,
    SubscriptionRecord,
    WebhookReaction,
)
from rhumbatron.reactions.webhook_ledger import DeliveryStatus, WebhookDelivery

__all__ = [
    "AgentReactionBody",
    "CreateSubscriptionRequest",
    "DeliveryBody",
    "DeliveryListBody",
    "EndpointDisabledBody",
    "GovernanceBody",
    "ReactionBody",
    "ReactionRequest",
    "ReplaySkippedBody",
    "SubscriptionBody",
    "SubscriptionListBody",
    "UpdateSubscriptionRequest",
    "WebhookReactionBody",
    "WebhookReactionRequest",
    "WorkflowReactionBody",
]

#: The agent registry's alphabet, anchored for a JSON schema.
_AGENT_ID = AGENT_ID


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class AgentReactionBody(_Wire):
    """Wake an Agent of the subscription's tenant."""

    kind: Literal["agent"]
    agent_id: str = Field(pattern=_AGENT_ID)


class WorkflowReactionBody(_Wire):
    """Start a workflow, once per matched fact."""

    kind: Literal["workflow"]
    workflow: str = Field(pattern=WORKFLOW_NAME_PATTERN)


class WebhookReactionRequest(_Wire):
    """POST the fact to ``url``, signed with ``secrets``; without them, one is generated and
    shown once (creating the same subscription again keeps it)."""

    kind: Literal["webhook"]
    url: str = Field(min_length=1, max_length=2048)
    # No bounds here: a refused value is quoted in a 422, and a secret must never be.
    secrets: list[str] | None = Field(
        default=None, description="1 or 2 (during a rotation), newest first: whsec_..."
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Bound on one POST, in seconds; at most the platform's (the default).",
    )


class WebhookReactionBody(_Wire):
    """A webhook reaction as shown: no secret, except one this request generated."""

    kind: Literal["webhook"]
    url: str = Field(description="Without user info or query, which may hold credentials.")
    secret_count: int = Field(description="How many secrets sign its POSTs (2 in a rotation).")
    secret: str | None = Field(default=None, description="A generated secret, shown once.")
    timeout_s: float | None = None


ReactionRequest: TypeAlias = Annotated[
    AgentReactionBody | WebhookReactionRequest | WorkflowReactionBody,
    Field(discriminator="kind"),
]
ReactionBody: TypeAlias = Annotated[
    AgentReactionBody | WebhookReactionBody | WorkflowReactionBody,
    Field(discriminator="kind"),
]


class GovernanceBody(_Wire):
    """Whether the subscription reacts, and the seconds after a reaction in which further
    matches do not react."""

    cooldown_s: int = Field(default=0, ge=0, le=MAX_COOLDOWN_S)
    enabled: bool = True


class CreateSubscriptionRequest(_Wire):
    """A subscription of the caller's tenant: what it selects, how it reacts, its governance.
    The same request again is answered 200 with the stored subscription."""

    name: str = Field(pattern=SUBSCRIPTION_NAME_PATTERN, description="Unique in the tenant.")
    selector: Selector = Field(
        description="Kind patterns (task.failed, task.*, *.completed) and a filter of "
        "subject.<field> or payload.<field> to a value or a list of values; `rhumbatron kinds` "
        "lists the kinds and their fields."
    )
    reaction: ReactionRequest
    governance: GovernanceBody = GovernanceBody()


class UpdateSubscriptionRequest(_Wire):
    """The governance to change; a field left out stays as it is."""

    enabled: bool | None = None
    cooldown_s: int | None = Field(default=None, ge=0, le=MAX_COOLDOWN_S)


class EndpointDisabledBody(_Wire):
    """Why the platform disabled a webhook subscription: its endpoint answered 410 Gone
    (``gone``), or failed every attempt through the disable window (``failing``)."""

    reason: Literal["gone", "failing"]
    detail: str
    disabled_at: datetime


class SubscriptionBody(_Wire):
    """A subscription; ``endpointDisabled`` is set while the platform has it disabled."""

    subscription_id: str
    tenant_id: str
    name: str
    selector: Selector
    reaction: ReactionBody
    governance: GovernanceBody
    created_at: datetime
    updated_at: datetime
    endpoint_disabled: EndpointDisabledBody | None = None

    @classmethod
    def of(cls, record: SubscriptionRecord, *, generated_secret: str | None = None) -> Self:
        """``record`` as shown: no secret, except ``generated_secret`` (shown once)."""
        reaction: AgentReactionBody | WebhookReactionBody | WorkflowReactionBody
        if isinstance(record.reaction, AgentReaction):
            reaction = AgentReactionBody(kind="agent", agent_id=record.reaction.agent_id)
        elif isinstance(record.reaction, WebhookReaction):
            reaction = WebhookReactionBody(
                kind="webhook",
                url=display_url(record.reaction.url),
                secret_count=len(record.reaction.secrets),
                secret=generated_secret,
                timeout_s=record.reaction.timeout_s,
            )
        else:
            reaction = WorkflowReactionBody(kind="workflow", workflow=record.reaction.workflow)
        return cls(
            subscription_id=record.subscription_id,
            tenant_id=record.tenant_id,
            name=record.name,
            selector=record.selector,
            reaction=reaction,
            governance=GovernanceBody(
                cooldown_s=record.governance.cooldown_s, enabled=record.governance.enabled
            ),
            created_at=record.created_at,
            updated_at=record.updated_at,
            endpoint_disabled=None
            if record.endpoint_disabled is None
            else EndpointDisabledBody(
                reason=record.endpoint_disabled.reason,
                detail=record.endpoint_disabled.detail,
                disabled_at=record.endpoint_disabled.disabled_at,
            ),
        )


class SubscriptionListBody(_Wire):
    """Subscriptions by tenant, then name."""

    items: list[SubscriptionBody]


class DeliveryBody(_Wire):
    """One webhook delivery: ``webhookId`` is the key the receiver dedupes on."""

    webhook_id: str
    event_id: str
    kind: str = Field(description="The event's kind.")
    status: DeliveryStatus = Field(
        description="delivered; retrying (nextAttemptAt says when); dead (a dead letter is "
        "open: Retry or Dismiss it); skipped (kept while the endpoint was disabled: replay it)."
    )
    attempts: int
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    last_status_code: int | None = None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, delivery: WebhookDelivery) -> Self:
        """``delivery`` as shown, its epoch seconds as UTC times."""

        def at(seconds: float | None) -> datetime | None:
            return None if seconds is None else datetime.fromtimestamp(seconds, UTC)

        return cls(
            webhook_id=delivery.delivery_key,
            event_id=delivery.event_id,
            kind=delivery.event_type,
            status=delivery.status,
            attempts=delivery.attempts,
            next_attempt_at=at(delivery.next_attempt_at_s),
            last_error=delivery.last_error,
            last_status_code=delivery.last_status_code,
            created_at=datetime.fromtimestamp(delivery.created_at_s, UTC),
            updated_at=datetime.fromtimestamp(delivery.updated_at_s, UTC),
        )


class DeliveryListBody(_Wire):
    """A webhook subscription's deliveries, newest first."""

    items: list[DeliveryBody]


class ReplaySkippedBody(_Wire):
    """How many skipped deliveries are due again (the next sweep tick sends them)."""

    replayed: int
