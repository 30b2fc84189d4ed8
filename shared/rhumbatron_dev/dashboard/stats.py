"""What the local roles did, kept in memory for the dashboard's "functions" panel.

In the cloud each role is a Lambda function and CloudWatch counts its invocations, errors
and durations. ``rhumbatron up`` plays the roles in one process (:mod:`rhumbatron_dev.local.up`),
so it counts them itself: every tick of a role is one "invocation", with its duration, the
items it moved and the error it raised, if any. The publisher's reports and the queue
consumers' polls also feed the throughput, publish-error and commands panels.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rhumbatron.actors.publisher import PublishReport
    from rhumbatron.core.clock import Clock
    from rhumbatron.messaging.queue_consumer import PollReport

__all__ = ["LocalRunStats", "RoleStats"]

#: Minutes of published-event counts kept for the throughput panel.
_KEPT_MINUTES = 60


@dataclass
class RoleStats:
    """One role's ticks so far: how many, how many moved something, how many failed, and
    how long they took."""

    ticks: int = 0
    busy_ticks: int = 0
    errors: int = 0
    items: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    last_s: float | None = None
    last_at_s: float | None = None
    last_error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON the dashboard shows (durations in milliseconds)."""
        return {
            "ticks": self.ticks,
            "busyTicks": self.busy_ticks,
            "errors": self.errors,
            "items": self.items,
            "lastDurationMs": None if self.last_s is None else round(self.last_s * 1000, 1),
            "avgDurationMs": round(self.total_s / self.ticks * 1000, 1) if self.ticks else None,
            "maxDurationMs": round(self.max_s * 1000, 1),
            "lastAtS": self.last_at_s,
            "lastError": self.last_error,
        }


@dataclass
class LocalRunStats:
    """Counters of one ``rhumbatron up`` run; the clock dates ticks and minute buckets."""

    clock: Clock
    roles: dict[str, RoleStats] = field(default_factory=dict)
    #: Events the publisher sent, per minute (epoch seconds of the minute's start).
    published_per_minute: dict[int, int] = field(default_factory=dict)
    published_total: int = 0
    #: Publish failures by kind: rows that will be retried, rows given up as failed, whole
    #: actors the publisher could not read, and publishes with NATS unavailable.
    publish_errors: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("rowRetries", "rowsFailed", "actorErrors", "unavailable"), 0
        )
    )
    last_publish_error: str | None = None
    #: Commands each queue's consumer handled, by outcome.
    handled: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Router nudge runs the publisher started (they run in the background, uncounted by tick).
    router_nudges: int = 0

    def tick(
        self, role: str, duration_s: float, *, items: int = 0, error: str | None = None
    ) -> None:
        """Count one tick of ``role`` that took ``duration_s`` and moved ``items``."""
        stats = self.roles.setdefault(role, RoleStats())
        stats.ticks += 1
        stats.items += items
        stats.busy_ticks += 1 if items else 0
        stats.total_s += duration_s
        stats.max_s = max(stats.max_s, duration_s)
        stats.last_s = duration_s
        stats.last_at_s = self.clock.now().timestamp()
        if error is not None:
            stats.errors += 1
            stats.last_error = error

    def record_publish(self, reports: Iterable[PublishReport]) -> int:
        """Count what the publisher did; return the events it published."""
        published = 0
        for report in reports:
            published += report.published
            self.publish_errors["rowRetries"] += report.retry_wait
            self.publish_errors["rowsFailed"] += report.failed
            if report.error is not None:
                self.publish_errors["actorErrors"] += 1
                self.last_publish_error = f"{report.actor_key}: {report.error}"
            elif report.unavailable:
                self.publish_errors["unavailable"] += 1
                self.last_publish_error = f"{report.actor_key}: NATS unavailable"
        if published:
            minute = int(self.clock.now().timestamp()) // 60 * 60
            self.published_per_minute[minute] = self.published_per_minute.get(minute, 0) + published
            self.published_total += published
            for old in sorted(self.published_per_minute)[:-_KEPT_MINUTES]:
                del self.published_per_minute[old]
        return published

    def record_poll(self, report: PollReport) -> int:
        """Count one poll of a queue; return the commands it settled."""
        outcomes = {
            "done": report.done,
            "retried": report.retried,
            "failed": report.failed,
            "deadLettered": report.dead_lettered,
            "terminated": report.terminated,
            "expired": report.expired,
        }
        counts = self.handled.setdefault(report.queue, dict.fromkeys(outcomes, 0))
        for outcome, count in outcomes.items():
            counts[outcome] += count
        return report.done + report.retried + report.failed + report.dead_lettered + report.expired

    def events_per_minute(self, minutes: int = 10) -> list[dict[str, int]]:
        """Published events in each of the last ``minutes`` minutes, oldest first (zeros
        included, so a chart has a bar for every minute)."""
        current = int(self.clock.now().timestamp()) // 60 * 60
        return [
            {"minute": start, "events": self.published_per_minute.get(start, 0)}
            for start in range(current - 60 * (minutes - 1), current + 1, 60)
        ]

    def to_wire(self) -> dict[str, Any]:
        """The roles as the functions panel shows them, by name."""
        return {name: stats.to_wire() for name, stats in sorted(self.roles.items())}
