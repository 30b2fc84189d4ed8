"""The decision of one event: each matching subscription's fate, in one product transaction.

:func:`decide_event` claims the event's deliveries (``<eventId>:<subscriptionId>``) and, for
each one it holds, in order:

1. a subscription switched off (by a person) is dropped: its delivery is done;
2. the **loop guards** (``guards``): a suppression is final, recorded with the cause chain
   and counted (``reaction_suppressed``);
3. a subscription whose endpoint the platform disabled keeps a webhook's delivery as
   ``skipped``, for a replay once it is enabled;
4. the **admission gate** (``gate``): over the tenant's daily budget the reaction is
   suppressed and counted (``reaction_refused``, gate ``budget``), the first refusal of the
   day owing a ``budget.exceeded`` fact; with the in-flight cap full the delivery is released
   and the event goes back to the stream (gate ``in_flight``); admitted, the fire is recorded
   with its chain, and the reaction runs (:class:`ReactionPlan` ``run``).

The reactions consumer (:mod:`~rhumbatron.reactions.consumer`) runs what was decided.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime

from rhumbatron.core.clock import utc_day
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.metrics import DataPoint
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.deliveries import (
    agent_command_id,
    pointer_body,
    webhook_id,
    workflow_instance_id,
)
from rhumbatron.reactions.gate import Admission, GateDecision, admit, claim_budget_fact
from rhumbatron.reactions.guards import (
    CauseChain,
    Hop,
    SuppressionReason,
    cause_chain,
    check_guards,
    last_fire,
    record_fire,
    record_suppression,
)
from rhumbatron.reactions.ports import SubscriptionLike
from rhumbatron.reactions.webhook_ledger import Attempt, record_skipped
from rhumbatron.router.claims import claim_leases, complete_claims, release_claims

__all__ = [
    "REFUSED_METRIC",
    "SUPPRESSED_METRIC",
    "EventDecision",
    "ReactionPlan",
    "decide_event",
    "delivery_identity",
    "reaction_point",
    "suppress",
]

_log = logging.getLogger(__name__)

#: A matching subscription held back by a loop guard (dimension ``reason``).
SUPPRESSED_METRIC = "reaction_suppressed"
#: A reaction the admission gate refused (dimension ``gate``: budget or in_flight).
REFUSED_METRIC = "reaction_refused"
_CONSUMER = Subscription.REACTIONS.value


@dataclass
class ReactionPlan:
    """One matching subscription's fate in this run."""

    subscription: SubscriptionLike
    key: str
    chain: CauseChain
    run: bool = False
    over_budget: tuple[int, str] | None = None  # (limit, day) when this refusal records a fact
    attempt: Attempt | None = None  # a webhook's outcome, for the ledger
    fired: bool = False  # the reaction was taken (a 2xx, a workflow started, a wake sent)
    body: bytes = b""  # a webhook's pointer body


@dataclass
class EventDecision:
    """Each matching subscription's fate (``plans``); whether the in-flight cap sent the event
    back, and whether another run holds one of its deliveries; the metric points counted."""

    plans: list[ReactionPlan] = field(default_factory=list)
    refused_in_flight: bool = False
    held: bool = False
    points: list[DataPoint] = field(default_factory=list)


def decide_event(
    db: sqlite3.Connection,
    event: Event,
    matching: list[SubscriptionLike],
    *,
    now: datetime,
    limits: ReactionSettings,
    lease_s: float,
) -> EventDecision:
    """Decide ``event``'s matching subscriptions inside the caller's transaction ``db``; the
    caller writes the decision's metric points in the same transaction."""
    now_s, day = now.timestamp(), utc_day(now)
    decision = EventDecision()
    chain = cause_chain(db, event)
    keys = [webhook_id(event.event_id, s.subscription_id) for s in matching]
    leases = claim_leases(db, _CONSUMER, keys, now_s=now_s, lease_s=lease_s)
    deciding = _Deciding(db, event, limits, now_s, day, decision)
    for subscription, key in zip(matching, keys, strict=True):
        if key not in leases.fresh:
            # Done by an earlier attempt, or held by a live run: either way not ours.
            decision.held |= key in leases.held
            continue
        plan = ReactionPlan(subscription, key, chain)
        decision.plans.append(plan)
        deciding.decide(plan)
    return decision


