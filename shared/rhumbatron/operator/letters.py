"""Listing, inspecting and dismissing dead letters, each within the caller's tenant."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.errors import (
    DeadLetterNotFoundError,
    EnvelopeError,
)
from rhumbatron.operator.context import OperatorContext
from rhumbatron.product import dead_letters
from rhumbatron.product.dead_letters import DeadLetter, DeadLetterKind, DeadLetterStatus
from rhumbatron.protocol.envelopes import Command

__all__ = [
    "MAX_PAGE",
    "DeadLetterPage",
    "Inspection",
    "dismiss_dead_letter",
    "inspect_dead_letter",
    "letter_of",
    "list_dead_letters",
]

_log = logging.getLogger(__name__)


#: The most letters one page holds.
MAX_PAGE = 200


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


def _visible(letter: DeadLetter, tenant_id: str) -> bool:
    return tenant_id in (ANY_TENANT, letter.tenant_id)


def letter_of(db: sqlite3.Connection, dead_letter_id: str, tenant_id: str) -> DeadLetter:
    letter = dead_letters.get_dead_letter(db, dead_letter_id)
    if not _visible(letter, tenant_id):
        # The same words as for an unknown ID: another tenant's letter does not exist here.
        raise DeadLetterNotFoundError(f"no dead letter {dead_letter_id!r}")
    return letter


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
            letter_of(db, after, tenant_id)
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
    letter = letter_of(app.product().connection, dead_letter_id, tenant_id)
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


def dismiss_dead_letter(app: OperatorContext, dead_letter_id: str, *, tenant_id: str) -> DeadLetter:
    """Close an open letter as ``dismissed`` (the only action on a poison-event letter).

    Raises :class:`DeadLetterNotFoundError` (unknown, or another tenant's) and
    :class:`~rhumbatron.errors.DeadLetterClosedError` (already closed).
    """
    from rhumbatron.reactions.webhook_ledger import park_dead

    now_s = app.clock.now().timestamp()
    with app.product().transaction() as db:
        before = letter_of(db, dead_letter_id, tenant_id)
        letter = dead_letters.dismiss_dead_letter(db, dead_letter_id, now_s=now_s)
        if before.kind is DeadLetterKind.REACTION and before.event_id is not None:
            park_dead(db, before.event_id, now_s=now_s)
    _log.info("dead letter %s dismissed (tenant %s)", dead_letter_id, tenant_id)
    return letter
