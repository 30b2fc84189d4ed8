"""The local invoker's nudge (``InProcessNudge``): a router run per stream, in a context of
its own, as the router-nudge function's async invoke is in the cloud."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rhumbatron.core.log_context import correlated, current_correlation_id
from rhumbatron.router.nudge import InProcessNudge
from rhumbatron.router.reports import RunReport, SubscriptionReport


class _SeeingRouter:
    """A router that notes the correlation ID bound while each of its runs works."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    async def nudge(
        self,
        stream_index: int,
        *,
        should_stop: Callable[[], bool] | None = None,
        settle: bool = True,
    ) -> RunReport:
        self.seen.append(current_correlation_id())
        return RunReport(stream_index, "nudge")

    async def release_held(self, stream_index: int | None = None) -> int:
        return 0


async def test_a_nudge_run_does_not_carry_the_nudgers_correlation_id() -> None:
    # GIVEN the local invoker's nudge, bound to a router
    router = _SeeingRouter()
    nudge = InProcessNudge()
    nudge.bind(router)
    # WHEN a command's work (its correlation ID bound) nudges a stream
    with correlated("cmd_publishing_one"):
        await nudge.nudge(3)
    await nudge.settle()
    # THEN the router's run logs with no correlation ID of that command: the run is the
    #   stream's, started by it, not part of it
    assert router.seen == [None]
    assert nudge.runs == 1


class _GatedRouter:
    """A router whose runs wait for the test to let them finish, one gate per run; a run can
    leave records waiting, or fail, and so can the release after it."""

    def __init__(self, *, hold: bool = True) -> None:
        self.hold = hold
        self.runs: list[int] = []
        self.released: list[int | None] = []
        self.gates: list[asyncio.Event] = []
        self.leave_waiting: list[bool] = []
        self.fail_runs = False
        self.fail_release = False
        #: Each run's ``settle``: whether it waited for its acks itself.
        self.settles: list[bool] = []

    async def nudge(
        self,
        stream_index: int,
        *,
        should_stop: Callable[[], bool] | None = None,
        settle: bool = True,
    ) -> RunReport:
        self.runs.append(stream_index)
        self.settles.append(settle)
        if self.hold:
            gate = asyncio.Event()
            self.gates.append(gate)
            await gate.wait()
        if self.fail_runs:
            raise RuntimeError("the run broke")
        report = RunReport(stream_index, "nudge")
        if self.leave_waiting and self.leave_waiting.pop(0):
            report.subscriptions["project-view-projector"] = SubscriptionReport(deferred=1)
        return report

    async def release_held(self, stream_index: int | None = None) -> int:
        self.released.append(stream_index)
        if self.fail_release:
            raise RuntimeError("the release broke")
        return 0

    async def open_gates(self) -> None:
        """Let every run started so far finish."""
        for gate in self.gates:
            gate.set()

    async def started(self, count: int) -> None:
        """Let the event loop go on until ``count`` runs have started (bounded)."""
        for _ in range(100):
            if len(self.runs) >= count:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"{len(self.runs)} runs started, not {count}")


async def test_nudges_that_arrive_during_a_run_merge_into_one_more_run_of_that_stream() -> None:
    # GIVEN a run of stream 1 under way, and one of stream 2
    router = _GatedRouter()
    nudge = InProcessNudge()
    nudge.bind(router)
    await nudge.nudge(1)
    await nudge.nudge(2)
    await router.started(2)
    assert router.runs == [1, 2]
    # WHEN stream 1 is nudged three more times while its run goes on
    for _ in range(3):
        await nudge.nudge(1)
    await router.open_gates()
    await router.started(3)
    await router.open_gates()
    await nudge.settle()
    # THEN the three merged into one more run of stream 1; stream 2 ran once; each stream's
    #   held records were released once, after its last run
    assert sorted(router.runs) == [1, 1, 2]
    assert nudge.runs == 3
    assert sorted(router.released, key=str) == [1, 2]


async def test_a_run_that_left_records_waiting_runs_again_before_it_releases_them() -> None:
    router = _GatedRouter(hold=False)
    router.leave_waiting = [True, True, False]
    nudge = InProcessNudge()
    nudge.bind(router)
    await nudge.nudge(4)
    await nudge.settle()
    assert router.runs == [4, 4, 4]
    assert router.released == [4]
    # no run waited for its own acks: each went out while the next ran, the last ones at
    # the release (``group_sync``)
    assert router.settles == [False, False, False]


async def test_a_failed_run_and_a_failed_release_are_logged_naming_the_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = _GatedRouter(hold=False)
    router.fail_runs = router.fail_release = True
    nudge = InProcessNudge()
    nudge.bind(router)
    await nudge.nudge(6)
    await nudge.settle()
    # nothing raised: the sweep applies what a failed nudge missed
    assert [r.getMessage() for r in caplog.records] == [
        "router nudge for stream 6 failed",
        "cannot release the records kept for stream 6",
    ]
    assert (nudge.runs, router.released) == (0, [6])


async def test_a_nudge_that_is_off_or_has_no_router_runs_nothing() -> None:
    router = _GatedRouter()
    off = InProcessNudge(enabled=False)
    off.bind(router)
    await off.nudge(1)
    await InProcessNudge().nudge(1)
    await asyncio.sleep(0)
    assert router.runs == []
