"""The facts the reactions write themselves, each in the shard of ``project:<id>`` (its outbox
publishes them): ``budget.exceeded`` when the admission gate refuses a tenant's reaction over
its daily budget, and ``reaction.disabled`` when the delivery ledger disables a failing
webhook endpoint (:class:`ShardFacts`, the consumer's
:class:`~rhumbatron.reactions.ports.FactSink`; :func:`record_disablement`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rhumbatron.core.clock import Clock
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import project_admin_key
from rhumbatron.domain.transition import Transition
from rhumbatron.errors import RhumbatronError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import stable_event_id
from rhumbatron.reactions.ports import FactSink
from rhumbatron.reactions.webhook_attempts import mark_disablement_recorded
from rhumbatron.reactions.webhook_ledger import Disablement

if TYPE_CHECKING:
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.product.database import ProductDatabase

__all__ = ["ShardFacts", "record_disablement"]

_log = logging.getLogger(__name__)

#: The facts the reactions write themselves.
_ACTOR = "system:reactions"


@dataclass
class ShardFacts:
    """Writes the reactions' facts in the shard of ``project:<id>`` (its outbox publishes
    them). ``resource_shard`` is ``Rhumbatron.resource_shard``."""

    resource_shard: Callable[[str, str], ResourceShard]
    clock: Clock

    def budget_exceeded(self, event: Event, *, subscription_id: str, limit: int, day: str) -> None:
        """Write ``budget.exceeded``: ``event``'s tenant spent its ``limit`` of ``day``."""
        shard = self.resource_shard(event.project_id, project_admin_key(event.project_id))
        caller = Caller(event.tenant_id, _ACTOR, event.event_id, caused_by=event.event_id)
        ctx = FactContext(caller, event.project_id, self.clock.now())
        payload = {
            "limit": limit,
            "day": day,
            "subscriptionId": subscription_id,
            "eventId": event.event_id,
        }
        fact = ctx.fact("budget.exceeded", payload)
        shard.transact(lambda db: Transition(facts=(fact,)))

    def reaction_disabled(self, disablement: Disablement) -> None:
        """Write ``disablement``'s ``reaction.disabled`` (one per disablement)."""
        project_id = disablement.project_id
        shard = self.resource_shard(project_id, project_admin_key(project_id))
        caller = Caller(disablement.tenant_id, _ACTOR, disablement.delivery_key)
        ctx = FactContext(caller, project_id, self.clock.now())
        failing_since = (
            None
            if disablement.failing_since_s is None
            else datetime.fromtimestamp(disablement.failing_since_s, UTC).isoformat()
        )
        payload = {
            "subscriptionId": disablement.subscription_id,
            "name": disablement.name,
            "reason": disablement.reason,
            "deliveryKey": disablement.delivery_key,
            "lastError": disablement.detail,
            "failingSince": failing_since,
            "statusCode": disablement.status_code,
        }
        # One fact per disablement, however many times it is written (a crash before its
        # flag was set, or the consumer and a retry pass both finding it owed).
        event_id = stable_event_id(
            disablement.subscription_id,
            "reaction.disabled",
            None,
            repr(disablement.disabled_at_s),
        )
        fact = ctx.fact("reaction.disabled", payload, event_id=event_id)
        shard.transact(lambda db: Transition(facts=(fact,)))


async def record_disablement(
    facts: FactSink, product: ProductDatabase, disablement: Disablement
) -> None:
    """Write the ``reaction.disabled`` fact of ``disablement`` and mark it written; a failure
    leaves it unmarked, and the next retry pass writes it (it never fails the caller)."""
    try:
        await asyncio.to_thread(facts.reaction_disabled, disablement)
    except RhumbatronError as exc:
        _log.error(
            "cannot record reaction.disabled for %s yet (%s); the next retry pass will",
            disablement.subscription_id,
            exc,
        )
        return

    def mark() -> None:
        with product.transaction() as db:
            mark_disablement_recorded(db, disablement)

    await asyncio.to_thread(mark)
    _log.warning(
        "webhook subscription %s (%s) disabled: %s",
        disablement.subscription_id,
        disablement.name,
        disablement.detail,
    )
