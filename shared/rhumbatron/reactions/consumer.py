"""The ``reactions`` subscription: one more durable cursor per event stream (seed 002 §2).

For each fresh event the consumer asks the registry for the tenant's matching subscriptions
and, for each, in order:

1. the **loop guards** (``guards``): the reaction family, self-cause, the depth cap and the
   subscription's cooldown. A suppression is final: it is recorded with the cause chain
   (``reaction_suppressions``) and counted (``reaction_suppressed``);
2. the **admission gate** (``gate``): the tenant's daily budget (a refusal skips the reaction,
   records ``budget.exceeded`` once a day, counts ``reaction_refused``) and the in-flight cap
   (a refusal sends the event back to the stream: the cursor lags, nothing is lost);
3. the **reaction** (``deliveries``): a signed pointer-only webhook, a workflow start or an
   agent wake. A webhook is tried once here; its outcome goes to the delivery ledger
   (``webhook_ledger``), which owns its retries, its dead letter and its endpoint's health,
   so a failing receiver never holds the stream.

**Claims.** The event is leased under ``reactions`` like the causal router's leases, and each
``(event, subscription)`` delivery under its own key ``<eventId>:<subscriptionId>``, both in
the product database with the gate's tables. A delivery done is never repeated; when one of
an event's subscriptions fails, the event fails (the router counts it, retries it after the
nack delay and dead-letters it on the 5th failure) and its redelivery runs only the
deliveries not yet done (a workflow start or a wake that failed; a webhook's failure is the
ledger's to retry).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import httpx

from rhumbatron.core.clock import Clock, utc_day
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import project_admin_key
from rhumbatron.domain.transition import Transition
from rhumbatron.errors import ConfigurationError, DomainError, RhumbatronError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.metrics import DataPoint, MetricBinding, insert_points
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import stable_event_id
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.deliveries import (
    ReactionEffects,
    agent_command_id,
    agent_wake_command,
    attempt_webhook,
    pointer_body,
    webhook_id,
    workflow_input,
    workflow_instance_id,
)
from rhumbatron.reactions.gate import Admission, admit, claim_budget_fact, release
from rhumbatron.reactions.guards import (
    CauseChain,
    Hop,
    SuppressionReason,
    cause_chain,
    check_guards,
    last_fire,
    record_fire,
    record_suppression,
    register_causes,
)
from rhumbatron.reactions.ports import (
    FactSink,
    SubscriptionLike,
    SubscriptionSource,
)
from rhumbatron.reactions.webhook_ledger import (
    Attempt,
    Disablement,
    mark_disablement_recorded,
    record_attempt,
    record_skipped,
)
from rhumbatron.router.claims import claim_leases, complete_claims, release_claims
from rhumbatron.router.records import APPLIED, DUPLICATE, Record, RecordOutcome

if TYPE_CHECKING:
    import sqlite3

    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.core.settings import Settings
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.router.handlers import RunContext

__all__ = [
    "FIRED_METRIC",
    "REFUSED_METRIC",
    "SUPPRESSED_METRIC",
    "NoSubscriptions",
    "Reactions",
    "ReactionsConsumer",
    "ShardFacts",
    "record_disablement",
]

_log = logging.getLogger(__name__)

#: A matching subscription held back by a loop guard (dimension ``reason``).
SUPPRESSED_METRIC = "reaction_suppressed"
#: A reaction the admission gate refused (dimension ``gate``: budget or in_flight).
REFUSED_METRIC = "reaction_refused"
#: A reaction that ran (dimension ``reaction``: webhook, workflow or agent).
FIRED_METRIC = "reaction_fired"
#: The facts the reactions write themselves.
_ACTOR = "system:reactions"
_CONSUMER = Subscription.REACTIONS.value


class NoSubscriptions:
    """No registry is bound: no event matches anything (every event is applied)."""

    def matching(self, tenant_id: str, event: Event) -> Sequence[SubscriptionLike]:
        return ()


@dataclass
class ShardFacts:
    """Writes the reactions' facts in the shard of ``project:<id>`` (its outbox publishes
    them). ``resource_shard`` is ``Rhumbatron.resource_shard``."""

    resource_shard: Callable[[str, str], ResourceShard]
    clock: Clock

    def budget_exceeded(self, event: Event, *, subscription_id: str, limit: int, day: str) -> None:
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


@dataclass
class Reactions:
    """What the consumer reacts with: the registry, the effects, the fact sink, the limits."""

    registry: SubscriptionSource
    effects: ReactionEffects
    facts: FactSink
    limits: ReactionSettings = field(default_factory=ReactionSettings)


@dataclass
class _Plan:
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
class ReactionsConsumer:
    """The :class:`~rhumbatron.router.handlers.RecordHandler` of ``reactions``."""

    settings: Settings
    clock: Clock
    product: ProductDatabase
    metrics_sink: MetricsSink
    reactions: Reactions
    lease_s: float
    subscription: Subscription = Subscription.REACTIONS

    async def handle(self, records: Sequence[Record], run: RunContext) -> dict[str, RecordOutcome]:
        events = [r.event for r in records if r.event is not None]
        # One transaction opens the batch (chains, leases) and one settles it: an event no
        # subscription matches costs no transaction of its own.
        leases = await asyncio.to_thread(self._open_batch, events, run.now_s)
        held = RecordOutcome.retry("claimed by another run whose lease has not expired")
        outcomes: dict[str, RecordOutcome] = {
            e.event_id: held if e.event_id in leases.held else DUPLICATE
            for e in events
            if e.event_id not in leases.fresh
        }
        fresh = [e for e in events if e.event_id in leases.fresh]
        done: list[str] = []
        try:
            # One event after the other: the gate's in-flight count then means what it says.
            # Once a tenant's cap is full, the rest of its events in the batch wait on the
            # stream untouched: no decision, no metric per event, and no later event of it
            # overtaking an earlier one. Other tenants' events go on.
            cap_full: dict[str, RecordOutcome] = {}
            for event in fresh:
                if event.tenant_id in cap_full:
                    outcomes[event.event_id] = cap_full[event.tenant_id]
                    continue
                outcome, refused_in_flight = await self._react_fresh(event, run)
                outcomes[event.event_id] = outcome
                if outcome in (APPLIED, DUPLICATE):
                    done.append(event.event_id)
                elif refused_in_flight:
                    cap_full[event.tenant_id] = outcome
        finally:
            # Whatever did not finish is released for the redelivery; a delivery done stays
            # done under its own claim, so nothing runs twice.
            undone = [e.event_id for e in fresh if e.event_id not in done]
            await asyncio.to_thread(self._settle_records, done, undone, run.now_s)
        return outcomes

    def _open_batch(self, events: list[Event], now_s: float) -> _Leases:
        """Lease the events, and register each event that reactions caused under its own
        ID, matched or not, so the facts it causes in turn (``causedBy = eventId``) inherit
        its chain."""
        with self.product.transaction() as db:
            for event in events:
                register_causes(
                    db,
                    tenant_id=event.tenant_id,
                    chain=cause_chain(db, event),
                    cause_keys=[event.event_id],
                    now_s=now_s,
                )
            leases = claim_leases(
                db, _CONSUMER, [e.event_id for e in events], now_s=now_s, lease_s=self.lease_s
            )
        return _Leases(frozenset(leases.fresh), frozenset(leases.held))

    def mark_processed(self, records: Sequence[Record], run: RunContext) -> None:
        with self.product.transaction() as db:
            complete_claims(db, _CONSUMER, [r.key for r in records], now_s=run.now_s)

    # -- one event -----------------------------------------------------------------------
    async def _react_fresh(self, event: Event, run: RunContext) -> tuple[RecordOutcome, bool]:
        """The event's outcome, and whether the tenant's in-flight cap sent it back."""
        matching = list(self.reactions.registry.matching(event.tenant_id, event))
        if not matching:
            return APPLIED, False
        now = self.clock.now()
        plans, refused_in_flight, held = await asyncio.to_thread(self._decide, event, matching, now)
        failures: list[str] = []
        for plan in plans:
            if plan.over_budget is not None:
                if not await self._record_budget_fact(event, plan):
                    failures.append(f"{plan.key}: budget.exceeded could not be recorded")
                continue
            if not plan.run:
                continue
            error = await self._run(event, plan, now)
            disabled = await asyncio.to_thread(
                self._settle_delivery, event, plan, error is None, run.now_s
            )
            if disabled is not None:
                await record_disablement(self.reactions.facts, self.product, disabled)
            if plan.fired:
                # Counted once the delivery is settled: a metric that failed to write must
                # not leave a delivery that happened unrecorded (and so sent again).
                await asyncio.to_thread(self._fired, event, plan, now.timestamp())
            if error is not None:
                failures.append(f"{plan.key}: {error}")
        if failures:
            return RecordOutcome.failed("; ".join(failures)), False
        if refused_in_flight:
            return RecordOutcome.retry(
                f"the in-flight cap of tenant {event.tenant_id!r} is full "
                f"({self.reactions.limits.reaction_in_flight_cap}, "
                "RHUMBATRON_REACTION_IN_FLIGHT_CAP); the event waits on the stream"
            ), True
        if held:
            return RecordOutcome.retry(
                f"a delivery of {event.event_id} is held by another run whose lease has not "
                "expired; the event waits on the stream"
            ), False
        return APPLIED, False

    # -- decisions (one product transaction) -----------------------------------------------
    def _decide(
        self, event: Event, matching: list[SubscriptionLike], now: datetime
    ) -> tuple[list[_Plan], bool, bool]:
        """Each matching subscription's fate; and whether the in-flight cap sent the event
        back, and whether another run holds one of its deliveries."""
        limits = self.reactions.limits
        now_s, day = now.timestamp(), utc_day(now)
        plans: list[_Plan] = []
        points: list[DataPoint] = []
        refused_in_flight = held = False
        with self.product.transaction() as db:
            chain = cause_chain(db, event)
            keys = [webhook_id(event.event_id, s.subscription_id) for s in matching]
            leases = claim_leases(db, _CONSUMER, keys, now_s=now_s, lease_s=self.lease_s)
            for subscription, key in zip(matching, keys, strict=True):
                if key not in leases.fresh:
                    # Done by an earlier attempt, or held by a live run: either way not ours.
                    held |= key in leases.held
                    continue
                plan = _Plan(subscription, key, chain)
                plans.append(plan)
                kept = subscription.endpoint_disabled is not None
                if not subscription.governance.enabled and not kept:
                    complete_claims(db, _CONSUMER, [key], now_s=now_s)
                    continue
                guard = self._guard(
                    db, event=event, subscription=subscription, key=key, chain=chain, now_s=now_s
                )
                if guard is not None:
                    reason, detail = guard
                    self._suppress(
                        db,
                        event=event,
                        plan=plan,
                        reason=reason,
                        detail=detail,
                        now_s=now_s,
                        points=points,
                    )
                    continue
                if not subscription.governance.enabled:
                    # Its endpoint is disabled: kept (a webhook's), for a replay once enabled.
                    if subscription.reaction.kind == "webhook":
                        record_skipped(
                            db,
                            **_delivery_of(event, subscription, key),
                            body=self._body(event),
                            now_s=now_s,
                        )
                    complete_claims(db, _CONSUMER, [key], now_s=now_s)
                    continue
                decision = admit(
                    db,
                    tenant_id=event.tenant_id,
                    delivery_key=key,
                    day=day,
                    now_s=now_s,
                    daily_budget=limits.reaction_daily_budget,
                    in_flight_cap=limits.reaction_in_flight_cap,
                    lease_s=limits.reaction_in_flight_lease_s,
                )
                match decision.admission:
                    case Admission.OVER_BUDGET:
                        detail = (
                            f"tenant {event.tenant_id!r} used {decision.used} of its "
                            f"{decision.limit} reactions of {day} "
                            "(RHUMBATRON_REACTION_DAILY_BUDGET)"
                        )
                        self._suppress(
                            db,
                            event=event,
                            plan=plan,
                            reason=SuppressionReason.BUDGET,
                            detail=detail,
                            now_s=now_s,
                            points=points,
                        )
                        points.append(_point(REFUSED_METRIC, event, key, gate="budget"))
                        if claim_budget_fact(db, tenant_id=event.tenant_id, day=day):
                            plan.over_budget = (decision.limit, day)
                    case Admission.IN_FLIGHT_FULL:
                        release_claims(db, _CONSUMER, [key])
                        refused_in_flight = True
                        points.append(
                            _point(REFUSED_METRIC, event, f"{key}:{now_s}", gate="in_flight")
                        )
                    case Admission.ADMITTED:
                        plan.run = True
                        hop_chain = chain.then(Hop(event.event_id, subscription.subscription_id))
                        record_fire(
                            db,
                            tenant_id=event.tenant_id,
                            subscription_id=subscription.subscription_id,
                            delivery_key=key,
                            chain=hop_chain,
                            cause_keys=_cause_keys(event.event_id, subscription.subscription_id),
                            now_s=now_s,
                        )
            written = insert_points(db, MetricBinding.METRICS, points, now_s=now_s)
        if written:
            self.metrics_sink.emit(MetricBinding.METRICS, written)
        return plans, refused_in_flight, held

    def _guard(
        self,
        db: sqlite3.Connection,
        *,
        event: Event,
        subscription: SubscriptionLike,
        key: str,
        chain: CauseChain,
        now_s: float,
    ) -> tuple[SuppressionReason, str] | None:
        reaction = subscription.reaction
        cooldown = subscription.governance.cooldown_s
        return check_guards(
            event,
            chain,
            subscription_id=subscription.subscription_id,
            agent_id=reaction.agent_id if reaction.kind == "agent" else None,
            depth_cap=self.reactions.limits.reaction_depth_cap,
            cooldown_s=self.reactions.limits.reaction_default_cooldown_s
            if cooldown is None
            else cooldown,
            last_fire=last_fire(db, subscription.subscription_id),
            delivery_key=key,
            now_s=now_s,
        )

    def _suppress(
        self,
        db: sqlite3.Connection,
        *,
        event: Event,
        plan: _Plan,
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
            points.append(_point(SUPPRESSED_METRIC, event, plan.key, reason=reason.value))

    # -- effects ---------------------------------------------------------------------------
    async def _run(self, event: Event, plan: _Plan, now: datetime) -> str | None:
        """Run the reaction; None when it was taken, else why not (the event fails)."""
        subscription = plan.subscription
        reaction = subscription.reaction
        sub_id = subscription.subscription_id
        effects = self.reactions.effects
        try:
            match reaction.kind:
                case "webhook":
                    # Whatever the answer, the ledger takes it from here (its retries).
                    plan.body = self._body(event)
                    plan.attempt = await attempt_webhook(
                        effects.http(),
                        reaction,
                        msg_id=plan.key,
                        body=plan.body,
                        timestamp=int(now.timestamp()),
                        settings=self.settings,
                    )
                    if not plan.attempt.ok:
                        return None
                case "workflow":
                    flow = reaction
                    try:
                        started = await effects.start_workflow(
                            flow.workflow,
                            workflow_instance_id(event.event_id, sub_id),
                            workflow_input(event, sub_id),
                        )
                    except (DomainError, ConfigurationError) as exc:
                        started, unknown = None, str(exc)
                    else:
                        unknown = "this process has no workflow engine"
                    if started is None:
                        # Never imitated: skipped, and visibly so.
                        await asyncio.to_thread(self._no_workflow, event, plan, unknown, now)
                        return None
                case "agent":
                    agent = reaction
                    await effects.send_command(
                        agent_wake_command(event, sub_id, agent.agent_id, now)
                    )
        except (RhumbatronError, httpx.HTTPError) as exc:
            _log.warning("reaction %s failed: %s", plan.key, exc)
            return f"{type(exc).__name__}: {exc}"
        plan.fired = True
        return None

    def _no_workflow(self, event: Event, plan: _Plan, why: str, now: datetime) -> None:
        points: list[DataPoint] = []
        with self.product.transaction() as db:
            self._suppress(
                db,
                event=event,
                plan=plan,
                reason=SuppressionReason.NO_WORKFLOW,
                detail=why,
                now_s=now.timestamp(),
                points=points,
            )
            written = insert_points(db, MetricBinding.METRICS, points, now_s=now.timestamp())
        self.metrics_sink.emit(MetricBinding.METRICS, written)

    def _fired(self, event: Event, plan: _Plan, now_s: float) -> None:
        kind = plan.subscription.reaction.kind
        point = _point(FIRED_METRIC, event, plan.key, reaction=kind)
        with self.product.transaction() as db:
            written = insert_points(db, MetricBinding.METRICS, [point], now_s=now_s)
        self.metrics_sink.emit(MetricBinding.METRICS, written)

    async def _record_budget_fact(self, event: Event, plan: _Plan) -> bool:
        assert plan.over_budget is not None
        limit, day = plan.over_budget
        try:
            await asyncio.to_thread(
                self.reactions.facts.budget_exceeded,
                event,
                subscription_id=plan.subscription.subscription_id,
                limit=limit,
                day=day,
            )
        except RhumbatronError as exc:
            _log.error("cannot record budget.exceeded for %s: %s", plan.key, exc)
            await asyncio.to_thread(self._unclaim_budget_fact, event.tenant_id, day, plan.key)
            return False
        return True

    # -- claims ----------------------------------------------------------------------------
    def _settle_records(self, done: list[str], undone: list[str], now_s: float) -> None:
        if not (done or undone):
            return
        with self.product.transaction() as db:
            complete_claims(db, _CONSUMER, done, now_s=now_s)
            release_claims(db, _CONSUMER, undone)

    def _settle_delivery(
        self, event: Event, plan: _Plan, done: bool, now_s: float
    ) -> Disablement | None:
        key = plan.key
        disabled = None
        with self.product.transaction() as db:
            release(db, [key])
            if done:
                complete_claims(db, _CONSUMER, [key], now_s=now_s)
            else:
                release_claims(db, _CONSUMER, [key])
            if done and plan.attempt is not None:
                disabled = record_attempt(
                    db,
                    **_delivery_of(event, plan.subscription, key),
                    body=plan.body,
                    attempt=plan.attempt,
                    now_s=now_s,
                    policy=self.reactions.limits.webhook_retry_policy,
                )
        return disabled

    def _body(self, event: Event) -> bytes:
        return pointer_body(event, link_template=self.reactions.limits.reaction_event_link)

    def _unclaim_budget_fact(self, tenant_id: str, day: str, key: str) -> None:
        with self.product.transaction() as db:
            db.execute(
                "DELETE FROM reaction_budget_facts WHERE tenant_id = ? AND day = ?",
                (tenant_id, day),
            )
            # Undo the refusal whole: the redelivery decides it again and records the fact.
            db.execute("DELETE FROM reaction_suppressions WHERE delivery_key = ?", (key,))
            db.execute(
                "DELETE FROM processed_events WHERE consumer = ? AND event_id = ?",
                (_CONSUMER, key),
            )


@dataclass(frozen=True, slots=True)
class _Leases:
    fresh: frozenset[str]
    held: frozenset[str]


def _delivery_of(event: Event, subscription: SubscriptionLike, key: str) -> dict[str, str]:
    """A webhook delivery's identity, as the ledger records it."""
    return {
        "delivery_key": key,
        "tenant_id": event.tenant_id,
        "project_id": event.project_id,
        "event_id": event.event_id,
        "event_type": event.event_type,
        "subscription_id": subscription.subscription_id,
    }


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


def _cause_keys(event_id: str, subscription_id: str) -> list[str]:
    """The IDs a reaction's effect carries, under which its facts find their chain."""
    return [
        webhook_id(event_id, subscription_id),
        workflow_instance_id(event_id, subscription_id),
        agent_command_id(event_id, subscription_id),
    ]


def _point(name: str, event: Event, key: str, **dimensions: str) -> DataPoint:
    return DataPoint(
        name=name,
        dimensions={"tenant": event.tenant_id, **dimensions},
        event_id=key,
        project_id=event.project_id,
    )
