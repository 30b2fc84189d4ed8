"""One nudge run in flight per stream, at most one pending (issue #16): the turn each stream's
state file keeps, and the nudge that runs in it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.router.nudge_turn import nudge_in_turn
from rhumbatron.router.reports import RunReport, SubscriptionReport
from rhumbatron.router.stream_state import StreamState

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
T0 = NOW.timestamp()


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StreamState]:
    stream = StreamState(load_settings(state_dir=tmp_path, network_filesystem=False), 3)
    yield stream
    stream.close()


def test_a_nudge_finding_the_turn_held_is_merged_and_the_holder_runs_once_more(
    state: StreamState,
) -> None:
    # GIVEN a run holding stream 3's turn
    assert state.take_nudge_turn("a", now_s=T0, hold_s=60)
    # WHEN two more nudges arrive while it runs
    assert not state.take_nudge_turn("b", now_s=T0 + 1, hold_s=60)
    assert not state.take_nudge_turn("c", now_s=T0 + 2, hold_s=60)
    # THEN its run ends with one more run to do, not two, and then the turn is free
    assert state.next_nudge_turn("a", now_s=T0 + 3, hold_s=60)
    assert not state.next_nudge_turn("a", now_s=T0 + 4, hold_s=60)
    assert state.take_nudge_turn("d", now_s=T0 + 5, hold_s=60)


def test_a_run_nobody_nudged_during_gives_the_turn_back(state: StreamState) -> None:
    assert state.take_nudge_turn("a", now_s=T0, hold_s=60)
    assert not state.next_nudge_turn("a", now_s=T0 + 1, hold_s=60)
    assert state.take_nudge_turn("b", now_s=T0 + 2, hold_s=60)


def test_a_turn_whose_holder_died_is_free_when_its_time_runs_out(state: StreamState) -> None:
    # GIVEN a holder that took the turn for 60 s and died
    assert state.take_nudge_turn("dead", now_s=T0, hold_s=60)
    # THEN a nudge within the 60 s is merged, one at its end takes the turn
    assert not state.take_nudge_turn("b", now_s=T0 + 59.9, hold_s=60)
    assert state.take_nudge_turn("c", now_s=T0 + 60, hold_s=60)
    # AND taking it cleared the merged nudge: the new run covers it
    assert not state.next_nudge_turn("c", now_s=T0 + 61, hold_s=60)
    # AND the dead holder, were it to wake, no longer holds anything
    assert state.take_nudge_turn("e", now_s=T0 + 62, hold_s=60)
    assert not state.next_nudge_turn("dead", now_s=T0 + 63, hold_s=60)
    assert not state.take_nudge_turn("f", now_s=T0 + 64, hold_s=60)  # still e's


def test_running_again_extends_the_hold(state: StreamState) -> None:
    assert state.take_nudge_turn("a", now_s=T0, hold_s=60)
    assert not state.take_nudge_turn("b", now_s=T0 + 50, hold_s=60)
    assert state.next_nudge_turn("a", now_s=T0 + 55, hold_s=60)  # held to T0 + 115
    assert not state.take_nudge_turn("c", now_s=T0 + 100, hold_s=60)


def test_a_turn_given_back_early_keeps_its_merged_nudge_pending(state: StreamState) -> None:
    assert state.take_nudge_turn("a", now_s=T0, hold_s=60)
    assert not state.take_nudge_turn("b", now_s=T0 + 1, hold_s=60)
    state.give_back_nudge_turn("a")
    # another holder's turn is not given back by a stale one
    assert state.take_nudge_turn("c", now_s=T0 + 2, hold_s=60)
    state.give_back_nudge_turn("a")
    assert not state.take_nudge_turn("d", now_s=T0 + 3, hold_s=60)


@dataclass
class BusyRouter:
    """A router whose runs take ``run_s`` on the clock, while other containers nudge the
    same stream ``nudges_during[n]`` times during run ``n``."""

    state: StreamState
    clock: ManualClock
    nudges_during: list[int]
    run_s: float = 1.0
    runs: int = 0
    merged: list[bool] = field(default_factory=list)
    #: Runs (by number) that leave fetched records waiting for the next run.
    leave_waiting: set[int] = field(default_factory=set)
    released: list[int] = field(default_factory=list)
    #: Each run's ``settle``: whether it waited for its acks itself.
    settles: list[bool] = field(default_factory=list)

    def stream_state(self, stream_index: int) -> StreamState:
        return self.state

    async def release_held(self, stream_index: int | None = None) -> int:
        assert stream_index is not None
        self.released.append(stream_index)
        return 0

    async def nudge(
        self,
        stream_index: int,
        *,
        should_stop: Callable[[], bool] | None = None,
        settle: bool = True,
    ) -> RunReport:
        self.settles.append(settle)
        others = self.nudges_during[self.runs] if self.runs < len(self.nudges_during) else 0
        for _ in range(others):
            other = await nudge_in_turn(self, stream_index, hold_s=60)
            self.merged.append(other.merged)
        self.runs += 1
        self.clock.advance(seconds=self.run_s)
        report = RunReport(stream_index, "nudge")
        deferred = 1 if self.runs in self.leave_waiting else 0
        report.subscriptions["project-view-projector"] = SubscriptionReport(
            fetched=2 + deferred, applied=2, deferred=deferred
        )
        return report


async def test_nudges_during_a_run_cost_one_more_run_whatever_their_number(
    state: StreamState,
) -> None:
    # GIVEN a run during which five other nudges arrive, and one during the run after
    router = BusyRouter(state, ManualClock(NOW), nudges_during=[5, 1])
    # WHEN the first nudge runs in the stream's turn
    turn = await nudge_in_turn(router, 3, hold_s=60)
    # THEN every other nudge was merged, and they cost two more runs in all, not six
    assert router.merged == [True] * 6
    assert (turn.runs, turn.merged, router.runs) == (3, False, 3)
    assert turn.report.subscriptions["project-view-projector"].applied == 6
    # AND the turn is free again
    assert state.take_nudge_turn("next", now_s=router.clock.now().timestamp(), hold_s=60)


async def test_a_run_that_leaves_records_waiting_runs_again_in_its_turn(
    state: StreamState,
) -> None:
    # GIVEN runs 1 and 2 that leave fetched records waiting (the apply-call cap), no nudges
    router = BusyRouter(state, ManualClock(NOW), nudges_during=[], leave_waiting={1, 2})
    # WHEN one nudge runs in the stream's turn
    turn = await nudge_in_turn(router, 3, hold_s=60)
    # THEN it ran until a run left nothing waiting, then released what was kept, once
    assert (turn.runs, router.runs) == (3, 3)
    assert router.released == [3]
    # AND no run waited for its own acks: each went out while the next ran, the last ones
    #   at the release (``group_sync``)
    assert router.settles == [False, False, False]
    assert state.take_nudge_turn("next", now_s=router.clock.now().timestamp(), hold_s=60)


async def test_a_run_out_of_time_releases_what_it_left_waiting(state: StreamState) -> None:
    router = BusyRouter(state, ManualClock(NOW), nudges_during=[], leave_waiting={1, 2})
    turn = await nudge_in_turn(router, 3, hold_s=60, should_stop=lambda: router.runs >= 1)
    assert (turn.runs, router.released) == (1, [3])
    assert state.take_nudge_turn("next", now_s=router.clock.now().timestamp(), hold_s=60)


async def test_a_run_out_of_time_gives_the_turn_back_and_leaves_the_merged_nudge(
    state: StreamState,
) -> None:
    router = BusyRouter(state, ManualClock(NOW), nudges_during=[1])
    turn = await nudge_in_turn(router, 3, hold_s=60, should_stop=lambda: router.runs >= 1)
    assert (turn.runs, router.merged) == (1, [True])
    # the turn is free: the next nudge (or the sweep) picks up what was left
    assert state.take_nudge_turn("next", now_s=router.clock.now().timestamp(), hold_s=60)


async def test_a_failing_run_gives_the_turn_back(state: StreamState) -> None:
    @dataclass
    class FailingRouter(BusyRouter):
        async def nudge(
            self,
            stream_index: int,
            *,
            should_stop: Callable[[], bool] | None = None,
            settle: bool = True,
        ) -> RunReport:
            raise RuntimeError("the view store is locked")

    router = FailingRouter(state, ManualClock(NOW), nudges_during=[])
    with pytest.raises(RuntimeError, match="locked"):
        await nudge_in_turn(router, 3, hold_s=60)
    assert state.take_nudge_turn("next", now_s=T0, hold_s=60)


def test_a_records_failures_are_counted_per_consumer_with_the_last_error_kept_short(
    offline_settings: Settings,
) -> None:
    # GIVEN a stream's state file where no record has failed yet
    state = StreamState(offline_settings, 2)
    assert state.failures("causal-router", "evt_1") == 0
    # WHEN one record fails twice for one consumer, the second time with a very long error
    assert state.count_failure("causal-router", "evt_1", "first", now_s=1.0) == 1
    assert state.count_failure("causal-router", "evt_1", "x" * 3_000, now_s=2.0) == 2
    # THEN its count is two for that consumer and none for another; the error kept is the
    # last one, cut to 2,000 characters
    assert state.failures("causal-router", "evt_1") == 2
    assert state.failures("audit-archiver", "evt_1") == 0
    kept = state.connection.execute(
        "SELECT first_failed_at_s, last_failed_at_s, last_error FROM k2_batch_failures"
    ).fetchone()
    assert (kept[0], kept[1], kept[2]) == (1.0, 2.0, "x" * 2_000)
    state.close()
