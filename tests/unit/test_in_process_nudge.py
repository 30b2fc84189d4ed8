"""The local invoker's nudge (``InProcessNudge``): a router run per stream, in a context of
its own, as the router-nudge function's async invoke is in the cloud."""

from __future__ import annotations

from collections.abc import Callable

from rhumbatron.core.log_context import correlated, current_correlation_id
from rhumbatron.router.nudge import InProcessNudge
from rhumbatron.router.reports import RunReport


class _SeeingRouter:
    """A router that notes the correlation ID bound while each of its runs works."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    async def nudge(
        self, stream_index: int, *, should_stop: Callable[[], bool] | None = None
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
