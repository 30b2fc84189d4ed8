"""Every role once per round, in one process: the embedded default's stand-in for the Lambdas.

In the cloud each role is a function woken by a schedule, an alarm or a nudge. Locally (the
demo, the end-to-end tests) :class:`LocalLoop` plays them in rounds: the outbox publisher
drains every actor, the router runs its subscriptions on every stream, each queue's
consumer polls its queue with its handler — the dead-letter queue included — and the webhook
retry pass sends the webhook retries that are due. A round that moves
nothing means the system is quiet; a command waiting for a delayed redelivery (a retry, a
conflict review) is not lost, the next round after its delay picks it up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rhumbatron.messaging.queue_consumer import PollReport

if TYPE_CHECKING:
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["LOOP_QUEUES", "LocalLoop", "RoundReport"]

_log = logging.getLogger(__name__)

#: The queues a round polls, in the order work flows through them.
LOOP_QUEUES = ("integration", "verification", "release", "agent-wakeups", "indexing", "dead-letter")


@dataclass
class RoundReport:
    published: int = 0
    routed: int = 0
    handled: dict[str, int] = field(default_factory=dict)
    webhooks_retried: int = 0

    @property
    def moved(self) -> int:
        return self.published + self.routed + sum(self.handled.values()) + self.webhooks_retried


@dataclass
class LocalLoop:
    """Plays every role of ``app`` in rounds (see the module docstring)."""

    app: Rhumbatron
    rounds: list[RoundReport] = field(default_factory=list)

    async def one_round(self) -> RoundReport:
        from rhumbatron.queues.dead_letter import DeadLetterConsumer

        app = self.app
        report = RoundReport()
        published = await app.drain_alarms()
        report.published = sum(getattr(r, "published", 0) for r in published)
        totals = await app.router().drain(max_rounds=50)
        report.routed = int(totals.get("applied", 0)) + int(totals.get("dead_lettered", 0))
        runtime = await app.queue_runtime()
        lifecycle = app.lifecycle()
        for queue in LOOP_QUEUES:
            if queue == "dead-letter":
                consumer = DeadLetterConsumer(app)
                poll: PollReport = await runtime.poll(
                    queue, consumer, max_fetches=5, on_undecodable=consumer.on_undecodable
                )
            else:
                poll = await runtime.poll(queue, lifecycle.handler(queue), max_fetches=5)
            touched = poll.done + poll.retried + poll.failed + poll.dead_lettered + poll.expired
            if touched:
                report.handled[queue] = touched
        report.webhooks_retried = (await app.webhook_retrier().run()).sent
        self.rounds.append(report)
        return report

    async def run_until(
        self,
        done: Callable[[], bool],
        *,
        max_rounds: int = 200,
        idle_wait_s: float = 0.05,
        max_idle_rounds: int = 40,
    ) -> bool:
        """Run rounds until ``done()``; a quiet round waits ``idle_wait_s`` for delayed
        redeliveries before the next. Gives up after ``max_rounds`` rounds, or
        ``max_idle_rounds`` quiet rounds in a row; returns whether ``done()`` held."""
        idle = 0
        for _ in range(max_rounds):
            if done():
                return True
            report = await self.one_round()
            if report.moved:
                idle = 0
                continue
            idle += 1
            if idle >= max_idle_rounds:
                _log.warning("the local loop went quiet before it was done")
                return done()
            # A bounded wait for a delayed redelivery (a nak with a delay) to come due.
            await asyncio.sleep(idle_wait_s)
        return done()
