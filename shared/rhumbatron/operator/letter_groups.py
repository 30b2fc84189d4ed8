"""Dead letters as operators triage them: in groups, retried or dismissed a group at once.

A group is the open letters of one kind, queue (or subscription), command type and failure
reason, the reason *normalised*: IDs, numbers, hashes and quoted values give way to
placeholders, so "no fork for cand_1f2e…" and "no fork for cand_9a8b…" are one group
(the anchor is NServiceBus ServicePulse's failure groups). A group's ID is a digest of
those four, so it names the same group on every call while the failure lasts.

Retry and Dismiss of a group act on each open letter of it, through the one-letter actions
(:func:`~rhumbatron.operator.retry.retry_dead_letter`,
:func:`~rhumbatron.operator.letters.dismiss_dead_letter`), and so are idempotent as they
are: a second Retry of the group finds each attempt already reserved and sends nothing; a
second Dismiss finds nothing open. ``dry_run`` counts what would happen and changes
nothing. A group of letters that can only be dismissed (a poison event, a body that is no
Command) is not retryable: Retry refuses it whole, naming why.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.errors import DeadLetterError, DeadLetterNotFoundError, EnvelopeError
from rhumbatron.operator.context import OperatorContext
from rhumbatron.product import dead_letters
from rhumbatron.product.dead_letters import DeadLetter, DeadLetterKind, DeadLetterStatus
from rhumbatron.protocol.envelopes import Command

__all__ = [
    "GroupAction",
    "LetterGroup",
    "can_retry",
    "dismiss_group",
    "group_dead_letters",
    "normalise_reason",
    "retry_group",
]

#: What a reason's variable parts become, in this order (the first that matches wins).
_VARIABLE_PARTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"'[^']*'|\"[^\"]*\""), "'…'"),  # quoted values
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<id>"),
    # prefixed IDs: cmd_…, evt_…, dl_…, cand_…, chg-…, rel_acme_3 …
    (re.compile(r"\b[A-Za-z]{2,12}[_-][A-Za-z0-9_.:\-]*\d[A-Za-z0-9_.:\-]*"), "<id>"),
    (re.compile(r"\b[0-9a-f]{12,}\b", re.I), "<hex>"),  # hashes and digests
    (re.compile(r"\d+(\.\d+)?"), "<n>"),  # counts, sizes, sequences, delivery numbers
)
#: A normalised reason is cut to this many characters (the same error's tail varies most).
_REASON_CHARS = 300


def normalise_reason(reason: str) -> str:
    """``reason`` with its IDs, numbers, hashes and quoted values replaced by placeholders,
    and its whitespace collapsed."""
    text = " ".join(reason.split())
    for pattern, placeholder in _VARIABLE_PARTS:
        text = pattern.sub(placeholder, text)
    return text[:_REASON_CHARS]


def can_retry(letter: DeadLetter) -> bool:
    """Whether Retry can send the letter again: an open command letter whose body is a
    Command, or an open reaction's. A poison event, or a body that is no Command, can only
    be dismissed."""
    if letter.status is not DeadLetterStatus.OPEN:
        return False
    if letter.kind is DeadLetterKind.REACTION:
        return True
    if letter.kind is not DeadLetterKind.COMMAND:
        return False
    try:
        Command.parse(letter.body)
    except EnvelopeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class LetterGroup:
    """Open letters that failed the same way."""

    group_id: str
    kind: DeadLetterKind
    queue: str | None
    command_type: str | None
    consumer: str | None
    reason: str
    retryable: bool
    letter_ids: tuple[str, ...]
    first_at_s: float
    last_at_s: float

    @property
    def count(self) -> int:
        return len(self.letter_ids)


@dataclass(slots=True)
class GroupAction:
    """What a group's Retry or Dismiss did (or, in a dry run, would do), letter by letter:
    ``done`` this call acted on, ``already`` another call had (a Retry reserved, a letter
    closed), ``failed`` with why."""

    group_id: str
    action: str
    dry_run: bool
    done: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def _key(letter: DeadLetter) -> tuple[str, str, str, str, str]:
    return (
        letter.kind.value,
        letter.queue or "",
        letter.command_type or "",
        letter.consumer or "",
        normalise_reason(letter.reason),
    )


def _group_id(key: tuple[str, ...]) -> str:
    return "grp_" + hashlib.sha256("\x1f".join(key).encode()).hexdigest()[:16]


def group_dead_letters(app: OperatorContext, *, tenant_id: str) -> list[LetterGroup]:
    """The tenant's open letters in groups, the largest first (then the most recent)."""
    letters = dead_letters.list_dead_letters(
        app.product().connection,
        status=DeadLetterStatus.OPEN,
        tenant_id=None if tenant_id == ANY_TENANT else tenant_id,
        limit=1_000_000,
    )
    by_key: dict[tuple[str, str, str, str, str], list[DeadLetter]] = {}
    for letter in letters:
        by_key.setdefault(_key(letter), []).append(letter)
    groups = [_group(key, members) for key, members in by_key.items()]
    return sorted(groups, key=lambda g: (-g.count, -g.last_at_s, g.group_id))


