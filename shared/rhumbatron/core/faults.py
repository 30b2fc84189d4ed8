"""Named crash points for fault tests (RELIABILITY.md).

A worker started with ``RHUMBATRON_CRASH_AT=<point>`` kills itself, without cleanup, the first
time it reaches that point: the closest thing to a power cut a test can make on one machine.
"""

from __future__ import annotations

import os

__all__ = ["CRASH_POINTS", "crash_point"]

#: Every point a fault test may name.
CRASH_POINTS = frozenset(
    {"in_txn", "after_puback", "after_claim", "after_apply", "before_ack", "after_dead_letter"}
)


def crash_point(configured: str | None, name: str) -> None:
    """Exit the process at once with status 137 if ``configured`` names this point."""
    if name not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {sorted(CRASH_POINTS)}")
    if configured == name:
        os._exit(137)  # no finally blocks, no atexit, no flush: a crash
