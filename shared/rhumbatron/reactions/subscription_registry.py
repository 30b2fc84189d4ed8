"""The subscription registry: the one place that says what reacts to which facts (S2 §6).

A subscription is ``{selector, reaction, governance}``, owned by a tenant and named uniquely
within it:

* the **selector** is a :class:`~rhumbatron.reactions.selectors.Selector` (kind patterns plus
  a filter), matched by :func:`~rhumbatron.reactions.selectors.event_selector_matches`, the
  same matcher agent triggers use, so the two cannot drift;
* the **reaction** is a closed union: wake an :class:`AgentReaction` (an Agent of the same
  tenant), POST to a :class:`WebhookReaction` (a URL checked against SSRF, signed with one or
  two ``whsec_`` secrets), or start a :class:`WorkflowReaction`;
* the **governance** is :class:`Governance`: ``enabled`` and ``cooldown_s``. A disabled
  subscription never matches; the cooldown is the reactions consumer's to enforce (it knows
  when a subscription last fired), the registry only stores it.

Records live in the product database
(:data:`~rhumbatron.reactions.subscription_table.SUBSCRIPTIONS_SCHEMA`). Creating is idempotent
on ``(tenant, name)``: the same content again returns the stored record, so a deployment
script can create on every run; different content under a taken name is a
:class:`SubscriptionConflictError`, never a silent overwrite.

The record and its parts are :mod:`~rhumbatron.reactions.subscription_models`'; a record's
row is :mod:`~rhumbatron.reactions.subscription_table`'s.
"""

from __future__ import annotations

import builtins
import re
import sqlite3
import uuid
from collections.abc import Sequence

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.agents.registry import AgentRegistry
from rhumbatron.agents.signing import generate_secret
from rhumbatron.agents.url_safety import check_webhook_url
from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import (
    SubscriptionConflictError,
    SubscriptionDisabledError,
    SubscriptionNotFoundError,
    SubscriptionRegistryError,
)
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.selectors import Selector, event_selector_matches
from rhumbatron.reactions.subscription_models import (
    SUBSCRIPTION_NAME_PATTERN,
    AgentReaction,
    Governance,
    SubscriptionCreated,
    SubscriptionRecord,
    WebhookReaction,
    WorkflowReaction,
)
from rhumbatron.reactions.subscription_table import (
    SELECT_SUBSCRIPTIONS,
    insert_subscription,
    stored_json,
    subscription_by_name,
    subscription_from_row,
)
from rhumbatron.reactions.webhook_ledger import (
    DELIVERIES_PER_PAGE,
    DeliveryStatus,
    WebhookDelivery,
    list_deliveries,
    replay_skipped,
)

__all__ = ["SubscriptionRegistry"]

_NAME = re.compile(SUBSCRIPTION_NAME_PATTERN)


# -- the registry ----------------------------------------------------------------------------


