"""The in-process router nudge: the local invoker for the router-nudge role.

The publisher calls :meth:`InProcessNudge.nudge` after a publish that sent rows. The nudge
runs the router for that stream as a background task and returns at once, so the publisher
never waits on the router. Nudges for a stream whose run is still going are coalesced into
one more run after it. A failing nudge is logged and forgotten: the sweep is the
correctness path.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rhumbatron.router.event_router import EventRouter

__all__ = ["InProcessNudge"]

_log = logging.getLogger(__name__)


@dataclass
class InProcessNudge:
    """Runs ``EventRouter.nudge`` in the same process, one run per stream at a time."""

    router: EventRouter | None = None
    enabled: bool = True
    runs: int = 0
    _tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    _again: set[int] = field(default_factory=set)

    def bind(self, router: EventRouter) -> None:
        self.router = router

    async def nudge(self, stream_index: int) -> None:
        if self.router is None or not self.enabled:
            return
        task = self._tasks.get(stream_index)
        if task is not None and not task.done():
            self._again.add(stream_index)
            return
        self._tasks[stream_index] = asyncio.create_task(self._run(stream_index))

    async def _run(self, stream_index: int) -> None:
        assert self.router is not None
        while True:
            self._again.discard(stream_index)
            try:
                await self.router.nudge(stream_index)
                self.runs += 1
            except Exception:
                _log.exception("router nudge for stream %d failed", stream_index)
            if stream_index not in self._again:
                return

    async def settle(self) -> None:
        """Wait until no nudge is running (tests and the demo, instead of sleeping)."""
        while pending := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        await self.settle()
        self._tasks.clear()
