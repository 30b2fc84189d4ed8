"""The subscriptions API: ``/subscriptions``, the one registry of what reacts to which facts.

:func:`subscription_router` builds the routes over a runtime; they translate HTTP to the
:class:`~rhumbatron.reactions.registry.SubscriptionRegistry` and back, ``async def`` with no
``await`` inside a product transaction (see ``app.py``).

Authorization reuses the agents' scopes: ``agents:read`` to list and read, ``agents:write`` to
create, change governance and delete. Tenancy fails closed: another tenant's subscription is
the same 404 as one that does not exist. A platform token (tenant ``*``) reads and governs
every tenant's subscriptions, but owns nothing, so it cannot create one.

A webhook's secrets are never shown, except one this very request generated (shown once), and
a refused secret is never quoted: the route checks their number itself, and answers the
model's refusals without the value (FastAPI's 422 would quote it).
"""

# No ``from __future__ import annotations`` here, on purpose (as in ``lifecycle_routes``): the
# routes are closures over the principal dependency they are given, and FastAPI resolves string
# annotations against the module's globals only.

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Literal, Self, TypeAlias

from fastapi import APIRouter, Path, Query, Response, Security
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from rhumbatron.agents.registry import MAX_SECRETS
from rhumbatron.agents.url_safety import UnsafeWebhookUrlError, check_webhook_url, display_url
from rhumbatron.api.auth import SCOPE_AGENTS_READ, SCOPE_AGENTS_WRITE, Principal
from rhumbatron.api.errors import InvalidRequestError, error_responses
from rhumbatron.api.lifecycle_routes import (
    ConflictError,
    NotFoundError,
    PrincipalDependency,
    own_tenant,
)
from rhumbatron.protocol.values import AGENT_ID
from rhumbatron.reactions.registry import (
    MAX_COOLDOWN_S,
    SUBSCRIPTION_ID_PATTERN,
    SUBSCRIPTION_NAME_PATTERN,
    WORKFLOW_NAME_PATTERN,
    AgentReaction,
    Governance,
    SubscriptionConflictError,
    SubscriptionDisabledError,
    SubscriptionNotFoundError,
    SubscriptionRecord,
    SubscriptionRegistry,
    SubscriptionRegistryError,
    WebhookReaction,
    WorkflowReaction,
)
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.webhook_ledger import DeliveryStatus, WebhookDelivery
from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = [
    "AgentReactionBody",
    "CreateSubscriptionRequest",
    "DeliveryBody",
    "DeliveryListBody",
    "EndpointDisabledBody",
    "GovernanceBody",
    "ReplaySkippedBody",
    "SubscriptionBody",
    "SubscriptionListBody",
    "UpdateSubscriptionRequest",
    "WebhookReactionBody",
    "WebhookReactionRequest",
    "WorkflowReactionBody",
    "subscription_router",
]

_log = logging.getLogger(__name__)

#: The agent registry's alphabet, anchored for a JSON schema.
_AGENT_ID = AGENT_ID


# -- bodies ------------------------------------------------------------------------------------


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


# -- the router --------------------------------------------------------------------------------

_NOT_FOUND = "No such subscription for this tenant (another tenant's is not found either)."
_SubscriptionId = Annotated[str, Path(alias="subscriptionId", pattern=SUBSCRIPTION_ID_PATTERN)]