class SubscriptionRegistry:
    """Subscriptions in ``store`` (the product database: ``SUBSCRIPTIONS_SCHEMA`` and, for
    agent reactions, ``AGENTS_SCHEMA``)."""

    def __init__(self, store: SqliteStore, settings: Settings, clock: Clock) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._agents = AgentRegistry(store, settings, clock)

    def create(
        self,
        tenant_id: str,
        name: str,
        selector: Selector,
        reaction: AgentReaction | WebhookReaction | WorkflowReaction,
        governance: Governance | None = None,
    ) -> SubscriptionCreated:
        """Create the tenant's subscription ``name``; the same content again changes nothing.

        A webhook URL must pass :func:`~rhumbatron.agents.url_safety.check_webhook_url`
        (``webhook_allowed_hosts``); without secrets, the stored ones are kept or one is
        generated. An agent reaction must name an Agent of ``tenant_id``. Raises
        :class:`SubscriptionConflictError` when ``name`` holds other content.
        """
        _check_tenant(tenant_id)
        _check_name(name)
        wanted_governance = governance or Governance()
        if isinstance(reaction, WebhookReaction):
            self._check_webhook(reaction)
        with self._store.transaction() as connection:
            if isinstance(reaction, AgentReaction):
                self._check_agent(reaction, tenant_id)
            current = subscription_by_name(connection, tenant_id, name)
            if current is not None:
                _check_unchanged(
                    current,
                    selector,
                    reaction,
                    wanted_governance,
                    tenant_id=tenant_id,
                    name=name,
                )
                return SubscriptionCreated(current, created=False)
            reaction, generated = _with_generated_secret(reaction)
            now = self._clock.now()
            record = SubscriptionRecord(
                subscription_id=f"sub_{uuid.uuid4().hex}",
                tenant_id=tenant_id,
                name=name,
                selector=selector,
                reaction=reaction,
                governance=wanted_governance,
                created_at=now,
                updated_at=now,
            )
            insert_subscription(connection, record, now)
        return SubscriptionCreated(record, created=True, generated_secret=generated)

    def get(self, tenant_id: str | None, subscription_id: str) -> SubscriptionRecord | None:
        """The subscription, if ``tenant_id`` owns it (None: any tenant's); else None."""
        row = self._store.connection.execute(
            SELECT_SUBSCRIPTIONS + " WHERE subscription_id = ?", (subscription_id,)
        ).fetchone()
        if row is None or tenant_id not in (None, row["tenant_id"]):
            return None
        return subscription_from_row(row)

    def list(
        self, tenant_id: str | None, *, enabled_only: bool = False
    ) -> builtins.list[SubscriptionRecord]:
        """The tenant's subscriptions (every tenant's for None), by tenant then name."""
        clauses, values = [], []
        if tenant_id is not None:
            clauses.append("tenant_id = ?")
            values.append(tenant_id)
        if enabled_only:
            clauses.append("enabled = 1")
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._store.connection.execute(
            f"{SELECT_SUBSCRIPTIONS}{where} ORDER BY tenant_id, name", values
        ).fetchall()
        return [subscription_from_row(row) for row in rows]

    def set_governance(
        self,
        tenant_id: str | None,
        subscription_id: str,
        *,
        enabled: bool | None = None,
        cooldown_s: int | None = None,
    ) -> SubscriptionRecord:
        """Enable or disable the subscription, or change its cooldown; the rest stays.

        Asking for what is already so changes nothing (not even ``updated_at``).
        """
        with self._store.transaction() as connection:
            current = self._owned(connection, tenant_id, subscription_id)
            governance = Governance.model_validate(
                {
                    "enabled": current.governance.enabled if enabled is None else enabled,
                    "cooldown_s": current.governance.cooldown_s
                    if cooldown_s is None
                    else cooldown_s,
                }
            )
            if enabled is not None and current.endpoint_disabled is not None:
                # An operator's word replaces the platform's: enabled again, or disabled by
                # a person (then its deliveries are no longer kept as skipped).
                connection.execute(
                    "DELETE FROM subscription_disablements WHERE subscription_id = ?",
                    (subscription_id,),
                )
                connection.execute(
                    "DELETE FROM subscription_endpoint_health WHERE subscription_id = ?",
                    (subscription_id,),
                )
                current = current.model_copy(update={"endpoint_disabled": None})
            if governance == current.governance:
                return current
            updated = current.model_copy(
                update={"governance": governance, "updated_at": self._clock.now()}
            )
            connection.execute(
                "UPDATE subscriptions SET cooldown_s = ?, enabled = ?, updated_at = ? "
                "WHERE subscription_id = ?",
                (
                    governance.cooldown_s,
                    int(governance.enabled),
                    updated.updated_at.isoformat(),
                    subscription_id,
                ),
            )
            return updated

    def delete(self, tenant_id: str | None, subscription_id: str) -> SubscriptionRecord:
        """Delete the subscription; return what it was. Raises
        :class:`SubscriptionNotFoundError` when the tenant has no such subscription."""
        with self._store.transaction() as connection:
            current = self._owned(connection, tenant_id, subscription_id)
            for table in (
                "subscriptions",
                "subscription_disablements",
                "subscription_endpoint_health",
            ):
                connection.execute(
                    f"DELETE FROM {table} WHERE subscription_id = ?", (subscription_id,)
                )
            return current

    def deliveries(
        self,
        tenant_id: str | None,
        subscription_id: str,
        *,
        statuses: Sequence[DeliveryStatus] = (),
        limit: int = DELIVERIES_PER_PAGE,
    ) -> builtins.list[WebhookDelivery]:
        """The webhook deliveries of the tenant's subscription, newest first (see
        :mod:`~rhumbatron.reactions.webhook_ledger`)."""
        connection = self._store.connection
        self._owned(connection, tenant_id, subscription_id)
        return list_deliveries(connection, subscription_id, statuses=statuses, limit=limit)

    def replay_skipped(self, tenant_id: str | None, subscription_id: str) -> int:
        """Make the deliveries kept while the subscription's endpoint was disabled due now;
        return how many. The sweep's webhook retry pass sends them, through the admission
        gate. Raises :class:`SubscriptionDisabledError` while the subscription is disabled."""
        with self._store.transaction() as connection:
            current = self._owned(connection, tenant_id, subscription_id)
            if not current.governance.enabled:
                raise SubscriptionDisabledError(
                    f"subscription {subscription_id} is disabled; enable it first (PATCH "
                    "/subscriptions/{id} with enabled=true, or `rhumbatron subscriptions "
                    "enable`), then replay its skipped deliveries",
                    field="governance.enabled",
                )
            return replay_skipped(connection, subscription_id, now_s=self._clock.now().timestamp())

    def matching(self, tenant_id: str, event: Event) -> builtins.list[SubscriptionRecord]:
        """The tenant's enabled subscriptions whose selector matches ``event``, by name, and
        those the platform disabled for a failing endpoint (``endpoint_disabled``): the
        consumer keeps their deliveries as skipped, to be replayed once they are enabled.

        A fact of another tenant matches none of them (fail closed: a tenant never reacts to
        another's facts). The cooldown is not applied here: the consumer knows when each
        subscription last reacted.
        """
        if event.tenant_id != tenant_id:
            return []
        return [
            record
            for record in self.list(tenant_id)
            if (record.governance.enabled or record.endpoint_disabled is not None)
            and event_selector_matches(record.selector, event)
        ]

    def _check_webhook(self, reaction: WebhookReaction) -> None:
        # Resolved here, outside the transaction: DNS may be slow and must not hold the file.
        check_webhook_url(reaction.url, self._settings.webhook_allowed_hosts)
        bound = self._settings.webhook_timeout_s
        if reaction.timeout_s is not None and reaction.timeout_s > bound:
            raise SubscriptionRegistryError(
                f"webhook timeout_s={reaction.timeout_s} is longer than the platform's bound "
                f"of {bound} s (RHUMBATRON_WEBHOOK_TIMEOUT_S); ask for at most that, or leave "
                "it out to use it",
                field="reaction.timeout_s",
            )

    def _check_agent(self, reaction: AgentReaction, tenant_id: str) -> None:
        # Only this tenant's agents are looked at: the answer says nothing of other tenants'.
        if self._agents.get(tenant_id, reaction.agent_id) is None:
            raise SubscriptionRegistryError(
                f"agent {reaction.agent_id!r} is not one of tenant {tenant_id!r}'s agents; "
                "register it first (POST /agents), or name one of yours",
                field="reaction.agent_id",
            )

    def _owned(
        self, connection: sqlite3.Connection, tenant_id: str | None, subscription_id: str
    ) -> SubscriptionRecord:
        row = connection.execute(
            SELECT_SUBSCRIPTIONS + " WHERE subscription_id = ?", (subscription_id,)
        ).fetchone()
        if row is None or tenant_id not in (None, row["tenant_id"]):
            raise SubscriptionNotFoundError(
                f"no subscription {subscription_id!r}; `GET /subscriptions` (or `rhumbatron "
                "subscriptions list`) lists them"
            )
        return subscription_from_row(row)


