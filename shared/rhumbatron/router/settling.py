"""What the router keeps between the fetches and runs of a stream, and a failure's count.

* :class:`HeldRecords` — the records a run left waiting (the 15-call cap), kept by this
  process for the stream's next run: their messages stay delivered and unacknowledged in the
  consumer's puller, which hands them out first; the next run takes each record as it was,
  not decoded again. Nothing is fetched, sent or parsed twice (DECISIONS, "The 15-call cap").
* :func:`prefetch_next` — while the projector commits a full fetch, it asks already for the
  records the stream's next fetch will take, so they arrive during the commit.
* :func:`settle_records` — each fetched record's outcome carried out: ack, hold, nack after
  the delay, or a failure.
* :class:`DurableAcks` — the projector's acks of a commit not yet synced, sent once its sync
  (shared by the commits made meanwhile, ``group_sync``) has ended, while the stream's next
  run goes on.
* :func:`settle_failure` — a record's failure counted per ``(consumer, event key)`` and
  nacked after the delay; the 5th makes it a ``poison_event`` dead letter, marks it
  processed and acks it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rhumbatron.core.faults import crash_point
from rhumbatron.core.log_context import correlated
from rhumbatron.errors import RhumbatronError
from rhumbatron.messaging.event_log import EventLogClient, Subscription
from rhumbatron.messaging.frames import ack
from rhumbatron.protocol.ids import event_stream_name
from rhumbatron.router.records import Outcome, Record, RecordOutcome

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from rhumbatron.core.settings import Settings
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.router.group_sync import CommittedFetch
    from rhumbatron.router.handlers import ProjectViewProjector, RecordHandler, RunContext
    from rhumbatron.router.reports import SubscriptionReport
    from rhumbatron.router.stream_state import StreamState

__all__ = [
    "DurableAcks",
    "HeldRecords",
    "handle_fetch",
    "prefetch_next",
    "release_stream",
    "settle_failure",
    "settle_records",
]

_log = logging.getLogger(__name__)

_PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR.value


@dataclass
class HeldRecords:
    """The records this process keeps for each stream's next run, by message identity.

    A held message is kept by its puller (``Puller.hold``) until a pull hands it out again or
    it has been kept too long; a record whose message the puller dropped unseen stays here
    until the stream's records are forgotten, or the limit clears them (a record is only ever
    taken back for its own message, so a stale one is never used)."""

    limit: int = 10_000
    _by_stream: dict[int, dict[int, Record]] = field(default_factory=dict)

    def take(
        self, stream: int, messages: list[Msg], decode: Callable[[list[Msg]], list[Record]]
    ) -> list[Record]:
        """The records of ``messages``: a held one as it was, every other by ``decode``."""
        held = self._by_stream.get(stream)
        if not held:
            return decode(messages)
        records: list[Record | None] = []
        missing: list[Msg] = []
        for msg in messages:
            record = held.pop(id(msg), None)
            if record is None or record.msg is not msg:
                record = None
                missing.append(msg)
            records.append(record)
        decoded = iter(decode(missing))
        return [record if record is not None else next(decoded) for record in records]

    def keep(
        self,
        log: EventLogClient,
        run: RunContext,
        subscription: Subscription,
        records: list[Record],
    ) -> None:
        """Keep ``records`` (deferred, unsettled) for the stream's next run."""
        log.hold(run.stream_index, subscription, [record.msg for record in records])
        held = self._by_stream.setdefault(run.stream_index, {})
        if len(held) > self.limit:
            held.clear()  # records the puller dropped unseen: decoded again if they come
        held.update((id(record.msg), record) for record in records)

    def forget(self, stream: int) -> None:
        """The stream's held messages were released (nacked): drop their records."""
        self._by_stream.pop(stream, None)