def subscription_router(app: Rhumbatron, principal: PrincipalDependency) -> APIRouter:
    """The ``/subscriptions`` routes over ``app``; ``principal`` is the API's dependency that
    authenticates the bearer token and checks the operation's scopes (``app._principal``)."""
    Reader = Annotated[Principal, Security(principal, scopes=[SCOPE_AGENTS_READ])]
    Writer = Annotated[Principal, Security(principal, scopes=[SCOPE_AGENTS_WRITE])]

    router = APIRouter()

    def registry() -> SubscriptionRegistry:
        # Cheap to build: it only holds the runtime's product database, settings and clock.
        return SubscriptionRegistry(app.product(), app.settings, app.clock)

    @router.post(
        "/subscriptions",
        response_model=SubscriptionBody,
        status_code=201,
        summary="Create a subscription",
        responses={
            200: {"model": SubscriptionBody, "description": "The same subscription existed."},
            **error_responses(
                401,
                403,
                409,
                422,
                503,
                e403="The token lacks agents:write, or is a platform token (owns nothing).",
                e409="The tenant has a subscription of that name with other content.",
                e422="The request is invalid (a selector that can never match, an unsafe URL, "
                "an agent not of this tenant, ...); `field` names the first bad field.",
            ),
        },
    )
    async def create_subscription(
        principal: Writer, body: CreateSubscriptionRequest, response: Response
    ) -> SubscriptionBody:
        """Creates (201) the caller's tenant's subscription, or answers the same one (200).
        A webhook's secret generated by this request is shown once, in
        ``reaction.secret``."""
        own_tenant(principal, "create a subscription")
        reaction = _reaction(body.reaction)
        if isinstance(reaction, WebhookReaction):
            with _refused():
                # Resolving a name may take seconds: first off the event loop, so that an
                # unresolvable or unsafe URL never blocks it. The registry checks it again on
                # the loop (usually from the resolver's cache: it was just asked).
                await asyncio.to_thread(
                    check_webhook_url, reaction.url, app.settings.webhook_allowed_hosts
                )
        with _refused():
            outcome = registry().create(
                principal.tenant_id,
                body.name,
                body.selector,
                reaction,
                Governance(cooldown_s=body.governance.cooldown_s, enabled=body.governance.enabled),
            )
        response.status_code = 201 if outcome.created else 200
        _log.info(
            "api: subscription %s %s (%s)",
            outcome.record.subscription_id,
            "created" if outcome.created else "unchanged",
            outcome.record.reaction.kind,
        )
        return SubscriptionBody.of(outcome.record, generated_secret=outcome.generated_secret)

    @router.get(
        "/subscriptions",
        response_model=SubscriptionListBody,
        summary="List subscriptions",
        responses=error_responses(401, 403, 422, 503),
    )
    async def list_subscriptions(
        principal: Reader,
        enabled_only: Annotated[
            bool, Query(alias="enabledOnly", description="Only the enabled ones.")
        ] = False,
    ) -> SubscriptionListBody:
        """The caller's tenant's subscriptions (every tenant's for a platform token)."""
        records = registry().list(principal.tenant_scope, enabled_only=enabled_only)
        return SubscriptionListBody(items=[SubscriptionBody.of(r) for r in records])

    @router.get(
        "/subscriptions/{subscriptionId}",
        response_model=SubscriptionBody,
        summary="Read a subscription",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NOT_FOUND),
    )
    async def read_subscription(
        principal: Reader, subscription_id: _SubscriptionId
    ) -> SubscriptionBody:
        """Its selector, reaction (without secrets) and governance."""
        record = registry().get(principal.tenant_scope, subscription_id)
        if record is None:
            raise NotFoundError(
                f"no subscription {subscription_id!r}; GET /subscriptions lists them"
            )
        return SubscriptionBody.of(record)

    @router.patch(
        "/subscriptions/{subscriptionId}",
        response_model=SubscriptionBody,
        summary="Enable, disable or change the cooldown of a subscription",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NOT_FOUND),
    )
    async def update_subscription(
        principal: Writer, subscription_id: _SubscriptionId, body: UpdateSubscriptionRequest
    ) -> SubscriptionBody:
        """Changes the governance fields given; the same values again change nothing. The
        selector and reaction do not change: delete and create instead."""
        with _refused():
            record = registry().set_governance(
                principal.tenant_scope,
                subscription_id,
                enabled=body.enabled,
                cooldown_s=body.cooldown_s,
            )
        return SubscriptionBody.of(record)

    @router.delete(
        "/subscriptions/{subscriptionId}",
        response_model=SubscriptionBody,
        summary="Delete a subscription",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NOT_FOUND),
    )
    async def delete_subscription(
        principal: Writer, subscription_id: _SubscriptionId
    ) -> SubscriptionBody:
        """Deletes the subscription and answers what it was; it reacts to nothing more."""
        with _refused():
            record = registry().delete(principal.tenant_scope, subscription_id)
        return SubscriptionBody.of(record)

    @router.get(
        "/subscriptions/{subscriptionId}/deliveries",
        response_model=DeliveryListBody,
        summary="List a webhook subscription's deliveries",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NOT_FOUND),
    )
    async def list_deliveries(
        principal: Reader,
        subscription_id: _SubscriptionId,
        status: Annotated[
            list[DeliveryStatus] | None, Query(description="Only these statuses (repeatable).")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
    ) -> DeliveryListBody:
        """Each delivery of the webhook with its attempts, next retry and last error,
        newest first."""
        with _refused():
            deliveries = registry().deliveries(
                principal.tenant_scope, subscription_id, statuses=status or (), limit=limit
            )
        return DeliveryListBody(items=[DeliveryBody.of(d) for d in deliveries])

    @router.post(
        "/subscriptions/{subscriptionId}/deliveries/replay",
        response_model=ReplaySkippedBody,
        summary="Replay the deliveries skipped while the endpoint was disabled",
        responses=error_responses(
            401,
            403,
            404,
            409,
            422,
            503,
            e404=_NOT_FOUND,
            e409="The subscription is disabled: enable it first.",
        ),
    )
    async def replay_skipped(
        principal: Writer, subscription_id: _SubscriptionId
    ) -> ReplaySkippedBody:
        """Makes every skipped delivery due now, each with a fresh retry schedule; the
        sweep's next webhook retry pass sends them through the admission gate."""
        with _refused():
            replayed = registry().replay_skipped(principal.tenant_scope, subscription_id)
        _log.info("api: %d skipped deliveries of %s due again", replayed, subscription_id)
        return ReplaySkippedBody(replayed=replayed)

    return router


# -- helpers -----------------------------------------------------------------------------------


def _reaction(
    wire: AgentReactionBody | WebhookReactionRequest | WorkflowReactionBody,
) -> AgentReaction | WebhookReaction | WorkflowReaction:
    if isinstance(wire, AgentReactionBody):
        return AgentReaction(agent_id=wire.agent_id)
    if isinstance(wire, WorkflowReactionBody):
        return WorkflowReaction(workflow=wire.workflow)
    secrets = wire.secrets or []
    if wire.secrets is not None and not 1 <= len(secrets) <= MAX_SECRETS:
        raise InvalidRequestError(
            f"give 1 or {MAX_SECRETS} secrets (newest first), not {len(secrets)}; or none to "
            "have one generated",
            field="reaction.secrets",
        )
    try:
        return WebhookReaction(url=wire.url, secrets=tuple(secrets), timeout_s=wire.timeout_s)
    except ValidationError as exc:
        # Only the secrets can fail here (the wire model checked the rest), and the message
        # must not quote them: pydantic's own string would.
        problems = "; ".join(
            str(err["msg"]).removeprefix("Value error, ") for err in exc.errors(include_url=False)
        )
        raise InvalidRequestError(problems, field="reaction.secrets") from None


@contextmanager
def _refused() -> Iterator[None]:
    """The registry's refusals as answers: a taken name 409, a missing subscription 404, a
    bad value 422 naming its field as the client sent it."""
    try:
        yield
    except SubscriptionNotFoundError as exc:
        raise NotFoundError(str(exc)) from None
    except SubscriptionConflictError as exc:
        raise ConflictError(str(exc), code="subscription_exists", field="name") from None
    except SubscriptionDisabledError as exc:
        raise ConflictError(str(exc), code="subscription_disabled", field="enabled") from None
    except SubscriptionRegistryError as exc:
        raise InvalidRequestError(str(exc), field=_wire_field(exc.field)) from None
    except UnsafeWebhookUrlError as exc:
        raise InvalidRequestError(str(exc), field="reaction.url") from None


def _wire_field(field: str | None) -> str | None:
    """``reaction.agent_id`` -> ``reaction.agentId``: the name the client sent."""
    return None if field is None else ".".join(to_camel(part) for part in field.split("."))
