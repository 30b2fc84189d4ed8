"""The dead-letter queue's consumer (the event router role) and the closure of command letters.

A command that failed its last delivery on agent-wakeups, integration, verification or release
arrives here with the headers of its origin (queue, deliveries, last error). For each one
(spec "Dead-letter path", workers/event-router/src/dead-letter.ts):

1. the ``dead_letters`` row is written in the product database, idempotent on ``command_id``
   (a later attempt, an operator's Retry that failed again, updates and reopens it);
2. if the command names a Change, the shard that owns the Change applies
   :func:`~rhumbatron.domain.tasks.dead_letter_outcome`: a ready or assigned Task becomes
   blocked (``dead_letter``) and records ``task.failed``; otherwise the reason goes on the
   Change.

The letter is committed before the shard is touched, so a crash in between leaves a letter
whose outcome the redelivery applies; both steps are idempotent. A body that is not a
Command gets a letter too, keyed by where it came from. The consumer **never sends a command
again**: only an operator's Retry does. A letter that cannot be written (the product database
busy) raises, so the runtime redelivers it after the queue's 60 s, and logs and terminates it
after the 5th delivery.

Closure: the 5-minute sweep closes the open command letters of ended Changes (resolution
``ended``), and a completed ``change.settle`` closes those of its Change (``superseded``).

Every sweep tick also counts the open letters per queue and kind
(:func:`open_letter_counts`) for the dashboards and the open-dead-letters alarm.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import BlockTaskForDeadLetter
from rhumbatron.actors.storage import SqliteStore
from rhumbatron.domain.changes import TERMINAL_STATUSES
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import RhumbatronError
from rhumbatron.messaging.commands import DELIVERIES_HEADER, LAST_ERROR_HEADER, ORIGIN_QUEUE_HEADER
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.product.dead_letters import (
    Resolution,
    close_dead_letters_of_change,
    record_command_dead_letter,
)
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.queue_consumers import DEAD_LETTER_QUEUE, QUEUE_CONSUMERS
from rhumbatron.queues.wake_consumer import is_reaction_wake

if TYPE_CHECKING:
    from rhumbatron.messaging.queue_consumer import Delivery, PollReport
    from rhumbatron.queues.context import QueueContext

__all__ = [
    "DEAD_LETTER_ACTOR",
    "DeadLetterConsumer",
    "close_letters_of_ended_changes",
    "open_letter_counts",
    "record_undecodable_command",
    "run_dead_letter_consumer",
    "supersede_letters_of_change",
    "undecodable_dead_letter_id",
]

_log = logging.getLogger(__name__)

#: The actor named on the facts the dead-letter consumer writes.
DEAD_LETTER_ACTOR = "system:dead-letter-consumer"
#: The message ID the queue runtime gives a body it could not decode when it moves it here
#: (``<dead-letter>:<origin queue>:seq:<origin stream seq>``, see ``QueueConsumerRuntime``).
_RAW_MESSAGE_ID = re.compile(
    rf"^{re.escape(DEAD_LETTER_QUEUE)}:(?P<queue>[^:]+):seq:(?P<seq>[0-9]+)$"
)


def undecodable_dead_letter_id(queue: str, stream_seq: int) -> str:
    """``dl_`` + 24 hex characters derived from where an undecodable body was first seen (its
    queue and its sequence on ``COMMANDS``): a redelivery finds the letter it already wrote."""
    digest = hashlib.sha256(f"undecodable\x1f{queue}\x1f{stream_seq}".encode()).hexdigest()
    return f"dl_{digest[:24]}"


def record_undecodable_command(
    connection: sqlite3.Connection,
    *,
    queue: str,
    stream_seq: int,
    reason: str,
    body: str,
    now_s: float,
) -> bool:
    """Write the letter of a body that is not a Command, once; return whether this call wrote
    it. It has no ``command_id`` (nothing could be read), so it is keyed by
    :func:`undecodable_dead_letter_id`; with no command to send again, an operator can only
    dismiss it. Runs inside the caller's transaction."""
    return (
        connection.execute(
            "INSERT OR IGNORE INTO dead_letters (dead_letter_id, kind, queue, stream, "
            "stream_seq, reason, body, created_at_s, updated_at_s) "
            "VALUES (?, 'command', ?, ?, ?, ?, ?, ?, ?)",
            (
                undecodable_dead_letter_id(queue, stream_seq),
                queue,
                COMMAND_STREAM,
                stream_seq,
                reason,
                body,
                now_s,
                now_s,
            ),
        ).rowcount
        == 1
    )


