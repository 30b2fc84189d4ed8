"""CPU pinning and SQLite commit counts for the latency runs' processes.

The pinned latency run (issue #16) places each role of the pipeline in a process of its own,
pinned to its CPUs, as the cloud gives each Lambda function its own: ``pin_process`` applies
an affinity to every thread of a process (``sched_setaffinity`` of one PID sets one thread on
Linux, and nats-server's Go runtime runs many). ``CommitCounter`` counts a process's durable
SQLite commits by role through the package's own hook
(:func:`~rhumbatron.actors.storage.observe_commits`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rhumbatron.actors.storage import observe_commits

__all__ = ["CommitCounter", "PinnedLayout", "pin_process", "pinned_layout"]


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Run every thread of process ``pid`` on ``cpus`` only; threads it starts later inherit
    the mask of the thread that starts them. A thread that ends meanwhile is skipped."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:
            continue


@dataclass(frozen=True, slots=True)
class PinnedLayout:
    """Which CPUs each role of the pinned latency run may use."""

    writer: frozenset[int]
    publisher: frozenset[int]
    router: frozenset[int]
    nats_server: frozenset[int]

    def describe(self) -> str:
        def cpus(of: frozenset[int]) -> str:
            return ",".join(str(c) for c in sorted(of))

        return (
            f"writer (actors) on CPU {cpus(self.writer)}, publisher on CPU "
            f"{cpus(self.publisher)}, router on CPU {cpus(self.router)}, nats-server on CPU "
            f"{cpus(self.nats_server)}"
        )


def pinned_layout(available: frozenset[int] | None = None) -> PinnedLayout | None:
    """The roles split over the first two CPUs this process may use: the actors' writer and
    the publisher (the write side) on one, the router and nats-server (the read side) on the
    other. The two halves cost about the same CPU per event, so neither core saturates first.
    None with fewer than two CPUs: nothing to pin apart."""
    cpus = sorted(available if available is not None else os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    write_side, read_side = frozenset({cpus[0]}), frozenset({cpus[1]})
    return PinnedLayout(
        writer=write_side, publisher=write_side, router=read_side, nats_server=read_side
    )


class CommitCounter:
    """This process's durable SQLite commits while started, by the role ``role_of`` names
    for the committed file."""

    def __init__(self, role_of: Callable[[Path], str] | None = None) -> None:
        self._role_of = role_of or (lambda _path: "all")
        self.counts: Counter[str] = Counter()
        self._stop: Callable[[], None] | None = None

    def start(self) -> None:
        self.counts.clear()
        if self._stop is None:
            self._stop = observe_commits(self._on_commit)

    def _on_commit(self, path: Path) -> None:
        self.counts[self._role_of(path)] += 1

    def stop(self) -> dict[str, int]:
        """Stop counting; the counts so far."""
        if self._stop is not None:
            self._stop()
            self._stop = None
        return dict(self.counts)