def _group(key: tuple[str, str, str, str, str], members: Sequence[DeadLetter]) -> LetterGroup:
    kind, queue, command_type, consumer, reason = key
    return LetterGroup(
        group_id=_group_id(key),
        kind=DeadLetterKind(kind),
        queue=queue or None,
        command_type=command_type or None,
        consumer=consumer or None,
        reason=reason,
        retryable=all(can_retry(letter) for letter in members),
        letter_ids=tuple(letter.dead_letter_id for letter in members),
        first_at_s=min(letter.created_at_s for letter in members),
        last_at_s=max(letter.created_at_s for letter in members),
    )


def _find(app: OperatorContext, group_id: str, tenant_id: str) -> LetterGroup:
    for group in group_dead_letters(app, tenant_id=tenant_id):
        if group.group_id == group_id:
            return group
    raise DeadLetterNotFoundError(
        f"no group {group_id!r} of open dead letters (its letters may all be closed); list "
        "the groups again"
    )


async def retry_group(
    app: OperatorContext, group_id: str, *, tenant_id: str, dry_run: bool = False
) -> GroupAction:
    """Retry every open letter of the group (see the module). Raises
    :class:`DeadLetterNotFoundError` for a group with no open letter of this tenant, and
    :class:`DeadLetterError` for a group that can only be dismissed."""
    from rhumbatron.errors import DeadLetterClosedError, MessagingError
    from rhumbatron.operator.retry import retry_dead_letter

    group = _find(app, group_id, tenant_id)
    if not group.retryable:
        raise DeadLetterError(
            f"group {group_id} ({group.kind.value}: {group.reason}) can only be dismissed: "
            "its letters hold no command that can be sent again"
        )
    action = GroupAction(group_id, "retry", dry_run)
    if dry_run:
        action.done = list(group.letter_ids)
        return action
    for letter_id in group.letter_ids:
        try:
            outcome = await retry_dead_letter(app, letter_id, tenant_id=tenant_id)
        except (DeadLetterClosedError, DeadLetterNotFoundError):
            action.already.append(letter_id)
        except (DeadLetterError, MessagingError) as exc:
            action.failed[letter_id] = str(exc)
        else:
            (action.done if outcome.sent else action.already).append(letter_id)
    return action


def dismiss_group(
    app: OperatorContext, group_id: str, *, tenant_id: str, dry_run: bool = False
) -> GroupAction:
    """Dismiss every open letter of the group. Raises :class:`DeadLetterNotFoundError` for
    a group with no open letter of this tenant."""
    from rhumbatron.errors import DeadLetterClosedError
    from rhumbatron.operator.letters import dismiss_dead_letter

    group = _find(app, group_id, tenant_id)
    action = GroupAction(group_id, "dismiss", dry_run)
    if dry_run:
        action.done = list(group.letter_ids)
        return action
    for letter_id in group.letter_ids:
        try:
            dismiss_dead_letter(app, letter_id, tenant_id=tenant_id)
        except (DeadLetterClosedError, DeadLetterNotFoundError):
            action.already.append(letter_id)
        else:
            action.done.append(letter_id)
    return action
