"""What the router's runs report: one subscription's counts, one run, one sweep tick."""

from __future__ import annotations

from dataclasses import dataclass, field

from rhumbatron.messaging.event_log import ConsumerLag
from rhumbatron.router.records import Outcome

__all__ = ["RunReport", "SubscriptionReport", "SweepReport"]

#: The count each outcome adds to.
_COUNTERS = {
    Outcome.APPLIED: "applied",
    Outcome.DUPLICATE: "duplicates",
    Outcome.DEFERRED: "deferred",
    Outcome.RETRY: "retried",
    Outcome.FAILED: "failed",
}


@dataclass
class SubscriptionReport:
    """What one subscription did in one run."""

    consumes: int = 0
    fetched: int = 0
    applied: int = 0
    duplicates: int = 0
    deferred: int = 0
    retried: int = 0
    failed: int = 0
    dead_lettered: int = 0

    def absorb(self, other: SubscriptionReport) -> None:
        """Add ``other``'s counts to these (one summary over several runs)."""
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def recount(self, was: Outcome, now: Outcome) -> None:
        """Move one record counted as ``was`` to ``now`` (its settling changed it later)."""
        setattr(self, _COUNTERS[was], getattr(self, _COUNTERS[was]) - 1)
        self.count(now)

    def count(self, outcome: Outcome) -> None:
        name = _COUNTERS[outcome]
        setattr(self, name, getattr(self, name) + 1)


@dataclass
class RunReport:
    """One nudge or sweep run on one stream."""

    stream_index: int
    kind: str
    subscriptions: dict[str, SubscriptionReport] = field(default_factory=dict)

    def total(self, name: str) -> int:
        return sum(getattr(report, name) for report in self.subscriptions.values())

    @property
    def left_waiting(self) -> bool:
        """Whether the run fetched records it had to leave for the next run (deferred by the
        apply-call cap): its process keeps them, and runs the stream again."""
        return self.total("deferred") > 0

    def absorb(self, other: RunReport) -> None:
        """Add the counts of ``other`` (a later run on the same stream) to this one's."""
        for name, counts in other.subscriptions.items():
            self.subscriptions.setdefault(name, SubscriptionReport()).absorb(counts)


@dataclass
class SweepReport:
    """One sweep tick: the run on its stream, and the housekeeping it did."""

    run: RunReport
    minute_of_day: int
    maintenance: bool
    release_sweep: bool
    analytics: bool
    lags: list[ConsumerLag] = field(default_factory=list)
    outbox_backlog: dict[str, int] = field(default_factory=dict)
    pruned_claims: int = 0
    pruned_feed_rows: int = 0
    pruned_metric_rows: int = 0
    pruned_audit_rows: int = 0
    pruned_reaction_rows: int = 0
    archive_objects_expired: int = 0
    archive_objects: list[tuple[str, int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: The capacity check's share of the tightest ceiling the measured rate uses (percent);
    #: None when this tick did not measure (hourly) or could not.
    capacity_used_percent: float | None = None
    #: The reactions batch of every other stream, by stream name.
    reactions_elsewhere: dict[str, SubscriptionReport] = field(default_factory=dict)
    #: Drain mode: the archiver, analytics and reactions run on every other stream, by name.
    drained_elsewhere: dict[str, RunReport] = field(default_factory=dict)
