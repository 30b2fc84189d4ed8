"""What an operator may do: list, inspect, retry and dismiss dead letters; send a command.

The operator API (:mod:`rhumbatron.api`) and the CLI both call these functions; neither
holds any logic of its own. Every function takes the caller's tenant: a letter (or a
project) of another tenant is "not found", exactly as one that does not exist, so an
operator cannot learn what other tenants have. The tenant ``"*"``
(:data:`~rhumbatron.core.settings.ANY_TENANT`) sees every tenant: a platform operator,
who also sees the letters that carry no tenant (a ``forks.sweep`` command has none).

Retry (spec: "Dead-letter path"; RELIABILITY F14)
    One product transaction checks the tenant and reserves the Retry as attempt
    ``attempt + 1`` (:func:`~rhumbatron.product.dead_letters.claim_retry`). Only the caller
    that won the reservation sends the command again, on ``agent-wakeups`` for
    ``agent.wake`` and ``integration`` for every other type, under the message ID
    ``<queue>:<commandId>:<attempt>``: a new ID, so the 2-hour duplicate window does not
    swallow it, and the same ID for every send of that attempt, so a repeat is dropped. A
    double click or a second operator finds the attempt reserved and sends nothing. If the
    send fails, the reservation is undone so the operator can click again. The letter
    stays open: the queue runtime closes it as ``succeeded`` when the command succeeds,
    and the dead-letter consumer updates and reopens it when it fails again.

    A process that dies between the reservation and the send would leave the attempt
    reserved and never sent. A later Retry that finds a reservation older than
    ``api_retry_resend_after_s`` (longer than any connect plus send) and still inside the
    duplicate window therefore sends it again under the same message ID: JetStream drops
    it if the first send did arrive (``duplicate``), so there is still one message.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rhumbatron.core.settings import ANY_TENANT

# Defined in rhumbatron.errors; the alias keeps this module's old import path working.
from rhumbatron.errors import (
    DeadLetterError,
    DeadLetterNotFoundError,
    EnvelopeError,
    MessagingError,
    NatsUnavailableError,
    ProjectNotFoundError,
    RhumbatronError,
)
from rhumbatron.product import dead_letters
from rhumbatron.product.dead_letters import DeadLetter, DeadLetterKind, DeadLetterStatus
from rhumbatron.protocol.envelopes import Command

if TYPE_CHECKING:
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings
    from rhumbatron.messaging.commands import CommandBus, SendResult
    from rhumbatron.product.database import ProductDatabase

__all__ = [
    "ANY_TENANT",
    "MAX_PAGE",
    "DeadLetterPage",
    "Inspection",
    "OperatorContext",
    "RetryOutcome",
    "dismiss_dead_letter",
    "inspect_dead_letter",
    "list_dead_letters",
    "retry_dead_letter",
    "send_command",
]

_log = logging.getLogger(__name__)

#: The most letters one page holds.
MAX_PAGE = 200


class OperatorContext(Protocol):
    """What the operator's actions read from the process: the settings, the clock, the
    product database (the letters), the command bus (a Retry's resend) and the actors."""

    settings: Settings
    clock: Clock

    def product(self) -> ProductDatabase: ...

    async def command_bus(self) -> CommandBus: ...

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard: ...

    def project_tenant(self, project_id: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    """One page of letters, oldest first; ``next_after`` is the cursor of the next page
    (None on the last page)."""

    letters: Sequence[DeadLetter]
    next_after: str | None


@dataclass(frozen=True, slots=True)
class Inspection:
    """A letter with its body decoded: the Command when it is one, and the body as JSON."""

    letter: DeadLetter
    command: Command | None
    body_json: Any
    body_problem: str | None


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


def _visible(letter: DeadLetter, tenant_id: str) -> bool:
    return tenant_id in (ANY_TENANT, letter.tenant_id)


def _letter_of(db: sqlite3.Connection, dead_letter_id: str, tenant_id: str) -> DeadLetter:
    letter = dead_letters.get_dead_letter(db, dead_letter_id)
    if not _visible(letter, tenant_id):
        # The same words as for an unknown ID: another tenant's letter does not exist here.
        raise DeadLetterNotFoundError(f"no dead letter {dead_letter_id!r}")
    return letter


# -- reading ---------------------------------------------------------------------------------


def list_dead_letters(
    app: OperatorContext,
    *,
    tenant_id: str,
    status: DeadLetterStatus | None = DeadLetterStatus.OPEN,
    kind: DeadLetterKind | None = None,
    queue: str | None = None,
    project_id: str | None = None,
    after: str | None = None,
    limit: int = 50,
) -> DeadLetterPage:
    """The tenant's letters, oldest first, filtered; ``after`` is the previous page's cursor.

    Raises :class:`DeadLetterNotFoundError` when ``after`` names no letter of this tenant.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit={limit} must be between 1 and {MAX_PAGE}")
    db = app.product().connection
    if after is not None:
        try:
            _letter_of(db, after, tenant_id)
        except DeadLetterNotFoundError:
            raise DeadLetterNotFoundError(
                f"page cursor {after!r} names no dead letter; start again without it"
            ) from None
    # One more than asked says whether a next page exists without a second query.
    letters = dead_letters.list_dead_letters(
        db,
        status=status,
        kind=kind,
        tenant_id=None if tenant_id == ANY_TENANT else tenant_id,
        project_id=project_id,
        queue=queue,
        after=after,
        limit=limit + 1,
    )
    page = letters[:limit]
    return DeadLetterPage(page, page[-1].dead_letter_id if len(letters) > limit else None)


def inspect_dead_letter(app: OperatorContext, dead_letter_id: str, *, tenant_id: str) -> Inspection:
    """The letter with its full body: the Command (for a command letter whose body is one),
    the last error (``reason``), the attempts and the resolution."""
    letter = _letter_of(app.product().connection, dead_letter_id, tenant_id)
    try:
        body_json: Any = json.loads(letter.body)
    except ValueError:
        body_json = None  # an undecodable record: the raw body is still on the letter
    command: Command | None = None
    problem: str | None = None
    if letter.kind is DeadLetterKind.COMMAND:
        try:
            command = Command.parse(letter.body)
        except EnvelopeError as exc:
            problem = str(exc)
    return Inspection(letter, command, body_json, problem)


# -- acting ----------------------------------------------------------------------------------


def dismiss_dead_letter(app: OperatorContext, dead_letter_id: str, *, tenant_id: str) -> DeadLetter:
    """Close an open letter as ``dismissed`` (the only action on a poison-event letter).

    Raises :class:`DeadLetterNotFoundError` (unknown, or another tenant's) and
    :class:`~rhumbatron.errors.DeadLetterClosedError` (already closed).
    """
    from rhumbatron.reactions.webhook_ledger import park_dead

    now_s = app.clock.now().timestamp()
    with app.product().transaction() as db:
        before = _letter_of(db, dead_letter_id, tenant_id)
        letter = dead_letters.dismiss_dead_letter(db, dead_letter_id, now_s=now_s)
        if before.kind is DeadLetterKind.REACTION and before.event_id is not None:
            park_dead(db, before.event_id, now_s=now_s)
    _log.info("dead letter %s dismissed (tenant %s)", dead_letter_id, tenant_id)
    return letter


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
    if _letter_of(app.product().connection, dead_letter_id, tenant_id).kind is (
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
        before = _letter_of(db, dead_letter_id, tenant_id)
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
        result = await _send(app, queue, command)
    except MessagingError as exc:
        raise type(exc)(
            f"the Retry of dead letter {dead_letter_id} as attempt {attempt} was not sent "
            f"on {queue} ({_cause(exc)}); retry again once NATS answers"
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
        result = await _send(app, queue, command)
    except MessagingError as exc:
        _undo_reservation(app, before, attempt)
        # Same type (NATS down or JetStream refusing), with what the operator can do now.
        raise type(exc)(
            f"the Retry of dead letter {dead_letter_id} as attempt {attempt} was not sent on "
            f"{queue} ({_cause(exc)}); nothing is reserved: retry again once NATS answers"
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
        letter = _letter_of(db, dead_letter_id, tenant_id)
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


async def _send(app: OperatorContext, queue: str, command: Command) -> SendResult:
    bus = await app.command_bus()
    return await bus.send(queue, command)


def _cause(exc: MessagingError) -> str:
    """What failed underneath: the client's own error when NATS did not answer (the bus's
    advice to send again does not fit a Retry), else the bus's message."""
    cause = exc.__cause__
    if isinstance(exc, NatsUnavailableError) and cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return str(exc)


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


async def send_command(
    app: OperatorContext, queue: str, command: Command, *, tenant_id: str
) -> SendResult:
    """Send an operator's command on ``queue`` under ``<queue>:<commandId>[:<attempt>]``.

    The command's project must not belong to another tenant: its owner is read from the
    project's root actor when the project exists, and from the payload of a
    ``project.provision``. Raises :class:`ProjectNotFoundError`, and
    ``NatsUnavailableError`` or ``MessagingError`` when the send failed (sending the same
    command again is harmless).
    """
    owner = _project_tenant(app, command)
    # Fail closed: a project nobody owns yet is only a platform operator's to command
    # (except its own provisioning, whose payload names the tenant).
    if tenant_id not in (ANY_TENANT, owner):  # owner None: nobody's project yet
        raise ProjectNotFoundError(f"no project {command.project_id!r}")
    bus = await app.command_bus()
    result = await bus.send(queue, command)
    _log.info(
        "operator command %s (%s) sent on %s, duplicate=%s (tenant %s)",
        command.command_id,
        command.command_type,
        queue,
        result.duplicate,
        tenant_id,
    )
    return result


def _project_tenant(app: OperatorContext, command: Command) -> str | None:
    owner = app.project_tenant(command.project_id)
    if owner is not None:
        return owner
    tenant = getattr(command.payload, "tenant_id", None)
    return tenant if command.command_type == "project.provision" else None
