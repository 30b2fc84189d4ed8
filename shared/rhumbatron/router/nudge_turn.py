"""One nudge run in flight per stream, across processes, with at most one pending.

In the cloud every publish that moves a stream sends the router-nudge function an async
invoke, and Lambda runs concurrent invokes in separate containers: without a turn, a busy
stream would get one run per nudge, side by side, each fetching from the same consumers. A
nudge runs only in its stream's turn (``StreamState.take_nudge_turn``, a row in the stream's
SQLite file that every container shares). A nudge that finds the turn held is merged into it:
it marks the turn pending and returns, and the holder runs once more when its run ends. So
nudges arriving during a run cost one more run, whatever their number, and the cost of a run
is spread over more events as load rises.

Nothing is lost when a holder dies: its turn expires with its invocation's deadline, and the
every-minute sweep reads every stream whatever the nudges do. The local invoker's
:class:`~rhumbatron.router.nudge.InProcessNudge` merges within its one process without this.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.protocol.ids import EVENT_STREAM_COUNT
from rhumbatron.router.reports import RunReport

if TYPE_CHECKING:
    from rhumbatron.router.ports import TurnedRouter

__all__ = ["NudgeTurnReport", "nudge_in_turn", "turn_taken_since"]


@dataclass
class NudgeTurnReport:
    """A nudge in turn: its runs' counts summed, how many runs, and whether it was merged
    into a run in flight instead of running (then ``runs`` is 0)."""

    report: RunReport
    runs: int = 0
    merged: bool = False


async def nudge_in_turn(
    router: TurnedRouter,
    stream_index: int,
    *,
    hold_s: float,
    should_stop: Callable[[], bool] | None = None,
) -> NudgeTurnReport:
    """Run ``router.nudge(stream_index)`` in the stream's turn, again while nudges merge in.

    ``hold_s`` is how long the turn is held per run at most: the invocation's remaining time,
    so a holder killed mid-run frees it when Lambda would have. A run that is out of time
    (``should_stop``) gives the turn back and leaves a merged nudge to the next one or the
    sweep.
    """
    state = router.stream_state(stream_index)
    holder = uuid.uuid4().hex
    turn = NudgeTurnReport(RunReport(stream_index, "nudge"))

    def now_s() -> float:
        return router.clock.now().timestamp()

    taken = await asyncio.to_thread(state.take_nudge_turn, holder, now_s=now_s(), hold_s=hold_s)
    if not taken:
        turn.merged = True
        return turn
    held = True
    runs: list[RunReport] = []
    try:
        while held:
            # The acks of one run go out while the next runs; release_held sends the last.
            report = await router.nudge(stream_index, should_stop=should_stop, settle=False)
            runs.append(report)
            turn.runs += 1
            if should_stop is not None and should_stop():
                break
            held = await asyncio.to_thread(
                state.next_nudge_turn,
                holder,
                now_s=now_s(),
                hold_s=hold_s,
                left_waiting=report.left_waiting,
            )
    finally:
        if held:
            await asyncio.to_thread(state.give_back_nudge_turn, holder)
        # The records the last run left waiting were kept for a next run here; none follows.
        await router.release_held(stream_index)
    for report in runs:  # counted once every ack was settled: a failed sync recounts its run
        turn.report.absorb(report)
    return turn


def turn_taken_since(router: TurnedRouter, since_s: float) -> bool:
    """Whether any stream's nudge turn was held at or after ``since_s``: the nudge function
    ran. While nudges run, the projector's sweep-only ceilings do not bind (the nudges apply
    the events); when they stop, those ceilings bind again, and the capacity check says so."""
    for index in range(EVENT_STREAM_COUNT):
        ends_s = router.stream_state(index).last_nudge_turn_s()
        if ends_s is not None and ends_s >= since_s:
            return True
    return False
