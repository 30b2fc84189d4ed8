"""Durable JetStream pull consumers: explicit create-or-update, and a pull that never lingers.

Two nats.py behaviours make its helpers a poor fit for a bounded Lambda run:

* ``pull_subscribe`` does not update an existing consumer whose config changed, so a new
  ack wait in the settings would silently not apply. :func:`ensure_consumer` compares the
  fields we own and updates the consumer when one differs.
* ``fetch`` on an empty consumer waits for its whole timeout and then raises a timeout. A
  sweep visits four subscriptions; an idle stream must cost a round trip, not seconds.
  :class:`Puller` asks with ``no_wait``: the server sends what it has and then a
  "404 No Messages" status, so an empty pull is an empty list, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from rhumbatron.errors import ConsumerGoneError, MessagingError, NatsUnavailableError

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription
    from nats.js.api import ConsumerConfig
    from nats.js.client import JetStreamContext

__all__ = ["ConsumerChange", "Puller", "delivery", "ensure_consumer"]

#: Fields of a consumer we set and keep in line with the settings.
_MANAGED = ("ack_wait", "max_ack_pending", "max_deliver", "filter_subject", "ack_policy")
#: Statuses that end a no-wait pull without an error.
_END_OF_PULL = frozenset({"404", "408"})


class ConsumerChange(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


def _normalised(config: ConsumerConfig, name: str) -> Any:
    value = getattr(config, name)
    if name == "ack_wait":
        return round(float(value or 30.0), 3)
    if name == "max_deliver":
        return -1 if value in (None, 0) else value
    if name == "filter_subject":
        return value or None
    return getattr(value, "value", value)


async def ensure_consumer(
    js: JetStreamContext, stream: str, config: ConsumerConfig
) -> ConsumerChange:
    """Create the durable consumer ``config.durable_name`` on ``stream``, or update it.

    JetStream refuses some changes (the ack policy, the deliver policy); the refusal is
    raised as :class:`MessagingError` naming the consumer and what to do.
    """
    from nats.js.errors import APIError, NotFoundError

    name = config.durable_name
    assert name is not None
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:
        change = ConsumerChange.CREATED
    else:
        differs = [f for f in _MANAGED if _normalised(info.config, f) != _normalised(config, f)]
        if not differs:
            return ConsumerChange.UNCHANGED
        change = ConsumerChange.UPDATED
    try:
        # CONSUMER.CREATE with an existing durable name updates it (nats-server >= 2.9).
        await js.add_consumer(stream, config.evolve(name=name))
    except APIError as exc:
        raise MessagingError(
            f"JetStream refused to {change.value.removesuffix('d')} consumer {name} on "
            f"{stream}: {exc.description} (code {exc.err_code}); if its ack or deliver "
            "policy changed, delete the consumer (it is recreated at its next read)"
        ) from exc
    return change


@dataclass
class Puller:
    """Pulls batches from one durable consumer with ``no_wait``.

    One private inbox subscription per consumer, reused across pulls (a warm Lambda keeps
    it). Messages are collected by the subscription's callback and the pull waits once for
    the whole batch: awaiting each message separately costs a task per message, a quarter
    of the router's client CPU. ``timeout_s`` only bounds a pull whose end-of-batch status
    got lost.

    Each pull asks with a reply subject of its own (``<inbox>.<n>``): JetStream sends the
    end-of-batch status there, so a status that arrives late for an earlier pull cannot end
    a later one. A message that arrives after its pull gave up is kept for the next pull,
    but only for ``keep_late_s`` (less than the ack wait): older, JetStream redelivers it.

    The caller may also hand messages back unsettled (:meth:`hold`): the next pull returns
    them first and asks the server only for the rest, so a record a run could not take is
    not nacked, sent again and parsed again. :meth:`release` gives every message kept here
    back to the caller, to be nacked when no pull follows soon.
    """

    nc: NATS
    stream: str
    durable: str
    timeout_s: float
    keep_late_s: float = 60.0
    _inbox: str | None = None
    _sub: Subscription | None = None
    _pulls: int = 0
    _reply: str | None = None
    #: Messages here for the next pull: ``(arrival, stream sequence, message)``; the sequence
    #: is read off the message once, when a pull first hands it out (None until then): a
    #: held message may be handed out several times.
    _batch: list[tuple[float, int | None, Msg]] = field(default_factory=list)
    _want: int = 0
    _done: asyncio.Future[None] | None = None
    _failure: MessagingError | None = None
    #: Each message of the last pull by identity, with when it arrived and its stream
    #: sequence: a held message keeps its arrival, so holding never stretches it past
    #: ``keep_late_s``.
    _arrived: dict[int, tuple[float, int, Msg]] = field(default_factory=dict)

    async def _on_message(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is None:
            self._batch.append((asyncio.get_running_loop().time(), None, msg))
            if self._want and len(self._batch) >= self._want:
                self._finish()
            return
        if msg.subject != self._reply:
            return  # the status of an earlier pull that already gave up
        if status in _END_OF_PULL:
            self._finish()
        elif status == "503":
            self._finish(
                ConsumerGoneError(
                    f"consumer {self.durable} on {self.stream} does not exist (503 no responders)"
                )
            )
        elif status != "100":  # 100 is an idle heartbeat
            description = msg.headers.get("Description", "") if msg.headers else ""
            self._finish(
                MessagingError(
                    f"pull from consumer {self.durable} on {self.stream} failed: {status} "
                    f"{description}"
                )
            )

    def _finish(self, failure: MessagingError | None = None) -> None:
        if self._done is not None and not self._done.done():
            self._failure = failure
            self._done.set_result(None)

    async def pull(self, batch: int) -> list[Msg]:
        """Up to ``batch`` messages available now; ``[]`` when there are none."""
        prefetched = self._done is not None
        await self._request_ended()
        if not prefetched or len(self._fresh()) < batch:
            await self._ask(batch)
            await self._request_ended()
        kept, self._batch = self._batch[:batch], self._batch[batch:]
        taken = [(at, delivery(msg)[0] if seq is None else seq, msg) for at, seq, msg in kept]
        self._arrived = {id(entry[2]): entry for entry in taken}
        failure, self._failure = self._failure, None
        if failure is not None and not taken:
            raise failure
        return _one_copy_each(taken)

    async def prefetch(self, batch: int) -> None:
        """Ask now for what ``batch`` leaves to fill after the messages kept here, and return
        at once: the messages gather here while the caller works, and the next :meth:`pull`
        hands them out without a round trip when they fill it. Nothing is asked while
        another request is in flight."""
        if self._done is None:
            await self._ask(batch)

    def _fresh(self) -> list[tuple[float, int | None, Msg]]:
        """The messages kept here, less those kept too long: their ack wait is running out,
        and JetStream will deliver them again (a second copy in one batch would be handled
        twice)."""
        fresh_after = asyncio.get_running_loop().time() - self.keep_late_s
        self._batch = [kept for kept in self._batch if kept[0] >= fresh_after]
        return self._batch

    async def _ask(self, batch: int) -> None:
        """Send a no-wait request for what ``batch`` leaves to fill (none when the messages
        kept here fill it); :meth:`_request_ended` waits for it."""
        from nats.errors import Error as NatsError

        kept = len(self._fresh())
        self._done = asyncio.get_running_loop().create_future()
        self._want, self._failure = batch, None
        if kept >= batch:  # late or held messages of earlier pulls fill this one
            self._finish()
            return
        request = json.dumps({"batch": batch - kept, "no_wait": True}).encode()
        try:
            if self._sub is None or self._inbox is None:
                self._inbox = self.nc.new_inbox()
                self._sub = await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_message)
            self._pulls += 1
            self._reply = f"{self._inbox}.{self._pulls}"
            await self.nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}", request, self._reply
            )
        except NatsError as exc:
            self._want, self._done = 0, None
            # Disconnected (no client-side buffer: see connect_nats) or closed for good.
            raise NatsUnavailableError(
                f"cannot pull from consumer {self.durable} on {self.stream}: "
                f"{type(exc).__name__}: {exc}; the next run tries again"
            ) from exc

    async def _request_ended(self) -> None:
        """Wait until the request in flight, if any, ended: its end-of-batch status came,
        or all it asked for, or ``timeout_s`` passed (then what arrived is its answer)."""
        if self._done is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._done), self.timeout_s)
        self._want, self._done = 0, None

    def hold(self, messages: list[Msg]) -> None:
        """Keep ``messages`` (of the last pull, unsettled) for the next pull, ahead of anything
        else: they stay delivered to this consumer, unacknowledged, until the next pull hands
        them out again or ``keep_late_s`` after their arrival."""
        now = asyncio.get_running_loop().time()
        kept: list[tuple[float, int | None, Msg]] = []
        for msg in messages:
            entry = self._arrived.get(id(msg))
            # The entry must be this very message: an id is reused once its object is gone.
            kept.append(entry if entry is not None and entry[2] is msg else (now, None, msg))
        self._batch[:0] = kept

    async def release(self) -> list[Msg]:
        """Every message kept here (held, prefetched or late), no longer kept, once a request
        in flight ended: the caller settles them."""
        await self._request_ended()
        kept, self._batch = self._batch, []
        return [msg for _, _, msg in kept]

    async def close(self) -> None:
        if self._sub is not None:
            # A closed connection has already dropped the subscription.
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


def delivery(msg: Msg) -> tuple[int, int]:
    """``(stream sequence, times delivered)`` of a JetStream message, read off its reply
    subject. The common form (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.…``,
    9 tokens) is read here, a tenth of the cost of nats.py's full ``metadata`` (which also
    builds a datetime per message); any other form takes ``metadata``."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        try:
            return int(tokens[5]), int(tokens[4])
        except ValueError:
            pass
    metadata = msg.metadata
    return metadata.sequence.stream, metadata.num_delivered


def _one_copy_each(taken: list[tuple[float, int, Msg]]) -> list[Msg]:
    """The messages of ``taken``, less a second delivery of the same stream message (a late
    copy and its redelivery); the copy kept is the newest, whose ack JetStream expects."""
    messages = [msg for _, _, msg in taken]
    seqs = [seq for _, seq, _ in taken]
    if len(set(seqs)) == len(seqs):
        return messages
    newest = dict(zip(seqs, messages, strict=True))
    return [msg for seq, msg in zip(seqs, messages, strict=True) if newest[seq] is msg]
