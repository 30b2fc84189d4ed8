"""The router nudge: after a publish that sent rows, tell the event router which stream moved.

The nudge only cuts latency; the every-minute sweep is the correctness path. The router
implements :class:`RouterNudge` (in-process locally, an async Lambda invoke in the cloud).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["NoNudge", "RecordingNudge", "RouterNudge"]


class RouterNudge(Protocol):
    async def nudge(self, stream_index: int) -> None:
        """Ask the router to read stream ``stream_index`` soon."""
        ...


class NoNudge:
    """Nudges nobody: the sweep alone applies every event."""

    async def nudge(self, stream_index: int) -> None:
        return None


@dataclass
class RecordingNudge:
    """Remembers every nudge in order."""

    nudged: list[int] = field(default_factory=list)

    async def nudge(self, stream_index: int) -> None:
        self.nudged.append(stream_index)