# -- helpers ---------------------------------------------------------------------------------


def _check_tenant(tenant_id: str) -> None:
    if not tenant_id.strip() or len(tenant_id) > 64:
        raise SubscriptionRegistryError(
            f"a subscription needs a tenant ID of 1 to 64 characters, got {tenant_id[:80]!r}",
            field="tenant_id",
        )


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise SubscriptionRegistryError(
            f"subscription name {name[:120]!r} is invalid: use 1 to 100 characters of A-Z, "
            "a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
            field="name",
        )


def _with_secrets_of(
    reaction: AgentReaction | WebhookReaction | WorkflowReaction,
    stored: AgentReaction | WebhookReaction | WorkflowReaction,
) -> AgentReaction | WebhookReaction | WorkflowReaction:
    """A webhook asked for without secrets means "keep the stored ones"."""
    if not isinstance(reaction, WebhookReaction) or not isinstance(stored, WebhookReaction):
        return reaction
    return reaction if reaction.secrets else reaction.model_copy(update={"secrets": stored.secrets})


def _same_content(
    current: SubscriptionRecord,
    selector: Selector,
    reaction: AgentReaction | WebhookReaction | WorkflowReaction,
    governance: Governance,
) -> bool:
    # Compared as their JSON: what is stored, and blind to how a model was built.
    return (
        stored_json(current.selector) == stored_json(selector)
        and stored_json(current.reaction) == stored_json(reaction)
        and current.governance == governance
    )


def _check_unchanged(
    current: SubscriptionRecord,
    selector: Selector,
    reaction: AgentReaction | WebhookReaction | WorkflowReaction,
    governance: Governance,
    *,
    tenant_id: str,
    name: str,
) -> None:
    """Raise :class:`SubscriptionConflictError` unless ``current`` holds what is asked for."""
    wanted = _with_secrets_of(reaction, current.reaction)
    if _same_content(current, selector, wanted, governance):
        return
    raise SubscriptionConflictError(
        f"tenant {tenant_id!r} has a subscription named {name!r} "
        f"({current.subscription_id}) with other content; choose another name, "
        "or delete that one first",
        field="name",
    )


def _with_generated_secret(
    reaction: AgentReaction | WebhookReaction | WorkflowReaction,
) -> tuple[AgentReaction | WebhookReaction | WorkflowReaction, str | None]:
    """A webhook asked for without secrets, with one generated (and that secret, shown once)."""
    if isinstance(reaction, WebhookReaction) and not reaction.secrets:
        generated = generate_secret()
        return reaction.model_copy(update={"secrets": (generated,)}), generated
    return reaction, None