@dataclass
class DeadLetterConsumer:
    """The handler of the dead-letter queue: ``__call__`` for a Command,
    :meth:`on_undecodable` for a body that is not one. Both return only once the letter is
    committed; both raise when it cannot be written (the runtime retries)."""

    app: QueueContext

    async def __call__(self, command: Command, delivery: Delivery) -> None:
        """Record the command's letter, then mark its Task or Change."""
        app = self.app
        origin = delivery.headers.get(ORIGIN_QUEUE_HEADER) or command.spec.queue
        reason = _reason(command, delivery, origin)
        tenant_id = app.project_tenant(command.project_id)
        with app.product().transaction() as db:
            written = record_command_dead_letter(
                db,
                command_id=command.command_id,
                command_type=command.command_type,
                queue=origin,
                attempt=command.attempt,
                reason=reason,
                body=command.to_json().decode(),
                now_s=app.clock.now().timestamp(),
                tenant_id=tenant_id,
                project_id=command.project_id,
                change_id=command.change_id,
                task_id=command.task_id,
            )
        _log.warning(
            "dead letter of %s (attempt %d) %s: %s",
            command.command_id,
            command.attempt,
            "recorded" if written else "already recorded",
            reason,
        )
        if command.change_id is not None and not is_reaction_wake(command):
            # Applied again on a redelivery too: the letter may have committed before a
            # crash that lost the outcome, and the outcome is idempotent. A reaction's wake
            # names the Change and Task of the event it answers, which are not its own work:
            # its letter alone records the failure (it never blocks another agent's Task).
            self._mark_task_or_change(command, tenant_id, reason)

    def _mark_task_or_change(self, command: Command, tenant_id: str | None, reason: str) -> None:
        app = self.app
        assert command.change_id is not None
        key = change_resource_key(command.change_id)
        ref = ResourceShard.ref_for(command.project_id, key, app.settings.resource_shard_count)
        if not ref.path(app.settings.state_dir).exists():
            # Opening the shard would create an empty actor file for a Change it never held.
            _log.warning(
                "dead letter of %s: change %s of %s is not in any shard; the letter alone "
                "records it",
                command.command_id,
                command.change_id,
                command.project_id,
            )
            return
        if tenant_id is None:
            # A fact needs its tenant, and only the project's root knows it.
            _log.error(
                "dead letter of %s: project %s has no root actor, so change %s cannot be "
                "marked; the letter alone records it",
                command.command_id,
                command.project_id,
                command.change_id,
            )
            return
        caller = Caller(tenant_id, DEAD_LETTER_ACTOR, correlation_id=command.command_id)
        result = app.resource_shard(command.project_id, key).apply(
            caller, BlockTaskForDeadLetter(command=command, reason=reason)
        )
        if result.events_added:
            _log.warning(
                "task %s of change %s blocked (dead_letter) by %s",
                command.task_id,
                command.change_id,
                command.command_id,
            )

    async def on_undecodable(self, body: bytes, delivery: Delivery, reason: str) -> None:
        """Record the letter of a body that is not a Command, keyed by the queue and stream
        sequence where it was first seen (from its message ID), or by its place on the
        dead-letter queue when it was sent here some other way."""
        app = self.app
        found = _RAW_MESSAGE_ID.match(delivery.headers.get("Nats-Msg-Id", ""))
        if found is not None:
            queue, stream_seq = found["queue"], int(found["seq"])
        else:
            queue, stream_seq = DEAD_LETTER_QUEUE, delivery.stream_seq
        last_error = delivery.headers.get(LAST_ERROR_HEADER) or reason
        with app.product().transaction() as db:
            written = record_undecodable_command(
                db,
                queue=queue,
                stream_seq=stream_seq,
                reason=f"undecodable body from {queue} (seq {stream_seq}): {last_error}",
                # Kept as text an operator can read, whatever bytes arrived.
                body=body.decode("utf-8", errors="backslashreplace"),
                now_s=app.clock.now().timestamp(),
            )
        _log.warning(
            "dead letter of an undecodable body from %s seq %d %s",
            queue,
            stream_seq,
            "recorded" if written else "already recorded",
        )