@dataclass
class DurableAcks:
    """The projector's acks that wait for the sync of their commit, by stream.

    A run hands them over (:meth:`after_sync`) and ends; they go out when the sync ends, on
    a task of their own. Whoever ends the stream's runs waits for them (:meth:`settle`), as
    it nacks what is held. A sync the disk fails turns them into retries: nacked after the
    delay, counted as retried in their run's report, and redelivered, when they find their
    claim (or apply again if the commit was lost)."""

    _pending: dict[int, set[asyncio.Task[None]]] = field(default_factory=dict)

    def after_sync(
        self,
        stream: int,
        committed: CommittedFetch,
        acks: list[tuple[Msg, Outcome]],
        report: SubscriptionReport,
        nak_delay_s: float,
    ) -> None:
        """Ack ``acks`` once ``committed`` is durable, without waiting here; when it cannot
        be made so, nack them after ``nak_delay_s``."""
        tasks = self._pending.setdefault(stream, set())
        task = asyncio.create_task(self._ack_once_durable(committed, acks, report, nak_delay_s))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def settle(self, stream: int) -> int:
        """Wait until every batch of ``stream`` handed over so far is acked (or nacked);
        returns how many batches there were."""
        tasks = list(self._pending.get(stream, ()))
        if tasks:
            await asyncio.gather(*tasks)
        return len(tasks)

    async def _ack_once_durable(
        self,
        committed: CommittedFetch,
        acks: list[tuple[Msg, Outcome]],
        report: SubscriptionReport,
        nak_delay_s: float,
    ) -> None:
        try:
            try:
                await committed.durable()
            except OSError as exc:
                retry = committed.unsynced(exc)
                _log.warning("%s retries %d records: %s", _PROJECTOR, len(acks), retry.reason)
                for msg, outcome in acks:
                    report.recount(outcome, Outcome.RETRY)
                    await msg.nak(delay=nak_delay_s)
                return
            for msg, _ in acks:
                await ack(msg)
        except Exception as exc:  # a task of its own: nobody else would hear of it
            # Unacked, the records are redelivered after the ack wait and found claimed.
            _log.warning("cannot settle %d records of %s: %s", len(acks), _PROJECTOR, exc)


async def release_stream(
    log: EventLogClient,
    stream: int,
    locks: Mapping[tuple[int, Subscription], asyncio.Lock],
    durable_acks: DurableAcks,
) -> int:
    """Send the projector's acks of ``stream`` that wait for a sync, then nack, without delay,
    every record kept for a next run of each of its subscriptions, and flush; returns how
    many were nacked. Each subscription's consume in flight settles (and may hold) first."""
    sent = released = 0
    for subscription in Subscription:
        lock = locks.get((stream, subscription))
        if lock is None:
            continue  # never consumed here: nothing kept
        async with lock:
            if subscription is Subscription.PROJECT_VIEW_PROJECTOR:
                sent += await durable_acks.settle(stream)
            messages = await log.release_held(stream, subscription)
            released += len(messages)
            if messages and log.nc.is_connected:
                for msg in messages:
                    await msg.nak()
                sent += len(messages)
    if sent and log.nc.is_connected:
        await log.nc.flush()
    return released


async def handle_fetch(
    handler: RecordHandler,
    records: list[Record],
    run: RunContext,
    *,
    pipelined: ProjectViewProjector | None,
) -> tuple[dict[str, RecordOutcome], CommittedFetch | None]:
    """The outcome of each of a fetch's decoded ``records`` by ``handler``. When the handler
    is ``pipelined`` (the projector, in a run whose acks may wait), the outcomes are as
    committed, with the commit whose sync their acks must wait for (None: they need not)."""
    if not records:
        return {}, None
    try:
        if handler is pipelined:
            committed = await pipelined.commit(records, run)
            return committed.outcomes, None if committed.durable_already else committed
        return await handler.handle(records, run), None
    except (RhumbatronError, sqlite3.Error) as exc:
        # A busy or full file under the handler: nothing of the batch is the events' fault,
        # so nothing is counted; the claims rolled back with the transaction.
        retry = RecordOutcome.retry(f"{type(exc).__name__}: {exc}")
        return {r.key: retry for r in records}, None


async def prefetch_next(
    log: EventLogClient,
    projector: ProjectViewProjector,
    run: RunContext,
    records: list[Record],
    batch: int,
    *,
    more: bool,
) -> None:
    """Before the projector applies a full fetch: ask for the records the next fetch of the
    stream will take, so they arrive while the fetch's commit runs — this run's next fetch
    when its calls last (``more``: it may fetch again), else the next run's when this fetch
    leaves records waiting (the next run takes those first, then these)."""
    calls_left, deferring = projector.budget_after([r for r in records if r.event], run)
    if deferring:
        await log.prefetch(run.stream_index, Subscription.PROJECT_VIEW_PROJECTOR, batch - deferring)
    elif more and calls_left > 0:
        await log.prefetch(run.stream_index, Subscription.PROJECT_VIEW_PROJECTOR, batch)


