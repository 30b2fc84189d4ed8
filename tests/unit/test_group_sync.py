"""Group commit of a view store's WAL (``rhumbatron.router.group_sync``): a commit is durable
only after a sync that started after it, and commits made while a sync runs share the next."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rhumbatron.router.group_sync import GroupSync


class GatedSyncs:
    """A disk whose syncs each wait for the test to let them end, one gate per sync."""

    def __init__(self, *, failing: int = 0) -> None:
        self.started: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.gates: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.count = 0
        self.failing = failing  # how many syncs, from the first, the disk fails

    def sync(self) -> None:
        number = self.count
        self.count += 1
        self.started[number].set()
        assert self.gates[number].wait(10), "the test never let the sync end"
        if number < self.failing:
            raise OSError(5, "Input/output error")

    async def wait_started(self, number: int) -> None:
        assert await asyncio.to_thread(self.started[number].wait, 10), f"sync {number} never ran"


async def test_commits_made_while_a_sync_runs_wait_for_the_next_sync_and_share_it() -> None:
    # GIVEN a commit whose sync is running
    disk = GatedSyncs()
    group = GroupSync(disk.sync)
    first = asyncio.create_task(group.durable(group.committed()))
    await disk.wait_started(0)
    # WHEN three more commits are made meanwhile, and the running sync ends
    later = [asyncio.create_task(group.durable(group.committed())) for _ in range(3)]
    disk.gates[0].set()
    await first
    # THEN the first commit is durable, the later three are not: their data may have missed
    #   the sync that was already running
    assert not any(task.done() for task in later)
    assert group.pending == 3
    # AND one more sync makes all three durable
    await disk.wait_started(1)
    disk.gates[1].set()
    await asyncio.gather(*later)
    assert (disk.count, group.pending) == (2, 0)


async def test_a_durable_commit_costs_no_more_sync() -> None:
    # GIVEN a commit made durable
    disk = GatedSyncs()
    for gate in disk.gates:
        gate.set()
    group = GroupSync(disk.sync)
    commit = group.committed()
    await group.durable(commit)
    # WHEN its durability is asked again (a second batch of the same commit)
    await group.durable(commit)
    # THEN no sync ran for it
    assert disk.count == 1


async def test_a_failed_sync_fails_its_commits_and_the_next_sync_covers_them() -> None:
    # GIVEN two commits whose one sync the disk fails
    disk = GatedSyncs(failing=1)
    for gate in disk.gates:
        gate.set()
    group = GroupSync(disk.sync)
    commits = [group.committed(), group.committed()]
    # WHEN their durability is asked
    results = await asyncio.gather(*(group.durable(c) for c in commits), return_exceptions=True)
    # THEN both are told of the failure (their commits may be lost), none is durable
    assert [type(r) for r in results] == [OSError, OSError]
    assert group.pending == 2
    # AND a later commit's sync, which the disk takes, covers them too
    await group.durable(group.committed())
    assert (disk.count, group.pending) == (2, 0)


async def test_a_waiter_cancelled_does_not_cancel_the_sync_the_others_wait_for() -> None:
    # GIVEN two runs waiting for the same running sync
    disk = GatedSyncs()
    group = GroupSync(disk.sync)
    commit = group.committed()
    cancelled = asyncio.create_task(group.durable(commit))
    other = asyncio.create_task(group.durable(commit))
    await disk.wait_started(0)
    # WHEN one of them is cancelled (its run's task ends)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    # THEN the sync goes on, and the other is told when it ends
    disk.gates[0].set()
    await asyncio.wait_for(other, 10)
    assert (disk.count, group.pending) == (1, 0)
