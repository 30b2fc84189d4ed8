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

__all__ = ["ConsumerChange", "Puller", "ensure_consumer"]

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
    _batch: list[tuple[float, Msg]] = field(default_factory=list)
    _want: int = 0
    _done: asyncio.Future[None] | None = None
    _failure: MessagingError | None = None

    async def _on_message(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is None:
            self._batch.append((asyncio.get_running_loop().time(), msg))
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
        from nats.errors import Error as NatsError

        request = json.dumps({"batch": batch, "no_wait": True}).encode()
        loop = asyncio.get_running_loop()
        # Late messages held too long: their ack wait is running out, and JetStream will
        # deliver them again; a second copy in one batch would be handled twice.
        fresh_after = loop.time() - self.keep_late_s
        self._batch = [(at, msg) for at, msg in self._batch if at >= fresh_after]
        self._done = loop.create_future()
        self._want, self._failure = batch, None
        if len(self._batch) >= batch:  # late messages of an earlier pull fill this one
            self._finish()
        try:
            if self._sub is None or self._inbox is None:
                self._inbox = self.nc.new_inbox()
                self._sub = await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_message)
            self._pulls += 1
            self._reply = f"{self._inbox}.{self._pulls}"
            if not self._done.done():
                await self.nc.publish(
                    f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}",
                    request,
                    self._reply,
                )
        except NatsError as exc:
            # Disconnected (no client-side buffer: see connect_nats) or closed for good.
            raise NatsUnavailableError(
                f"cannot pull from consumer {self.durable} on {self.stream}: "
                f"{type(exc).__name__}: {exc}; the next run tries again"
            ) from exc
        with contextlib.suppress(TimeoutError):
            # No end-of-batch status in time: what arrived is the batch.
            await asyncio.wait_for(asyncio.shield(self._done), self.timeout_s)
        self._want, self._done = 0, None
        taken, self._batch = self._batch[:batch], self._batch[batch:]
        if self._failure is not None and not taken:
            raise self._failure
        return _one_copy_each([msg for _, msg in taken])

    async def close(self) -> None:
        if self._sub is not None:
            # A closed connection has already dropped the subscription.
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


def _one_copy_each(messages: list[Msg]) -> list[Msg]:
    """Drop a second delivery of the same stream message within one batch (a late copy and
    its redelivery); the copy kept is the newest, whose ack JetStream expects."""
    newest: dict[int, Msg] = {}
    for msg in messages:
        newest[msg.metadata.sequence.stream] = msg
    return [msg for msg in messages if newest[msg.metadata.sequence.stream] is msg]
