"""A subscription's record: ``{selector, reaction, governance}``, owned by a tenant and named
uniquely within it (S2 §6); the registry that keeps them is
:mod:`~rhumbatron.reactions.subscription_registry`.

* the **selector** is a :class:`~rhumbatron.reactions.selectors.Selector` (kind patterns plus
  a filter);
* the **reaction** is a closed union (:data:`Reaction`): wake an :class:`AgentReaction`, POST
  to a :class:`WebhookReaction` (signed with one or two ``whsec_`` secrets), or start a
  :class:`WorkflowReaction`;
* the **governance** is :class:`Governance`: ``enabled`` and ``cooldown_s``.

The models are frozen pydantic, and accept the API's camelCase as well as their field names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Self, TypeAlias

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from rhumbatron.agents.registry import AGENT_ID_PATTERN, MAX_SECRETS
from rhumbatron.agents.signing import parse_secret
from rhumbatron.reactions.selectors import Selector

__all__ = [
    "MAX_COOLDOWN_S",
    "SUBSCRIPTION_ID_PATTERN",
    "SUBSCRIPTION_NAME_PATTERN",
    "WORKFLOW_NAME_PATTERN",
    "AgentReaction",
    "EndpointDisabled",
    "Governance",
    "Reaction",
    "SubscriptionCreated",
    "SubscriptionRecord",
    "WebhookReaction",
    "WorkflowReaction",
]

#: ``sub_`` and 32 hex digits (a UUID4 without dashes).
SUBSCRIPTION_ID_PATTERN = r"^sub_[0-9a-f]{32}$"
#: A name a person chooses, unique within its tenant: letters, digits, ``.``, ``_``, ``-``.
SUBSCRIPTION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
#: A workflow's name, as the reactions consumer starts it.
WORKFLOW_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
#: A year. A cooldown longer than that is a typo, and silences a subscription without saying
#: so (disable it instead); the bound also keeps the value inside SQLite's integer.
MAX_COOLDOWN_S = 365 * 24 * 3600


# -- the record ------------------------------------------------------------------------------


class _Frozen(BaseModel):
    # The API's camelCase (``agentId``, ``cooldownS``) is accepted too, so a subscription's
    # JSON file reads the same to the CLI as to the API; storage uses the field names.
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class AgentReaction(_Frozen):
    """Wake the Agent ``agent_id``, which must be registered for the subscription's tenant."""

    kind: Literal["agent"] = "agent"
    agent_id: str = Field(pattern=f"^{AGENT_ID_PATTERN.pattern}$")


class WebhookReaction(_Frozen):
    """POST the fact to ``url``, signed (Standard Webhooks) with every secret, newest first.

    In a request ``secrets`` may be empty: the registry keeps the stored secrets of the same
    subscription, or generates one. A stored record always holds one or two. They are kept
    out of ``repr``, and a refused one is never quoted.
    """

    kind: Literal["webhook"] = "webhook"
    url: str = Field(min_length=1, max_length=2048)
    secrets: tuple[str, ...] = Field(default=(), max_length=MAX_SECRETS, repr=False)
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Bound on one POST; at most (and by default) the webhook_timeout_s setting.",
    )

    @field_validator("secrets")
    @classmethod
    def _well_formed(cls, secrets: tuple[str, ...]) -> tuple[str, ...]:
        for secret in secrets:
            parse_secret(secret)  # WebhookSecretError (a ValueError) never shows the secret
        if len(set(secrets)) != len(secrets):
            raise ValueError("the same secret is given twice")
        return secrets


class WorkflowReaction(_Frozen):
    """Start the workflow ``workflow`` (its instance ID derived from the fact, so a
    redelivered fact starts nothing twice)."""

    kind: Literal["workflow"] = "workflow"
    workflow: str = Field(pattern=WORKFLOW_NAME_PATTERN)


#: What a subscription does when its selector matches: a closed union, told apart by ``kind``.
Reaction: TypeAlias = Annotated[
    AgentReaction | WebhookReaction | WorkflowReaction, Field(discriminator="kind")
]


class Governance(_Frozen):
    """Whether a subscription reacts, and how often at most."""

    cooldown_s: int = Field(
        # DECISIONS: the default cooldown is 60 s; a subscription may ask for 0 (every match).
        default=60,
        ge=0,
        le=MAX_COOLDOWN_S,
        description="After a reaction, matches within this many seconds do not react (0: all).",
    )
    enabled: bool = True


class EndpointDisabled(_Frozen):
    """Why the platform disabled a webhook subscription: its endpoint answered 410 Gone
    (``gone``), or kept failing through the disable window (``failing``). Enabling the
    subscription again clears it."""

    reason: Literal["gone", "failing"]
    detail: str
    disabled_at: AwareDatetime


class SubscriptionRecord(_Frozen):
    """One ``subscriptions`` row, with ``endpoint_disabled`` when the platform disabled it."""

    subscription_id: str = Field(pattern=SUBSCRIPTION_ID_PATTERN)
    tenant_id: str = Field(min_length=1, max_length=64)
    name: str = Field(pattern=SUBSCRIPTION_NAME_PATTERN)
    selector: Selector
    reaction: Reaction
    governance: Governance
    created_at: AwareDatetime
    updated_at: AwareDatetime
    endpoint_disabled: EndpointDisabled | None = None

    @model_validator(mode="after")
    def _webhook_is_signed(self) -> Self:
        if isinstance(self.reaction, WebhookReaction) and not self.reaction.secrets:
            raise ValueError(
                f"subscription {self.subscription_id!r}: a stored webhook reaction needs 1 or "
                f"{MAX_SECRETS} secrets"
            )
        return self


@dataclass(frozen=True, slots=True)
class SubscriptionCreated:
    """What :meth:`~rhumbatron.reactions.subscription_registry.SubscriptionRegistry.create` did.

    ``created`` is False when the same subscription existed already. ``generated_secret`` is
    the webhook secret this call generated: show it once, it is not shown again.
    """

    record: SubscriptionRecord
    created: bool
    generated_secret: str | None = None
