"""The one queue consumer runtime: every queue's consumer is this code plus its table row.

For a queue, :meth:`QueueConsumerRuntime.poll` pulls batches of ``batch_size`` from the durable
consumer ``q-<queue>`` (filtered to ``cmd.<queue>`` only, as work-queue retention demands) and
runs up to ``concurrency`` handlers at once. Every message gets its own outcome:

* the handler returns ``None`` → ack (an open dead letter of the command closes ``succeeded``);
* the handler returns :class:`Retry` or raises → ``nak(delay)`` — the delay the handler set, or
  the table's retry delay for a raise — until the last delivery (1 + retries); then the
  message goes to the queue's dead-letter queue and is terminated (``term``). A queue without
  one (indexing, dead-letter) logs it and terminates it;
* a command past its deadline → ack without running, counted as expired;
* a body that is not a Command → the dead-letter queue at once (it can never succeed).

While a handler runs, the runtime marks the message in progress every 30 s, for up to 15
minutes (F11). ``should_stop`` (the Lambda's remaining time) is asked before each fetch and
before each record starts: a record not started is nacked for prompt redelivery, and a record
is only ever acked after its handler finished (F23).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from rhumbatron.core.clock import Clock
from rhumbatron.core.event_loop import run_together
from rhumbatron.core.faults import crash_point
from rhumbatron.core.log_context import correlated
from rhumbatron.core.settings import Settings
from rhumbatron.errors import ConsumerGoneError, EnvelopeError, RhumbatronError
from rhumbatron.messaging.commands import (
    DELIVERIES_HEADER,
    LAST_ERROR_HEADER,
    ORIGIN_QUEUE_HEADER,
    CommandBus,
    command_span,
)
from rhumbatron.messaging.frames import ack
from rhumbatron.messaging.pull import Puller, ensure_consumer
from rhumbatron.messaging.pull import delivery as delivery_of
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.fast_decode import decode_command
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS, QueueConsumer, consumer_name

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.js.api import ConsumerConfig

__all__ = [
    "CommandHandler",
    "Delivery",
    "PollReport",
    "QueueConsumerRuntime",
    "Retry",
    "UndecodableHandler",
    "queue_consumer_config",
    "queue_row",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Retry:
    """A handler's request: deliver this command again after ``delay_s``."""

    delay_s: float
    reason: str = "the handler asked for a retry"


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a command came from and how often it has been delivered."""

    queue: str
    stream_seq: int
    delivered: int
    max_deliveries: int
    headers: dict[str, str]

    @property
    def is_last(self) -> bool:
        """No retry is left after this delivery."""
        return self.delivered >= self.max_deliveries


class CommandHandler(Protocol):
    async def __call__(self, command: Command, delivery: Delivery) -> Retry | None:
        """Do the work; return None when done, :class:`Retry` to be delivered again, or
        raise (a retry after the table's delay)."""
        ...


class UndecodableHandler(Protocol):
    async def __call__(self, body: bytes, delivery: Delivery, reason: str) -> None:
        """Handle a body that is not a valid Command (the dead-letter consumer records it);
        raising retries it like a failing command."""
        ...


@dataclass
class PollReport:
    """What one poll of a queue did, record by record."""

    queue: str
    fetches: int = 0
    fetched: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    dead_lettered: int = 0
    terminated: int = 0
    expired: int = 0
    left_for_redelivery: int = 0
    out_of_time: bool = False


def queue_row(queue: str, settings: Settings) -> QueueConsumer:
    """The table row of ``queue``, with the retry delay (tests) and the concurrency (sizing)
    the settings override."""
    try:
        row = QUEUE_CONSUMERS[queue]
    except KeyError:
        raise ValueError(
            f"unknown queue {queue!r}; queues are {', '.join(QUEUE_CONSUMERS)}"
        ) from None
    delay = settings.queue_retry_delay_s.get(queue, row.retry_delay_s)
    concurrency = settings.queue_concurrency.get(queue, row.concurrency)
    if (delay, concurrency) == (row.retry_delay_s, row.concurrency):
        return row
    return replace(row, retry_delay_s=delay, concurrency=concurrency)


def queue_consumer_config(queue: str, settings: Settings) -> ConsumerConfig:
    """``q-<queue>``: explicit ack, filtered to its own subject, no server delivery limit
    (the runtime moves a message to the dead-letter queue after its last retry)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    return ConsumerConfig(
        durable_name=consumer_name(queue),
        filter_subject=command_subject(queue),
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=settings.command_ack_wait_s,
        max_deliver=-1,
        max_ack_pending=settings.router_max_ack_pending,
    )


@dataclass
class QueueConsumerRuntime:
    """Runs queue handlers over one NATS connection."""

    nc: NATS
    settings: Settings
    clock: Clock
    bus: CommandBus
    on_success: Callable[[Command], Awaitable[None]] | None = None
    _pullers: dict[str, Puller] = field(default_factory=dict)

    async def _puller(self, queue: str) -> Puller:
        puller = self._pullers.get(queue)
        if puller is None:
            await ensure_consumer(
                self.nc.jetstream(), COMMAND_STREAM, queue_consumer_config(queue, self.settings)
            )
            puller = Puller(
                self.nc,
                COMMAND_STREAM,
                consumer_name(queue),
                self.settings.router_fetch_timeout_s,
                keep_late_s=self.settings.command_ack_wait_s / 2,
            )
            self._pullers[queue] = puller
        return puller

    async def _pull(self, queue: str, batch: int) -> list[Msg]:
        try:
            return await (await self._puller(queue)).pull(batch)
        except ConsumerGoneError:
            await self._pullers.pop(queue).close()
            return await (await self._puller(queue)).pull(batch)

    async def poll(
        self,
        queue: str,
        handler: CommandHandler,
        *,
        should_stop: Callable[[], bool] | None = None,
        max_fetches: int | None = None,
        on_undecodable: UndecodableHandler | None = None,
    ) -> PollReport:
        """Fetch and handle batches of ``queue`` until it is empty, ``max_fetches`` is
        reached, or ``should_stop`` says the time is nearly up. A body that is not a Command
        goes to ``on_undecodable`` when given, else to the dead-letter queue at once."""
        row = queue_row(queue, self.settings)
        report = PollReport(queue)
        stop = should_stop or (lambda: False)
        try:
            while max_fetches is None or report.fetches < max_fetches:
                if stop():
                    report.out_of_time = True
                    break
                messages = await self._pull(queue, row.batch_size)
                report.fetches += 1
                if not messages:
                    break
                report.fetched += len(messages)
                # `concurrency` workers share the batch: at most that many handlers at once,
                # without a task per message.
                waiting = deque(messages)
                # Messages still waiting for a worker are marked in progress too: a slow
                # batch must not outlive their ack wait before their handler even starts.
                marks = self._mark_waiting(waiting)
                try:
                    await run_together(
                        *(
                            self._work(
                                row,
                                waiting,
                                handler,
                                report,
                                stop=stop,
                                raw=on_undecodable,
                                held_too_long=marks.expired,
                            )
                            for _ in range(row.concurrency)
                        )
                    )
                finally:
                    marks.cancel()
                if len(messages) < row.batch_size:
                    break
        finally:
            # Acks leave in the client's next write anyway; one flush makes sure they are
            # on the wire before a Lambda freezes.
            if self.nc.is_connected:
                with contextlib.suppress(Exception):
                    await self.nc.flush()
        return report

    def _mark_waiting(self, waiting: deque[Msg]) -> _Marks:
        """Mark every message still in ``waiting`` in progress every ``command_in_progress_s``
        (from a timer), up to the hold limit."""
        return _Marks(
            waiting, self.settings.command_in_progress_s, self.settings.command_max_hold_s
        )

    async def _work(
        self,
        row: QueueConsumer,
        waiting: deque[Msg],
        handler: CommandHandler,
        report: PollReport,
        *,
        stop: Callable[[], bool],
        raw: UndecodableHandler | None,
        held_too_long: Callable[[], bool],
    ) -> None:
        """One of the ``concurrency`` workers of a batch: handle messages until none wait.

        A message still waiting when the batch reaches the hold limit is not started: its
        marks have stopped, so JetStream gives it to another worker (at once: it is nacked),
        and the batch is held no longer than the limit."""
        while waiting:
            msg = waiting.popleft()
            if held_too_long():
                report.left_for_redelivery += 1
                await msg.nak()
                continue
            await self._one(row, msg, handler, report, stop=stop, raw=raw)

    async def _one(
        self,
        row: QueueConsumer,
        msg: Msg,
        handler: CommandHandler,
        report: PollReport,
        *,
        stop: Callable[[], bool],
        raw: UndecodableHandler | None,
    ) -> None:
        if stop():
            # Not started: back to the queue now, never half-done (F23).
            report.out_of_time = True
            report.left_for_redelivery += 1
            await msg.nak()
            return
        await self._handle(row, msg, handler, report, raw)

    async def _handle(
        self,
        row: QueueConsumer,
        msg: Msg,
        handler: CommandHandler,
        report: PollReport,
        raw: UndecodableHandler | None,
    ) -> None:
        # (stream sequence, times delivered) off the reply subject: a fifth of the cost of
        # nats-py's ``metadata``.
        delivery = Delivery(
            row.queue, *delivery_of(msg), row.max_deliveries, dict(msg.headers or {})
        )
        try:
            command = decode_command(msg.data or b"")
        except EnvelopeError as exc:
            reason = f"not a valid Command: {exc}"
            if raw is None:
                await self._give_up(row, msg, None, reason, delivery, report=report)
                return
            body = msg.data or b""

            async def record_raw() -> None:
                await raw(body, delivery, reason)

            await self._settle(row, msg, None, delivery, report=report, work=record_raw)
            return
        # Each line logged while it is worked on names the command (it has no correlationId).
        with correlated(command.command_id):
            # A dead-lettered command keeps its deadline, but its letter must still be written.
            if not row.holds_dead_letters and command.is_expired(self.clock.now()):
                _log.info("command %s expired at %s: acked", command.command_id, command.deadline)
                report.expired += 1
                await msg.ack()
                return

            async def run_handler() -> Retry | None:
                with command_span(command, delivery.headers):  # its writes and sends carry it
                    return await self._run_holding(msg, handler, command, delivery)

            await self._settle(row, msg, command, delivery, report=report, work=run_handler)

    async def _settle(
        self,
        row: QueueConsumer,
        msg: Msg,
        command: Command | None,
        delivery: Delivery,
        *,
        report: PollReport,
        work: Callable[[], Awaitable[Retry | None]],
    ) -> None:
        """Run the work and settle the message by its result (see the module docstring)."""
        name = command.command_id if command else f"seq {delivery.stream_seq}"
        try:
            result = await work()
        except Exception as exc:
            # A handler's error is this message's outcome, never the whole batch's.
            report.failed += 1
            reason = f"{type(exc).__name__}: {exc}"
            _log.warning(
                "%s failed %s (delivery %d of %d): %s",
                row.queue,
                name,
                delivery.delivered,
                row.max_deliveries,
                reason,
            )
            if delivery.is_last:
                await self._give_up(row, msg, command, reason, delivery, report=report)
            else:
                report.retried += 1
                await msg.nak(delay=row.retry_delay_s)
            return
        if result is None:
            crash_point(self.settings.crash_at, "before_ack")
            await ack(msg)
            report.done += 1
            # On the dead-letter queue, "done" means the letter was written, not that the
            # command succeeded: it must not close the letter it just wrote.
            if self.on_success is not None and command is not None and not row.holds_dead_letters:
                try:
                    await self.on_success(command)
                except Exception as exc:
                    # The message is acked; a failing hook must not fail the rest of the batch.
                    _log.error("after %s succeeded: %s", command.command_id, exc)
            return
        if delivery.is_last:
            await self._give_up(row, msg, command, result.reason, delivery, report=report)
        else:
            report.retried += 1
            await msg.nak(delay=result.delay_s)

    async def _run_holding(
        self, msg: Msg, handler: CommandHandler, command: Command, delivery: Delivery
    ) -> Retry | None:
        """Run the handler, marking the message in progress every ``command_in_progress_s``
        until it returns or the hold limit (15 minutes) is reached."""
        loop = asyncio.get_running_loop()
        every = self.settings.command_in_progress_s
        hold_until = loop.time() + self.settings.command_max_hold_s
        timer: asyncio.TimerHandle | None = None

        def mark() -> None:
            # A timer, not a task per message: most handlers finish long before a mark is
            # due, and then this never runs. A lost mark is only a redelivery.
            nonlocal timer
            mark_sent = asyncio.ensure_future(msg.in_progress())
            mark_sent.add_done_callback(lambda f: f.cancelled() or f.exception())
            timer = loop.call_later(every, mark) if loop.time() + every <= hold_until else None

        if loop.time() + every <= hold_until:
            timer = loop.call_later(every, mark)
        try:
            return await handler(command, delivery)
        finally:
            if timer is not None:
                timer.cancel()

    async def _give_up(
        self,
        row: QueueConsumer,
        msg: Msg,
        command: Command | None,
        reason: str,
        delivery: Delivery,
        *,
        report: PollReport,
    ) -> None:
        """The last delivery failed: to the dead-letter queue, then terminate. A failing
        dead-letter send leaves the message to be tried again (DECISIONS)."""
        if row.dead_letter_queue is None:
            _log.error(
                "%s gives up on %s after %d deliveries: %s",
                row.queue,
                command.command_id if command else f"seq {delivery.stream_seq}",
                delivery.delivered,
                reason,
            )
            await msg.term()
            report.terminated += 1
            return
        headers = {
            ORIGIN_QUEUE_HEADER: row.queue,
            LAST_ERROR_HEADER: " ".join(reason.split())[:1_000],
            DELIVERIES_HEADER: str(delivery.delivered),
        }
        try:
            if command is not None:
                await self.bus.send(row.dead_letter_queue, command, headers=headers)
            else:
                await self.bus.send_raw(
                    row.dead_letter_queue,
                    msg.data or b"",
                    message_id=f"{row.dead_letter_queue}:{row.queue}:seq:{delivery.stream_seq}",
                    headers=headers,
                )
        except RhumbatronError as exc:
            _log.error("cannot dead-letter %s: %s; it will be tried again", reason, exc)
            await msg.nak(delay=row.retry_delay_s)
            report.retried += 1
            return
        crash_point(self.settings.crash_at, "after_dead_letter")
        await msg.term()
        report.dead_lettered += 1

    async def close(self) -> None:
        for puller in self._pullers.values():
            await puller.close()
        self._pullers.clear()


class _Marks:
    """A timer chain marking the waiting messages of a batch in progress."""

    def __init__(self, waiting: deque[Msg], every_s: float, hold_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._waiting = waiting
        self._every = every_s
        self._until = self._loop.time() + hold_s
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(every_s, self._mark)

    def _mark(self) -> None:
        for msg in list(self._waiting):
            sent = asyncio.ensure_future(msg.in_progress())
            sent.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._timer = (
            self._loop.call_later(self._every, self._mark)
            if self._loop.time() + self._every <= self._until
            else None
        )

    def expired(self) -> bool:
        """The hold limit is reached: the waiting messages are marked no more."""
        return self._loop.time() >= self._until

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
