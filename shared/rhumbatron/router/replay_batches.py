"""One batch of a replay: hand its records to the subscription's handler, or, in a dry run,
read their claims without taking them (see :mod:`rhumbatron.router.replay`).

Both replays (the stream rewind and the archive replay) feed their batches here, and count
what happened on their report (:class:`~rhumbatron.router.replay.ReplayReport`, which this
module sees as a :class:`ReplayTally`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Protocol

from rhumbatron.errors import RhumbatronError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.router.event_router import EventRouter
from rhumbatron.router.handlers import RunContext
from rhumbatron.router.records import Outcome, Record
from rhumbatron.router.view_store import view_store_path

__all__ = ["ReplayTally", "replay_batch"]

#: SQLite's default limit of bound parameters is 999 (older builds): stay under it.
_IDS_PER_QUERY = 500


class ReplayTally(Protocol):
    """What a batch counts on a replay's report (a
    :class:`~rhumbatron.router.replay.ReplayReport`)."""

    dry_run: bool
    scanned: int
    applied: int
    would_apply: int
    already_applied: int
    in_flight: int

    def _failed(self, key: str, reason: str) -> None: ...

    def _retried(self, key: str, reason: str) -> None: ...


# -- one batch ---------------------------------------------------------------------------------


async def replay_batch(
    router: EventRouter,
    stream_index: int,
    subscription: Subscription,
    records: Sequence[Record],
    report: ReplayTally,
) -> None:
    """Tally the records that cannot be applied (failed, to retry, a second copy), then
    apply the others, or, in a dry run, classify them by their claims."""
    report.scanned += len(records)
    batch: list[Record] = []
    seen: set[str] = set()
    for record in records:
        if record.error is not None:
            report._failed(record.key, record.error)
        elif record.retry is not None:
            report._retried(record.key, record.retry)
        elif record.key in seen:
            # The same event stored twice (published again under another message ID):
            # the first copy stands for both, the second is its duplicate.
            report.already_applied += 1
        else:
            seen.add(record.key)
            batch.append(record)
    if not batch:
        return
    if report.dry_run:
        _classify(router, stream_index, subscription, batch, report)
    else:
        await _apply(router, stream_index, subscription, batch, report)


async def _apply(
    router: EventRouter,
    stream_index: int,
    subscription: Subscription,
    records: list[Record],
    report: ReplayTally,
) -> None:
    """Hand ``records`` to the subscription's handler, as the live router does with a fetch;
    the projector's apply-call budget defers projects, which go again with a fresh budget."""
    handler = router.handler(stream_index, subscription)
    pending = records
    while pending:
        run = RunContext(
            stream_index=stream_index,
            now_s=router.clock.now().timestamp(),
            apply_calls_left=router.settings.router_apply_calls_per_run,
        )
        try:
            outcomes = await handler.handle(pending, run)
        except (RhumbatronError, sqlite3.Error) as exc:
            # A busy or full file: nothing of the batch committed (see the live router).
            for record in pending:
                report._retried(record.key, f"{type(exc).__name__}: {exc}")
            return
        deferred: list[Record] = []
        for record in pending:
            outcome = outcomes[record.key]
            match outcome.outcome:
                case Outcome.APPLIED:
                    report.applied += 1
                case Outcome.DUPLICATE:
                    report.already_applied += 1
                case Outcome.DEFERRED:
                    deferred.append(record)
                case Outcome.RETRY:
                    report._retried(record.key, outcome.reason)
                case Outcome.FAILED:
                    report._failed(record.key, outcome.reason)
        if len(deferred) == len(pending):  # no progress: never loop on it
            for record in deferred:
                report._retried(record.key, "deferred by the apply-call budget")
            return
        pending = deferred


# -- dry run: reading claims without taking them -----------------------------------------------


def _classify(
    router: EventRouter,
    stream_index: int,
    subscription: Subscription,
    records: list[Record],
    report: ReplayTally,
) -> None:
    now_s = router.clock.now().timestamp()
    name = subscription.value
    states: dict[str, tuple[str, float | None]] = {}
    # The view store's claims are its feed rows (and dead letters' marks).
    projector = subscription is Subscription.PROJECT_VIEW_PROJECTOR
    if projector and view_store_path(router.settings, stream_index).exists():
        states = router.projector.views(stream_index).claim_states([r.key for r in records])
    for connection, ids in _claim_stores(router, stream_index, subscription, records):
        states.update(_claim_states(connection, name, ids))
    for record in records:
        state = states.get(record.key)
        if state is None:
            report.would_apply += 1
        elif state[0] == "done":
            report.already_applied += 1
        elif state[1] is not None and state[1] <= now_s:
            report.would_apply += 1  # an expired lease: the next claim takes it over
        else:
            report.in_flight += 1


def _claim_stores(
    router: EventRouter,
    stream_index: int,
    subscription: Subscription,
    records: list[Record],
) -> Iterator[tuple[sqlite3.Connection, list[str]]]:
    """Where ``subscription`` keeps the claims of ``records``, with the IDs each holds; a
    file that does not exist holds no claim and is not created."""
    ids = [r.key for r in records]
    match subscription:
        case Subscription.CAUSAL_ROUTER | Subscription.AUDIT_ARCHIVER:
            state = router.stream_state(stream_index)
            if state.path.exists():
                yield state.connection, ids
        case Subscription.ANALYTICS_PROJECTOR | Subscription.REACTIONS:
            if router.product.path.exists():
                yield router.product.connection, ids


def _claim_states(
    connection: sqlite3.Connection, consumer: str, event_ids: Sequence[str]
) -> dict[str, tuple[str, float | None]]:
    """``event_id -> (status, lease_until_s)`` of the claims ``consumer`` holds (a read)."""
    states: dict[str, tuple[str, float | None]] = {}
    for offset in range(0, len(event_ids), _IDS_PER_QUERY):
        chunk = event_ids[offset : offset + _IDS_PER_QUERY]
        marks = ", ".join("?" * len(chunk))
        rows = connection.execute(
            "SELECT event_id, status, lease_until_s FROM processed_events "
            f"WHERE consumer = ? AND event_id IN ({marks})",
            [consumer, *chunk],
        )
        for row in rows:
            states[str(row[0])] = (str(row[1]), None if row[2] is None else float(row[2]))
    return states