def _reason(command: Command, delivery: Delivery, origin: str) -> str:
    last_error = delivery.headers.get(LAST_ERROR_HEADER) or "no error was recorded"
    deliveries = delivery.headers.get(DELIVERIES_HEADER)
    after = f" after {deliveries} deliveries" if deliveries else ""
    return f"{command.command_type} {command.command_id} failed on {origin}{after}: {last_error}"


async def run_dead_letter_consumer(
    app: QueueContext, *, should_stop: Callable[[], bool] | None = None
) -> PollReport:
    """Poll the dead-letter queue until it is empty or ``should_stop`` says time is up."""
    runtime = await app.queue_runtime()
    consumer = DeadLetterConsumer(app)
    return await runtime.poll(
        DEAD_LETTER_QUEUE,
        consumer,
        should_stop=should_stop,
        on_undecodable=consumer.on_undecodable,
    )


def close_letters_of_ended_changes(app: QueueContext, *, now_s: float, limit: int = 100) -> int:
    """The 5-minute sweep's closure: close the open command letters of Changes that are
    completed, failed, cancelled, not_selected or declined (resolution ``ended``).

    At most ``limit`` Changes are looked up per call, picked at random so open Changes with
    old letters cannot starve ended ones behind them. A Change whose shard cannot be read is
    skipped (logged) and tried again next time. Returns the number of letters closed.
    """
    product = app.product()
    changes = product.connection.execute(
        "SELECT project_id, change_id FROM dead_letters WHERE status = 'open' "
        "AND kind = 'command' AND change_id IS NOT NULL AND project_id IS NOT NULL "
        "GROUP BY project_id, change_id ORDER BY random() LIMIT ?",
        (limit,),
    ).fetchall()
    ended = [
        change_id
        for project_id, change_id in changes
        if _change_status(app, project_id, change_id) in TERMINAL_STATUSES
    ]
    if not ended:
        return 0
    closed = 0
    with product.transaction() as db:
        for change_id in ended:
            closed += close_dead_letters_of_change(db, change_id, Resolution.ENDED, now_s=now_s)
    return closed


def open_letter_counts(connection: sqlite3.Connection) -> dict[tuple[str, str], int]:
    """Open letters per ``(queue, kind)``, with a zero for every pair that can have letters.

    A command letter's queue is the queue its command failed on; a poison-event letter has
    none, and the subscription that gave up on the event stands in for it (as on the local
    dashboard); so does ``reactions`` for a webhook delivery's letter. The zeros cover the
    queues that move their failures here, the subscriptions and the webhook deliveries, so a
    graph or an alarm reads "none open" rather than "no data"; a pair outside them (an
    undecodable body from another queue) appears when it has letters.
    """
    counts = {
        (queue, "command"): 0
        for queue, row in QUEUE_CONSUMERS.items()
        if row.dead_letter_queue == DEAD_LETTER_QUEUE
    }
    counts.update({(subscription.value, "poison_event"): 0 for subscription in Subscription})
    # Webhook deliveries whose retries ran out (the reactions' delivery ledger).
    counts[(Subscription.REACTIONS.value, "reaction")] = 0
    rows = connection.execute(
        "SELECT COALESCE(queue, consumer, '-'), kind, COUNT(*) FROM dead_letters "
        "WHERE status = 'open' GROUP BY 1, 2"
    ).fetchall()
    for queue, kind, count in rows:
        counts[(str(queue), str(kind))] = int(count)
    return counts


def _change_status(app: QueueContext, project_id: str, change_id: str) -> str | None:
    key = change_resource_key(change_id)
    try:
        ref = ResourceShard.ref_for(project_id, key, app.settings.resource_shard_count)
        if not ref.path(app.settings.state_dir).exists():
            return None  # never held this Change; do not create the file to find out
        state = app.resource_shard(project_id, key).change_state(change_id)
    except (RhumbatronError, sqlite3.Error) as exc:
        _log.error("cannot read change %s of %s: %s", change_id, project_id, exc)
        return None
    return None if state is None else state.status


def supersede_letters_of_change(product: SqliteStore, change_id: str, now_s: float) -> int:
    """A later ``change.settle`` of the Change completed: close its open command letters in
    the product database (resolution ``superseded``). Returns the number closed."""
    with product.transaction() as db:
        return close_dead_letters_of_change(db, change_id, Resolution.SUPERSEDED, now_s=now_s)