async def settle_records(
    settings: Settings,
    subscription: Subscription,
    records: Sequence[Record],
    outcomes: dict[str, RecordOutcome],
    report: SubscriptionReport,
    *,
    fail: Callable[[Record, RecordOutcome], Awaitable[bool]],
    acks: list[tuple[Msg, Outcome]] | None = None,
) -> list[Record]:
    """Carry out each record's outcome (``outcomes`` by record key; a record that could not
    be decoded or whose project could not be read carries its own): ack, nack after the
    delay, or ``fail`` (:func:`settle_failure`); returns the deferred ones, to hold. A record
    whose settling logs a line binds its event's ``correlationId`` to it. With ``acks``, a
    record to ack is added there (with its outcome) instead: the caller acks it later."""
    deferred: list[Record] = []
    for record in records:
        outcome = outcomes.get(record.key)
        if record.error is not None:
            outcome = RecordOutcome.failed(record.error)
        elif record.retry is not None:
            outcome = RecordOutcome.retry(record.retry)
        assert outcome is not None, f"{subscription} gave no outcome for {record.key}"
        report.count(outcome.outcome)
        crash_point(settings.crash_at, "before_ack")
        match outcome.outcome:
            case Outcome.APPLIED | Outcome.DUPLICATE:
                if acks is None:
                    await ack(record.msg)
                else:
                    acks.append((record.msg, outcome.outcome))
            case Outcome.DEFERRED:
                deferred.append(record)
            case Outcome.RETRY:
                with correlated(_correlation_id(record)):
                    _log.warning("%s retries %s: %s", subscription, record.key, outcome.reason)
                await record.msg.nak(delay=settings.router_nak_delay_s)
            case Outcome.FAILED:
                with correlated(_correlation_id(record)):
                    report.dead_lettered += await fail(record, outcome)
    return deferred


def _correlation_id(record: Record) -> str | None:
    return None if record.event is None else record.event.correlation_id


async def settle_failure(
    settings: Settings,
    *,
    state: StreamState,
    product: ProductDatabase,
    run: RunContext,
    subscription: Subscription,
    handler: RecordHandler,
    record: Record,
    outcome: RecordOutcome,
) -> bool:
    """Settle a failed record: count the failure and nack the record after the delay; on
    the 5th failure it becomes a dead letter and is acked. Returns whether it did. A count
    that cannot be written is logged and the record nacked: it is counted next time, never
    acked uncounted."""
    try:
        failures = state.count_failure(
            subscription.value, record.key, outcome.reason, now_s=run.now_s
        )
        _log.warning(
            "%s failed %s (%d/%d): %s",
            subscription,
            record.key,
            failures,
            settings.router_max_failures,
            outcome.reason,
        )
        dead = failures >= settings.router_max_failures
        if dead:
            _dead_letter(
                product,
                run=run,
                subscription=subscription,
                handler=handler,
                record=record,
                outcome=outcome,
            )
    except (RhumbatronError, sqlite3.Error) as exc:
        _log.error("cannot count the failure of %s: %s", record.key, exc)
        dead = False
    if dead:
        await record.msg.ack()
    else:
        await record.msg.nak(delay=settings.router_nak_delay_s)
    return dead


def _dead_letter(
    product: ProductDatabase,
    *,
    run: RunContext,
    subscription: Subscription,
    handler: RecordHandler,
    record: Record,
    outcome: RecordOutcome,
) -> None:
    """The 5th failure: write the ``poison_event`` dead letter and mark the record
    processed, so a redelivery skips it."""
    from rhumbatron.product.dead_letters import record_poison_event

    event = record.event
    with product.transaction() as db:
        record_poison_event(
            db,
            consumer=subscription.value,
            event_key=record.key,
            stream=event_stream_name(run.stream_index),
            stream_seq=record.stream_seq,
            reason=outcome.reason,
            body=record.body,
            now_s=run.now_s,
            tenant_id=event.tenant_id if event else None,
            project_id=event.project_id if event else None,
            change_id=event.change_id if event else None,
            task_id=event.task_id if event else None,
        )
    if event is not None:
        handler.mark_processed([record], run)
