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

Records live in the product database (:data:`SUBSCRIPTIONS_SCHEMA`). Creating is idempotent
on ``(tenant, name)``: the same content again returns the stored record, so a deployment
script can create on every run; different content under a taken name is a
:class:`SubscriptionConflictError`, never a silent overwrite.
"""

from __future__ import annotations

import builtins
import json
import re
import sqlite3
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self, TypeAlias

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.agents.registry import AGENT_ID_PATTERN, MAX_SECRETS, AgentRegistry
from rhumbatron.agents.signing import generate_secret, parse_secret
from rhumbatron.agents.url_safety import check_webhook_url
from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings

# Defined in rhumbatron.errors; the alias keeps this module's old import path working.
from rhumbatron.errors import (
    SubscriptionConflictError,
    SubscriptionDisabledError,
    SubscriptionNotFoundError,
    SubscriptionRegistryError,
)
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.selectors import Selector, event_selector_matches
from rhumbatron.reactions.webhook_ledger import (
    DeliveryStatus,
    WebhookDelivery,
    list_deliveries,
    replay_skipped,
)

__all__ = [
    "MAX_COOLDOWN_S",
    "SUBSCRIPTIONS_SCHEMA",
    "SUBSCRIPTION_ID_PATTERN",
    "SUBSCRIPTION_NAME_PATTERN",
    "WORKFLOW_NAME_PATTERN",
    "AgentReaction",
    "EndpointDisabled",
    "Governance",
    "Reaction",
    "SubscriptionCreated",
    "SubscriptionRecord",
    "SubscriptionRegistry",
    "WebhookReaction",
    "WorkflowReaction",
]

SUBSCRIPTIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS subscriptions (
    subscription_id TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    name            TEXT NOT NULL,
    selector        TEXT NOT NULL,
    reaction        TEXT NOT NULL,
    cooldown_s      INTEGER NOT NULL DEFAULT 60 CHECK (cooldown_s >= 0),
    enabled         INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE TABLE IF NOT EXISTS subscription_disablements (
    subscription_id  TEXT PRIMARY KEY,
    reason           TEXT NOT NULL CHECK (reason IN ('gone', 'failing')),
    detail           TEXT NOT NULL,
    delivery_key     TEXT NOT NULL,
    status_code      INTEGER,
    failing_since_s  REAL,
    disabled_at_s    REAL NOT NULL,
    fact_recorded    INTEGER NOT NULL DEFAULT 0 CHECK (fact_recorded IN (0, 1))
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscription_endpoint_health (
    subscription_id  TEXT PRIMARY KEY,
    failing_since_s  REAL NOT NULL,
    failures         INTEGER NOT NULL
) WITHOUT ROWID;
"""

#: Every read of a record: the row, and why its endpoint was disabled, if it was.
_SELECT = (
    "SELECT s.*, d.reason AS disabled_reason, d.detail AS disabled_detail, "
    "d.disabled_at_s AS disabled_at_s FROM subscriptions s "
    "LEFT JOIN subscription_disablements d USING (subscription_id)"
)

#: ``sub_`` and 32 hex digits (a UUID4 without dashes).
SUBSCRIPTION_ID_PATTERN = r"^sub_[0-9a-f]{32}$"
#: A name a person chooses, unique within its tenant: letters, digits, ``.``, ``_``, ``-``.
SUBSCRIPTION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
#: A workflow's name, as the reactions consumer starts it.
WORKFLOW_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
#: A year. A cooldown longer than that is a typo, and silences a subscription without saying
#: so (disable it instead); the bound also keeps the value inside SQLite's integer.
MAX_COOLDOWN_S = 365 * 24 * 3600

_NAME = re.compile(SUBSCRIPTION_NAME_PATTERN)


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
    """What :meth:`SubscriptionRegistry.create` did.

    ``created`` is False when the same subscription existed already. ``generated_secret`` is
    the webhook secret this call generated: show it once, it is not shown again.
    """

    record: SubscriptionRecord
    created: bool
    generated_secret: str | None = None


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
            current = _read_by_name(connection, tenant_id, name)
            if current is not None:
                wanted = _with_secrets_of(reaction, current.reaction)
                if _same_content(current, selector, wanted, wanted_governance):
                    return SubscriptionCreated(current, created=False)
                raise SubscriptionConflictError(
                    f"tenant {tenant_id!r} has a subscription named {name!r} "
                    f"({current.subscription_id}) with other content; choose another name, "
                    "or delete that one first",
                    field="name",
                )
            generated = None
            if isinstance(reaction, WebhookReaction) and not reaction.secrets:
                generated = generate_secret()
                reaction = reaction.model_copy(update={"secrets": (generated,)})
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
            connection.execute(
                "INSERT INTO subscriptions (subscription_id, tenant_id, name, selector, "
                "reaction, cooldown_s, enabled, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.subscription_id,
                    record.tenant_id,
                    record.name,
                    _json(record.selector),
                    _json(record.reaction),
                    record.governance.cooldown_s,
                    int(record.governance.enabled),
                    now.isoformat(),
                    now.isoformat(),
                ),
            )
        return SubscriptionCreated(record, created=True, generated_secret=generated)

    def get(self, tenant_id: str | None, subscription_id: str) -> SubscriptionRecord | None:
        """The subscription, if ``tenant_id`` owns it (None: any tenant's); else None."""
        row = self._store.connection.execute(
            _SELECT + " WHERE subscription_id = ?", (subscription_id,)
        ).fetchone()
        if row is None or tenant_id not in (None, row["tenant_id"]):
            return None
        return _record(row)

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
            f"{_SELECT}{where} ORDER BY tenant_id, name", values
        ).fetchall()
        return [_record(row) for row in rows]

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
        limit: int = 100,
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
            _SELECT + " WHERE subscription_id = ?", (subscription_id,)
        ).fetchone()
        if row is None or tenant_id not in (None, row["tenant_id"]):
            raise SubscriptionNotFoundError(
                f"no subscription {subscription_id!r}; `GET /subscriptions` (or `rhumbatron "
                "subscriptions list`) lists them"
            )
        return _record(row)


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
        _json(current.selector) == _json(selector)
        and _json(current.reaction) == _json(reaction)
        and current.governance == governance
    )


def _json(model: BaseModel) -> str:
    return json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def _read_by_name(
    connection: sqlite3.Connection, tenant_id: str, name: str
) -> SubscriptionRecord | None:
    row = connection.execute(
        _SELECT + " WHERE tenant_id = ? AND name = ?", (tenant_id, name)
    ).fetchone()
    return None if row is None else _record(row)


def _record(row: sqlite3.Row) -> SubscriptionRecord:
    raw: dict[str, Any] = {
        "subscription_id": row["subscription_id"],
        "tenant_id": row["tenant_id"],
        "name": row["name"],
        "selector": Selector.parse(json.loads(row["selector"])),
        "reaction": json.loads(row["reaction"]),
        "governance": {"cooldown_s": row["cooldown_s"], "enabled": bool(row["enabled"])},
        "created_at": datetime.fromisoformat(row["created_at"]),
        "updated_at": datetime.fromisoformat(row["updated_at"]),
    }
    if row["disabled_reason"] is not None:
        raw["endpoint_disabled"] = {
            "reason": row["disabled_reason"],
            "detail": row["disabled_detail"],
            "disabled_at": datetime.fromtimestamp(row["disabled_at_s"], UTC),
        }
    return SubscriptionRecord.model_validate(raw)
