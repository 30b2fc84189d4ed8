"""The webhook retry pass: sends the delivery ledger's due retries, once per sweep tick.

Each pass first writes the ``reaction.disabled`` facts the ledger still owes, then takes at
most ``reaction_webhook_retry_batch`` due deliveries (oldest due first), and for each:

* its subscription deleted, or turned off → the delivery is set aside as ``skipped``;
* the admission gate: a retry was charged to the budget when it was first admitted, so the
  budget only stops a replayed delivery that was never admitted (skipped again, to be
  replayed another day); a tenant whose in-flight cap is full has its deliveries given back
  for the next tick, and the other tenants' go on;
* one signed POST with the subscription's current URL and secrets (a rotation applies to
  retries too) and the same ``webhook-id``; the ledger records the outcome.

The pass is bounded in count and in time (``should_stop``), and leases what it takes, so an
overlapping pass sends nothing twice and a pass that died is retried after the lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from rhumbatron.core.clock import Clock, utc_day
from rhumbatron.metrics import DataPoint, MetricBinding, insert_points
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.deliveries import attempt_webhook
from rhumbatron.reactions.gate import Admission, admit, release
from rhumbatron.reactions.reaction_facts import record_disablement
from rhumbatron.reactions.webhook_attempts import record_retry, unrecorded_disablements
from rhumbatron.reactions.webhook_ledger import (
    Attempt,
    DeliveryStatus,
    Disablement,
    WebhookDelivery,
    claim_due,
    get_delivery,
    reschedule,
    skip,
)

if TYPE_CHECKING:
    from rhumbatron.core.settings import Settings
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.reactions.ports import FactSink
    from rhumbatron.reactions.subscription_registry import SubscriptionRegistry

__all__ = ["RETRIED_METRIC", "WEBHOOK_DEAD_METRIC", "RetryPassReport", "WebhookRetrier"]

_log = logging.getLogger(__name__)

#: A webhook retry sent (dimension ``outcome``: delivered, retrying, dead).
RETRIED_METRIC = "webhook_retried"
#: A webhook delivery whose retries ran out (a ``reaction`` dead letter opened).
WEBHOOK_DEAD_METRIC = "webhook_dead_lettered"


@dataclass
class RetryPassReport:
    """What one pass did."""

    sent: int = 0
    delivered: int = 0
    dead: int = 0
    skipped: int = 0
    deferred: int = 0
    disabled: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "sent": self.sent,
            "delivered": self.delivered,
            "dead": self.dead,
            "skipped": self.skipped,
            "deferred": self.deferred,
            "disabled": list(self.disabled),
        }


@dataclass
class WebhookRetrier:
    """Sends due webhook retries (see the module docstring)."""

    product: ProductDatabase
    registry: SubscriptionRegistry
    http: Callable[[], httpx.AsyncClient]
    facts: FactSink
    settings: Settings
    clock: Clock
    metrics_sink: MetricsSink
    limits: ReactionSettings = field(default_factory=ReactionSettings)

    async def run(self, *, should_stop: Callable[[], bool] | None = None) -> RetryPassReport:
        """One pass; returns what it did."""
        report = RetryPassReport()
        for owed in await asyncio.to_thread(self._owed_facts):
            await record_disablement(self.facts, self.product, owed)
        now_s = self.clock.now().timestamp()
        lease_s = self.settings.webhook_timeout_s + 60.0
        due = await asyncio.to_thread(self._claim, now_s, lease_s)
        # A tenant whose in-flight cap is full waits for the next pass; the others go on.
        full: set[str] = set()
        for index, delivery in enumerate(due):
            if should_stop is not None and should_stop():
                # Given back as due now: the next pass takes them first.
                await asyncio.to_thread(self._give_back, due[index:], now_s)
                report.deferred += len(due) - index
                break
            if delivery.tenant_id in full or not await self._retry(delivery, report):
                full.add(delivery.tenant_id)
                await asyncio.to_thread(self._give_back, [delivery], now_s)
                report.deferred += 1
        if report.sent or report.dead:
            _log.info("webhook retry pass: %s", report.as_dict())
        return report

    async def _retry(self, delivery: WebhookDelivery, report: RetryPassReport) -> bool:
        """Retry one delivery; False when its tenant's in-flight cap is full (the caller
        gives it back)."""
        now = self.clock.now()
        now_s = now.timestamp()
        key = delivery.delivery_key
        record = self.registry.get(None, delivery.subscription_id)
        if record is None or not record.governance.enabled or record.reaction.kind != "webhook":
            why = (
                "not sent: the subscription was deleted"
                if record is None
                else "not sent: the subscription is disabled; enable it and replay its "
                "skipped deliveries"
            )
            await asyncio.to_thread(self._skip, key, why, now_s)
            report.skipped += 1
            return True
        admitted = await asyncio.to_thread(self._admit, delivery, now_s, utc_day(now))
        if admitted is Admission.IN_FLIGHT_FULL:
            return False
        if admitted is Admission.OVER_BUDGET:
            why = (
                f"not sent: tenant {delivery.tenant_id!r} spent its reaction budget of "
                f"{utc_day(now)} (RHUMBATRON_REACTION_DAILY_BUDGET); replay it later"
            )
            await asyncio.to_thread(self._skip, key, why, now_s)
            report.skipped += 1
            return True
        try:
            attempt = await attempt_webhook(
                self.http(),
                record.reaction,
                msg_id=key,
                body=delivery.body.encode("utf-8"),
                timestamp=int(now_s),
                settings=self.settings,
            )
        finally:
            await asyncio.to_thread(self._release, key)
        report.sent += 1
        after, disabled = await asyncio.to_thread(self._record, delivery, attempt)
        if disabled is not None:
            report.disabled.append(disabled.subscription_id)
            await record_disablement(self.facts, self.product, disabled)
        if after is DeliveryStatus.DELIVERED:
            report.delivered += 1
        elif after is DeliveryStatus.DEAD:
            report.dead += 1
        return True

    # -- product transactions ------------------------------------------------------------------
    def _owed_facts(self) -> list[Disablement]:
        with self.product.transaction() as db:
            return unrecorded_disablements(db)

    def _claim(self, now_s: float, lease_s: float) -> list[WebhookDelivery]:
        with self.product.transaction() as db:
            return claim_due(
                db, now_s=now_s, limit=self.limits.reaction_webhook_retry_batch, lease_s=lease_s
            )

    def _give_back(self, deliveries: list[WebhookDelivery], now_s: float) -> None:
        with self.product.transaction() as db:
            for delivery in deliveries:
                reschedule(db, delivery.delivery_key, at_s=now_s)

    def _skip(self, key: str, why: str, now_s: float) -> None:
        with self.product.transaction() as db:
            skip(db, key, why, now_s=now_s)

    def _admit(self, delivery: WebhookDelivery, now_s: float, day: str) -> Admission:
        limits = self.limits
        with self.product.transaction() as db:
            return admit(
                db,
                tenant_id=delivery.tenant_id,
                delivery_key=delivery.delivery_key,
                day=day,
                now_s=now_s,
                daily_budget=limits.reaction_daily_budget,
                in_flight_cap=limits.reaction_in_flight_cap,
                lease_s=limits.reaction_in_flight_lease_s,
            ).admission

    def _release(self, key: str) -> None:
        with self.product.transaction() as db:
            release(db, [key])

    def _record(
        self, delivery: WebhookDelivery, attempt: Attempt
    ) -> tuple[DeliveryStatus, Disablement | None]:
        now_s = self.clock.now().timestamp()
        with self.product.transaction() as db:
            disabled = record_retry(
                db, delivery, attempt, now_s=now_s, policy=self.limits.webhook_retry_policy
            )
            after = get_delivery(db, delivery.delivery_key).status
            points = [
                DataPoint(
                    name=RETRIED_METRIC,
                    dimensions={"tenant": delivery.tenant_id, "outcome": after.value},
                    event_id=f"{delivery.delivery_key}:{now_s}",
                    project_id=delivery.project_id,
                )
            ]
            if after is DeliveryStatus.DEAD:
                points.append(
                    DataPoint(
                        name=WEBHOOK_DEAD_METRIC,
                        dimensions={"tenant": delivery.tenant_id},
                        event_id=f"{delivery.delivery_key}:{now_s}",
                        project_id=delivery.project_id,
                    )
                )
            written = insert_points(db, MetricBinding.METRICS, points, now_s=now_s)
        self.metrics_sink.emit(MetricBinding.METRICS, written)
        return after, disabled
