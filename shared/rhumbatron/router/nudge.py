"""Router nudges: how the publisher tells the router that a stream moved.

:class:`InProcessNudge` is the local invoker: it runs the router for that stream as a
background task and returns at once, so the publisher never waits on the router; nudges for
a stream whose run is still going are coalesced into one more run after it.
:class:`LambdaNudge` is the cloud's: an asynchronous invoke of the router-nudge function with
``{"streamIndex": N}``. Either way a failing nudge is logged and forgotten: the sweep is the
correctness path.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextvars import Context
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rhumbatron.router.ports import NudgedRouter

__all__ = ["InProcessNudge", "LambdaNudge"]

_log = logging.getLogger(__name__)


@dataclass
class InProcessNudge:
    """Runs ``EventRouter.nudge`` in the same process, one run per stream at a time."""

    router: NudgedRouter | None = None
    enabled: bool = True
    runs: int = 0
    _tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    _again: set[int] = field(default_factory=set)

    def bind(self, router: NudgedRouter) -> None:
        self.router = router

    async def nudge(self, stream_index: int) -> None:
        if self.router is None or not self.enabled:
            return
        task = self._tasks.get(stream_index)
        if task is not None and not task.done():
            self._again.add(stream_index)
            return
        # A run of its own, as the router-nudge function's invoke is: not the nudger's
        # correlation ID or span, which would name the router's lines and writes otherwise.
        self._tasks[stream_index] = asyncio.create_task(self._run(stream_index), context=Context())

    async def _run(self, stream_index: int) -> None:
        assert self.router is not None
        while True:
            self._again.discard(stream_index)
            left_waiting = False
            try:
                # The acks of one run go out while the next runs; release_held sends the last.
                report = await self.router.nudge(stream_index, settle=False)
                self.runs += 1
                left_waiting = report.left_waiting
            except Exception:
                # Whatever went wrong, the sweep applies what this nudge missed.
                _log.exception("router nudge for stream %d failed", stream_index)
            # A run that left fetched records waiting (the apply-call cap) runs again at once:
            # its records are kept here, not nacked, and would otherwise wait for a nudge.
            if stream_index not in self._again and not left_waiting:
                break
        try:
            await self.router.release_held(stream_index)
        except Exception:
            _log.exception("cannot release the records kept for stream %d", stream_index)

    async def settle(self) -> None:
        """Wait until no nudge is running (tests and the demo, instead of sleeping)."""
        while pending := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        await self.settle()
        self._tasks.clear()


@dataclass
class LambdaNudge:
    """Invokes the router-nudge function asynchronously (``InvocationType=Event``).

    ``client`` is a boto3 Lambda client. The call is synchronous in boto3, so it runs on a
    worker thread: the publisher's event loop keeps publishing other actors meanwhile.
    Lambda may deliver an async invoke more than once (RELIABILITY F22); the router's claims
    make a repeated nudge apply nothing twice.
    """

    client: Any
    function_name: str
    sent: int = 0
    failed: int = 0

    async def nudge(self, stream_index: int) -> None:
        payload = json.dumps({"streamIndex": stream_index}).encode()
        try:
            await asyncio.to_thread(
                self.client.invoke,
                FunctionName=self.function_name,
                InvocationType="Event",
                Payload=payload,
            )
        except Exception as exc:
            # Whatever went wrong, the sweep reads what a lost nudge missed.
            self.failed += 1
            _log.warning(
                "nudging %s for stream %d failed: %s", self.function_name, stream_index, exc
            )
        else:
            self.sent += 1
