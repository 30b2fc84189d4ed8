"""Retry of a dead letter: exactly once per attempt (see the package's docstring)."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass

from rhumbatron.errors import (
    DeadLetterError,
    EnvelopeError,
    MessagingError,
    RhumbatronError,
)
from rhumbatron.operator.context import OperatorContext, messaging_cause, send_on
from rhumbatron.operator.letters import letter_of
from rhumbatron.product import dead_letters
from rhumbatron.product.dead_letters import DeadLetter, DeadLetterKind, DeadLetterStatus
from rhumbatron.protocol.envelopes import Command

__all__ = ["RetryOutcome", "retry_dead_letter"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetryOutcome:
    """What one Retry did.

    ``sent`` is true when this call put the command on its queue. A caller that lost the
    reservation to another Retry sends nothing: ``already_retried_as`` names the attempt
    that Retry reserved. ``duplicate`` is true when JetStream dropped a send as a repeat
    of one that had arrived. For a ``reaction`` letter ``queue`` is ``reactions`` and
    ``message_id`` the delivery's ``webhook-id``; ``sent`` means it is due again (the sweep's
    next webhook retry pass sends it).
    """

    letter: DeadLetter
    attempt: int
    queue: str
    message_id: str
    sent: bool
    duplicate: bool = False
    already_retried_as: int | None = None
    stream_seq: int | None = None


async def retry_dead_letter(
    app: OperatorContext, dead_letter_id: str, *, tenant_id: str
) -> RetryOutcome:
    """Send a command letter's command again with ``attempt + 1``, exactly once (F14).

    Raises :class:`DeadLetterNotFoundError` (unknown, or another tenant's),
    :class:`~rhumbatron.errors.DeadLetterClosedError` (closed), :class:`DeadLetterError`
    (a poison-event letter, or a body that is no Command: both can only be dismissed), and
    ``NatsUnavailableError`` or ``MessagingError`` when the send failed, after undoing the
    reservation.
    """
    now_s = app.clock.now().timestamp()
    if letter_of(app.product().connection, dead_letter_id, tenant_id).kind is (
        DeadLetterKind.REACTION
    ):
        return _retry_reaction(app, dead_letter_id, tenant_id=tenant_id, now_s=now_s)
    before, parsed, letter, won = _reserve_retry(app, dead_letter_id, tenant_id, now_s)
    attempt = letter.retried_attempt
    assert parsed is not None and attempt is not None, "claim_retry reserves or raises"
    command = _retried_command(app, parsed, attempt)

    from rhumbatron.messaging.commands import command_message_id, retry_queue_for

    queue = retry_queue_for(command)
    message_id = command_message_id(queue, command)
    if not won:
        return await _resend_stale_reservation(app, letter, command, queue, message_id, now_s=now_s)
    return await _send_reserved(app, before, letter, command, queue, tenant_id=tenant_id)


def _reserve_retry(
    app: OperatorContext, dead_letter_id: str, tenant_id: str, now_s: float
) -> tuple[DeadLetter, Command | None, DeadLetter, bool]:
    """One product transaction: check the tenant, parse the Command and reserve the attempt
    (:func:`~rhumbatron.product.dead_letters.claim_retry`). Returns the letter before, its
    Command, the letter after and whether this call won the reservation."""
    with app.product().transaction() as db:
        before = letter_of(db, dead_letter_id, tenant_id)
        # Parsed before reserving: a letter whose body is no Command must not keep a
        # reservation that nothing can ever send. claim_retry refuses closed and poison ones.
        parsed = _command_of(before) if _retryable(before) else None
        letter, won = dead_letters.claim_retry(db, dead_letter_id, now_s=now_s)
    return before, parsed, letter, won


def _retried_command(app: OperatorContext, parsed: Command, attempt: int) -> Command:
    """The letter's Command as the reserved attempt."""
    # An operator's Retry asks for the work now: a deadline that passed while the command
    # sat in the dead-letter queue would make the runtime ack it without running.
    deadline = parsed.deadline
    if deadline is not None and parsed.is_expired(app.clock.now()):
        deadline = None
    return parsed.model_copy(update={"attempt": attempt, "deadline": deadline})


async def _resend_stale_reservation(
    app: OperatorContext,
    letter: DeadLetter,
    command: Command,
    queue: str,
    message_id: str,
    *,
    now_s: float,
) -> RetryOutcome:
    """A Retry that lost the reservation: send nothing, unless the reservation is old
    enough that its sender is gone and young enough for JetStream to drop a repeat."""
    settings = app.settings
    dead_letter_id = letter.dead_letter_id
    attempt = command.attempt
    reserved_at = letter.retried_at_s or now_s
    age_s = now_s - reserved_at
    if not settings.api_retry_resend_after_s <= age_s < settings.duplicate_window_s:
        _log.info(
            "Retry of %s lost to the Retry reserved %.0f s ago as attempt %d",
            dead_letter_id,
            age_s,
            attempt,
        )
        return RetryOutcome(
            letter, attempt, queue, message_id, sent=False, already_retried_as=attempt
        )
    # Old enough that its sender is gone, young enough for JetStream to drop a repeat.
    try:
        result = await send_on(app, queue, command)
    except MessagingError as exc:
        raise type(exc)(
            f"the Retry of dead letter {dead_letter_id} as attempt {attempt} was not sent "
            f"on {queue} ({messaging_cause(exc)}); retry again once NATS answers"
        ) from exc
    _log.warning(
        "Retry of %s re-sent the stale reservation of attempt %d (duplicate=%s)",
        dead_letter_id,
        attempt,
        result.duplicate,
    )
    return RetryOutcome(
        letter,
        attempt,
        queue,
        result.message_id,
        sent=not result.duplicate,
        duplicate=result.duplicate,
        already_retried_as=attempt,
        stream_seq=result.stream_seq,
    )


async def _send_reserved(
    app: OperatorContext,
    before: DeadLetter,
    letter: DeadLetter,
    command: Command,
    queue: str,
    *,
    tenant_id: str,
) -> RetryOutcome:
    """The winner of the reservation: ready the blocked Task and send; a failed send
    gives the reservation back."""
    dead_letter_id = letter.dead_letter_id
    attempt = command.attempt
    _ready_the_blocked_task(app, command, tenant_id)
    try:
        result = await send_on(app, queue, command)
    except MessagingError as exc:
        _undo_reservation(app, before, attempt)
        # Same type (NATS down or JetStream refusing), with what the operator can do now.
        raise type(exc)(
            f"the Retry of dead letter {dead_letter_id} as attempt {attempt} was not sent on "
            f"{queue} ({messaging_cause(exc)}); nothing is reserved: retry again once NATS answers"
        ) from exc
    _log.info(
        "dead letter %s retried as attempt %d on %s (message %s, tenant %s)",
        dead_letter_id,
        attempt,
        queue,
        result.message_id,
        tenant_id,
    )
    return RetryOutcome(
        letter,
        attempt,
        queue,
        result.message_id,
        sent=not result.duplicate,
        duplicate=result.duplicate,
        stream_seq=result.stream_seq,
    )


def _retry_reaction(
    app: OperatorContext, dead_letter_id: str, *, tenant_id: str, now_s: float
) -> RetryOutcome:
    """A webhook delivery whose retries ran out: one more attempt, due now (the sweep's next
    webhook retry pass sends it with the same ``webhook-id``). The letter closes when it is
    delivered, and opens again with the new reason when it fails."""
    from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
    from rhumbatron.reactions.webhook_ledger import get_delivery, rearm_for_retry

    with app.product().transaction() as db:
        letter = letter_of(db, dead_letter_id, tenant_id)
        delivery_key = letter.event_id or ""
        try:
            delivery = get_delivery(db, delivery_key)
        except LookupError:
            raise DeadLetterError(
                f"dead letter {dead_letter_id} names webhook delivery {delivery_key!r}, which "
                "is no longer kept; it can only be dismissed"
            ) from None
        registry = SubscriptionRegistry(app.product(), app.settings, app.clock)
        subscription = registry.get(None, delivery.subscription_id)
        if subscription is None or not subscription.governance.enabled:
            state = "was deleted" if subscription is None else "is disabled"
            raise DeadLetterError(
                f"dead letter {dead_letter_id}: subscription {delivery.subscription_id} "
                f"{state}; enable it (or dismiss the letter) before a Retry"
            )
        letter, won = dead_letters.claim_retry(db, dead_letter_id, now_s=now_s)
        if won:
            rearm_for_retry(db, delivery_key, now_s=now_s)
    attempt = letter.retried_attempt or (letter.attempt or 0) + 1
    _log.info(
        "dead letter %s: webhook delivery %s due again (won=%s, tenant %s)",
        dead_letter_id,
        delivery_key,
        won,
        tenant_id,
    )
    return RetryOutcome(
        letter,
        attempt,
        "reactions",
        delivery_key,
        sent=won,
        already_retried_as=None if won else attempt,
    )


def _ready_the_blocked_task(app: OperatorContext, command: Command, tenant_id: str) -> None:
    """A retried wake needs its Task ready again: the dead letter blocked it (task.failed),
    and the wake consumer admits an Agent only to a ready Task. The move is keyed on the
    attempt (``task.ready`` key ``retry:<attempt>``), so a repeated Retry moves it once; a Task
    in any other state is left alone."""
    from rhumbatron.queues.wake_consumer import is_reaction_wake

    if command.command_type != "agent.wake" or not command.task_id or not command.change_id:
        return
    if is_reaction_wake(command):
        return  # its Task is the event's, not one its dead letter blocked
    from rhumbatron.actors.resource_shard import change_resource_key
    from rhumbatron.actors.shard_commands import RetryBlockedTask
    from rhumbatron.domain.facts import Caller

    shard = app.resource_shard(command.project_id, change_resource_key(command.change_id))
    tenant = app.project_tenant(command.project_id) or tenant_id
    caller = Caller(tenant, "operator:retry", command.command_id)
    shard.apply(caller, RetryBlockedTask(task_id=command.task_id, attempt=command.attempt))


def _retryable(letter: DeadLetter) -> bool:
    return letter.kind is DeadLetterKind.COMMAND and letter.status is DeadLetterStatus.OPEN


def _command_of(letter: DeadLetter) -> Command:
    try:
        return Command.parse(letter.body)
    except EnvelopeError as exc:
        raise DeadLetterError(
            f"dead letter {letter.dead_letter_id} holds no valid Command ({exc}); it cannot "
            "be sent again and can only be dismissed"
        ) from None


def _undo_reservation(app: OperatorContext, before: DeadLetter, attempt: int) -> None:
    """Give the reservation back (the send failed), unless another Retry replaced it.

    Belongs next to ``claim_retry`` in :mod:`rhumbatron.product.dead_letters`.
    """
    try:
        with app.product().transaction() as db:
            db.execute(
                "UPDATE dead_letters SET retried_attempt = ?, retried_at_s = ? "
                "WHERE dead_letter_id = ? AND retried_attempt = ?",
                (before.retried_attempt, before.retried_at_s, before.dead_letter_id, attempt),
            )
    except (RhumbatronError, sqlite3.Error) as exc:
        # The reservation stays; a Retry after api_retry_resend_after_s sends it anyway.
        _log.error(
            "cannot undo the Retry reservation of %s (attempt %d): %s",
            before.dead_letter_id,
            attempt,
            exc,
        )
