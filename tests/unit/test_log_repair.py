"""The repair publishes again only what no copy holds, and only when every copy was read
(issue #18): an event a copy that could not be read may still hold would be a duplicate
there."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from rhumbatron.messaging.log_state import ReplicaState
from rhumbatron.operator.log_repair import Republished, repair
from rhumbatron.operator.reconciliation import (
    ReconciliationReport,
    ReplicaReport,
    StreamReconciliation,
)

STREAM = "EVENTS_03"
AT = datetime(2026, 12, 4, tzinfo=UTC)


class RecordingRepublisher:
    """Stores every event it is asked to publish again, and says so."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    async def republish(self, stream: str, event_ids: Sequence[str]) -> Republished:
        self.asked.append((stream, tuple(event_ids)))
        return Republished(tuple(event_ids), (), ())


def copy(node: str, missing: tuple[str, ...], *, error: str | None = None) -> ReplicaReport:
    state = ReplicaState(STREAM, node, 3 - len(missing), 1, 3, 0, "node0")
    found = 0 if error else 3 - len(missing)
    return ReplicaReport(node, node == "node0", 3, found, () if error else missing, state, 0, error)


def report_of(*replicas: ReplicaReport) -> ReconciliationReport:
    return ReconciliationReport(
        checked_from=AT, checked_to=AT, streams=[StreamReconciliation(STREAM, 3, replicas)]
    )


async def test_events_every_copy_lacks_are_published_again_and_nothing_else() -> None:
    # GIVEN three copies that all lack e-3, one of which also lacks e-2
    report = report_of(
        copy("node0", ("e-3",)), copy("node1", ("e-2", "e-3")), copy("node2", ("e-3",))
    )
    republisher = RecordingRepublisher()
    # WHEN the repair runs
    [step] = await repair(None, report, dry_run=False, republisher=republisher)  # type: ignore[arg-type]
    # THEN it publishes e-3 again, and only e-3 (node0 and node2 still hold e-2)
    assert republisher.asked == [(STREAM, ("e-3",))]
    assert (step.action, step.done) == ("republish", True)


async def test_nothing_is_published_again_while_a_copy_could_not_be_read() -> None:
    # GIVEN two copies that lack e-3 and one whose read failed (it may hold e-3)
    unread = copy("node2", (), error="cannot read the event IDs of EVENTS_03 on node2")
    report = report_of(copy("node0", ("e-3",)), copy("node1", ("e-3",)), unread)
    republisher = RecordingRepublisher()
    # WHEN the repair runs
    steps = await repair(None, report, dry_run=False, republisher=republisher)  # type: ignore[arg-type]
    # THEN it publishes nothing again and says why
    assert republisher.asked == []
    [step] = [s for s in steps if s.action == "republish"]
    assert not step.done
    assert "node2 could not be read" in step.detail
