"""Group commit for a view store's WAL: one sync in flight at a time, covering every commit
made before it started.

The projector commits a fetch on the event loop without a sync (``synchronous=NORMAL``) and
acks its records only once a sync of the WAL that began after that commit has ended
(``view_store``). Waiting for that sync inside the run made every run wait for the disk
(about 1.4 ms a fetch on this project's bench box, a quarter of a 50-project run). With
:class:`GroupSync` a run asks for its commit's durability and goes on: the next run fetches,
decodes and commits while the sync runs on a worker thread, and the acks go out when it ends
(``EventRouter.settle_acks``). A commit made while a sync is running is covered by the next
one, which starts as soon as the running one ends, so however many runs commit meanwhile,
the disk sees one sync at a time. :class:`CommittedFetch` is what the projector's commit of a
fetch hands back: the records' outcomes, and the commit whose sync their acks wait for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.router.records import Outcome, RecordOutcome

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["CommittedFetch", "GroupSync"]


class GroupSync:
    """Counts the commits of one store and makes them durable by its ``sync``.

    ``sync`` runs on a worker thread and raises :class:`OSError` when the disk fails it;
    every waiter it would have covered gets that error (their commits may be lost).
    """

    def __init__(self, sync: Callable[[], None]) -> None:
        self._sync = sync
        #: Commits made so far (:meth:`committed`).
        self._commits = 0
        #: The commits the last sync that ended well covers (all of the first N).
        self._durable = 0
        self._running: asyncio.Future[None] | None = None

    def committed(self) -> int:
        """Count a commit just made; returns its number, for :meth:`durable`."""
        self._commits += 1
        return self._commits

    @property
    def pending(self) -> int:
        """Commits not yet covered by a sync that ended well."""
        return self._commits - self._durable

    async def durable(self, commit: int) -> None:
        """Return once commit number ``commit`` is durable: a sync that started after it
        was made has ended well. Joins the sync in flight when that one covers it, else
        waits for it and starts the next."""
        while self._durable < commit:
            running = self._running
            if running is None:
                running = self._running = asyncio.ensure_future(self._sync_now())
            # Shielded: a waiter cancelled (its run's task) must not cancel the others' sync.
            await asyncio.shield(running)

    async def _sync_now(self) -> None:
        covers = self._commits  # made before the sync starts: on this thread, no race
        try:
            await asyncio.to_thread(self._sync)
            self._durable = max(self._durable, covers)
        finally:
            self._running = None


_ACKED = frozenset({Outcome.APPLIED, Outcome.DUPLICATE})


@dataclass(frozen=True, slots=True)
class CommittedFetch:
    """A fetch the projector committed: each record's outcome as committed, and — in WAL —
    the commit whose sync must end before any record of it is acked."""

    outcomes: dict[str, RecordOutcome]
    path: Path | None = None
    syncs: GroupSync | None = None
    commit: int = 0

    @property
    def durable_already(self) -> bool:
        """Nothing to wait for: no commit, or one that synced itself (not WAL)."""
        return self.syncs is None

    async def durable(self) -> None:
        """Return once the commit is durable; raises :class:`OSError` when the disk fails
        the sync (the commit may be lost)."""
        if self.syncs is not None:
            await self.syncs.durable(self.commit)

    def unsynced(self, exc: OSError) -> RecordOutcome:
        """The outcome of a record this commit applied (or found claimed) when the commit
        cannot be made durable: a retry, whose redelivery finds it claimed, or applies it
        again if the commit was lost."""
        return RecordOutcome.retry(f"cannot make the views of {self.path} durable: {exc}")

    async def outcomes_once_durable(self) -> dict[str, RecordOutcome]:
        """:attr:`outcomes` once the commit is durable; when it cannot be made so, the
        records applied are retried instead of acked."""
        try:
            await self.durable()
        except OSError as exc:
            retry = self.unsynced(exc)
            return {
                key: retry if outcome.outcome in _ACKED else outcome
                for key, outcome in self.outcomes.items()
            }
        return self.outcomes
