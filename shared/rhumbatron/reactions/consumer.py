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

This module handles the batch and runs the reactions; the decision of one event (guards and
gate, in one product transaction) is :mod:`~rhumbatron.reactions.reaction_decisions`', and the
facts the reactions write are :mod:`~rhumbatron.reactions.reaction_facts`'.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import httpx

from rhumbatron.core.clock import Clock
from rhumbatron.errors import ConfigurationError, DomainError, RhumbatronError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.metrics import DataPoint, MetricBinding, insert_points
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.deliveries import (
    ReactionEffects,
    agent_wake_command,
    attempt_webhook,
    pointer_body,
    workflow_input,
    workflow_instance_id,
)
from rhumbatron.reactions.gate import release
from rhumbatron.reactions.guards import SuppressionReason, cause_chain, register_causes
from rhumbatron.reactions.ports import (
    FactSink,
    SubscriptionLike,
    SubscriptionSource,
)
from rhumbatron.reactions.reaction_decisions import (
    EventDecision,
    ReactionPlan,
    decide_event,
    delivery_identity,
    reaction_point,
    suppress,
)
from rhumbatron.reactions.reaction_facts import record_disablement
from rhumbatron.reactions.webhook_attempts import record_attempt
from rhumbatron.reactions.webhook_ledger import Disablement
from rhumbatron.router.claims import claim_leases, complete_claims, release_claims
from rhumbatron.router.records import (
    APPLIED,
    DUPLICATE,
    Record,
    RecordOutcome,
    event_span,
    record_traces,
)

if TYPE_CHECKING:
    from rhumbatron.core.settings import Settings
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.router.handlers import RunContext

__all__ = [
    "FIRED_METRIC",
    "Reactions",
    "ReactionsConsumer",
]

_log = logging.getLogger(__name__)

#: A reaction that ran (dimension ``reaction``: webhook, workflow or agent).
FIRED_METRIC = "reaction_fired"
_CONSUMER = Subscription.REACTIONS.value


@dataclass
class Reactions:
    """What the consumer reacts with: the registry, the effects, the fact sink, the limits."""

    registry: SubscriptionSource
    effects: ReactionEffects
    facts: FactSink
    limits: ReactionSettings = field(default_factory=ReactionSettings)


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
        traces = record_traces(records) if fresh else {}
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
                with event_span("react", event, traces.get(event.event_id)):
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
        decision = await asyncio.to_thread(self._decide, event, matching, now)
        failures: list[str] = []
        for plan in decision.plans:
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
        if decision.refused_in_flight:
            return RecordOutcome.retry(
                f"the in-flight cap of tenant {event.tenant_id!r} is full "
                f"({self.reactions.limits.reaction_in_flight_cap}, "
                "RHUMBATRON_REACTION_IN_FLIGHT_CAP); the event waits on the stream"
            ), True
        if decision.held:
            return RecordOutcome.retry(
                f"a delivery of {event.event_id} is held by another run whose lease has not "
                "expired; the event waits on the stream"
            ), False
        return APPLIED, False

    # -- decisions (one product transaction) -----------------------------------------------
    def _decide(
        self, event: Event, matching: list[SubscriptionLike], now: datetime
    ) -> EventDecision:
        """Each matching subscription's fate (:func:`decide_event`); and whether the in-flight
        cap sent the event back, and whether another run holds one of its deliveries."""
        with self.product.transaction() as db:
            decision = decide_event(
                db,
                event,
                matching,
                now=now,
                limits=self.reactions.limits,
                lease_s=self.lease_s,
            )
            written = insert_points(
                db, MetricBinding.METRICS, decision.points, now_s=now.timestamp()
            )
        if written:
            self.metrics_sink.emit(MetricBinding.METRICS, written)
        return decision

    # -- effects ---------------------------------------------------------------------------
    async def _run(self, event: Event, plan: ReactionPlan, now: datetime) -> str | None:
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

    def _no_workflow(self, event: Event, plan: ReactionPlan, why: str, now: datetime) -> None:
        points: list[DataPoint] = []
        with self.product.transaction() as db:
            suppress(
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

    def _fired(self, event: Event, plan: ReactionPlan, now_s: float) -> None:
        kind = plan.subscription.reaction.kind
        point = reaction_point(FIRED_METRIC, event, plan.key, reaction=kind)
        with self.product.transaction() as db:
            written = insert_points(db, MetricBinding.METRICS, [point], now_s=now_s)
        self.metrics_sink.emit(MetricBinding.METRICS, written)

    async def _record_budget_fact(self, event: Event, plan: ReactionPlan) -> bool:
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
        self, event: Event, plan: ReactionPlan, done: bool, now_s: float
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
                    **delivery_identity(event, plan.subscription, key),
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