@dataclass
class _Deciding:
    """The deciding of one event's subscriptions, in one transaction."""

    db: sqlite3.Connection
    event: Event
    limits: ReactionSettings
    now_s: float
    day: str
    decision: EventDecision

    def decide(self, plan: ReactionPlan) -> None:
        """One subscription's fate: dropped, suppressed, kept as skipped, or the gate's."""
        subscription = plan.subscription
        kept = subscription.endpoint_disabled is not None
        if not subscription.governance.enabled and not kept:
            complete_claims(self.db, _CONSUMER, [plan.key], now_s=self.now_s)
            return
        guard = self._guard(plan)
        if guard is not None:
            reason, detail = guard
            self._suppress(plan, reason, detail)
            return
        if not subscription.governance.enabled:
            self._keep_skipped(plan)
            return
        self._admit(plan)

    def _guard(self, plan: ReactionPlan) -> tuple[SuppressionReason, str] | None:
        subscription = plan.subscription
        reaction = subscription.reaction
        cooldown = subscription.governance.cooldown_s
        return check_guards(
            self.event,
            plan.chain,
            subscription_id=subscription.subscription_id,
            agent_id=reaction.agent_id if reaction.kind == "agent" else None,
            depth_cap=self.limits.reaction_depth_cap,
            cooldown_s=self.limits.reaction_default_cooldown_s if cooldown is None else cooldown,
            last_fire=last_fire(self.db, subscription.subscription_id),
            delivery_key=plan.key,
            now_s=self.now_s,
        )

    def _suppress(self, plan: ReactionPlan, reason: SuppressionReason, detail: str) -> None:
        suppress(
            self.db,
            event=self.event,
            plan=plan,
            reason=reason,
            detail=detail,
            now_s=self.now_s,
            points=self.decision.points,
        )

    def _keep_skipped(self, plan: ReactionPlan) -> None:
        # Its endpoint is disabled: kept (a webhook's), for a replay once enabled.
        if plan.subscription.reaction.kind == "webhook":
            record_skipped(
                self.db,
                **delivery_identity(self.event, plan.subscription, plan.key),
                body=pointer_body(self.event, link_template=self.limits.reaction_event_link),
                now_s=self.now_s,
            )
        complete_claims(self.db, _CONSUMER, [plan.key], now_s=self.now_s)

    def _admit(self, plan: ReactionPlan) -> None:
        """The admission gate's answer: over budget, in-flight cap full, or admitted."""
        event, limits = self.event, self.limits
        gate = admit(
            self.db,
            tenant_id=event.tenant_id,
            delivery_key=plan.key,
            day=self.day,
            now_s=self.now_s,
            daily_budget=limits.reaction_daily_budget,
            in_flight_cap=limits.reaction_in_flight_cap,
            lease_s=limits.reaction_in_flight_lease_s,
        )
        match gate.admission:
            case Admission.OVER_BUDGET:
                self._over_budget(plan, gate)
            case Admission.IN_FLIGHT_FULL:
                release_claims(self.db, _CONSUMER, [plan.key])
                self.decision.refused_in_flight = True
                self.decision.points.append(
                    reaction_point(
                        REFUSED_METRIC, event, f"{plan.key}:{self.now_s}", gate="in_flight"
                    )
                )
            case Admission.ADMITTED:
                self._admitted(plan)

    def _over_budget(self, plan: ReactionPlan, gate: GateDecision) -> None:
        event, day = self.event, self.day
        detail = (
            f"tenant {event.tenant_id!r} used {gate.used} of its "
            f"{gate.limit} reactions of {day} "
            "(RHUMBATRON_REACTION_DAILY_BUDGET)"
        )
        self._suppress(plan, SuppressionReason.BUDGET, detail)
        self.decision.points.append(reaction_point(REFUSED_METRIC, event, plan.key, gate="budget"))
        if claim_budget_fact(self.db, tenant_id=event.tenant_id, day=day):
            plan.over_budget = (gate.limit, day)

    def _admitted(self, plan: ReactionPlan) -> None:
        event, subscription = self.event, plan.subscription
        plan.run = True
        hop_chain = plan.chain.then(Hop(event.event_id, subscription.subscription_id))
        record_fire(
            self.db,
            tenant_id=event.tenant_id,
            subscription_id=subscription.subscription_id,
            delivery_key=plan.key,
            chain=hop_chain,
            cause_keys=_cause_keys(event.event_id, subscription.subscription_id),
            now_s=self.now_s,
        )


def suppress(
    db: sqlite3.Connection,
    *,
    event: Event,
    plan: ReactionPlan,
    reason: SuppressionReason,
    detail: str,
    now_s: float,
    points: list[DataPoint],
) -> None:
    """Record the suppression with its chain; the delivery is final (done)."""
    _log.info("reaction %s suppressed (%s): %s", plan.key, reason.value, detail)
    record_suppression(
        db,
        event,
        subscription_id=plan.subscription.subscription_id,
        delivery_key=plan.key,
        reason=reason,
        detail=detail,
        chain=plan.chain,
        now_s=now_s,
    )
    complete_claims(db, _CONSUMER, [plan.key], now_s=now_s)
    if reason is not SuppressionReason.BUDGET:
        points.append(reaction_point(SUPPRESSED_METRIC, event, plan.key, reason=reason.value))


def delivery_identity(event: Event, subscription: SubscriptionLike, key: str) -> dict[str, str]:
    """A webhook delivery's identity, as the ledger records it."""
    return {
        "delivery_key": key,
        "tenant_id": event.tenant_id,
        "project_id": event.project_id,
        "event_id": event.event_id,
        "event_type": event.event_type,
        "subscription_id": subscription.subscription_id,
    }


def reaction_point(name: str, event: Event, key: str, **dimensions: str) -> DataPoint:
    """The metric point ``name`` of the delivery ``key`` (dimension ``tenant``, and more)."""
    return DataPoint(
        name=name,
        dimensions={"tenant": event.tenant_id, **dimensions},
        event_id=key,
        project_id=event.project_id,
    )


def _cause_keys(event_id: str, subscription_id: str) -> list[str]:
    """The IDs a reaction's effect carries, under which its facts find their chain."""
    return [
        webhook_id(event_id, subscription_id),
        workflow_instance_id(event_id, subscription_id),
        agent_command_id(event_id, subscription_id),
    ]
