"""``rhumbatron dead-letters`` (list, show, retry, dismiss): the local state's dead letters,
through the same operator functions as the HTTP API, as a platform operator who sees every
tenant's letters. Exit status: 2 no such letter, 3 a closed letter (or one that can only be
dismissed), 4 NATS did not take a Retry, 1 anything else."""

from __future__ import annotations

import argparse
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from rhumbatron.cli.common import print_json, run_on_runtime
from rhumbatron.cli.dead_letter_views import (
    print_inspection,
    print_table,
    retry_line,
    wire,
    wire_detail,
)
from rhumbatron.cli.guard import GuardedCommand
from rhumbatron.cli.options import JsonFlag

if TYPE_CHECKING:
    from rhumbatron.operator import Inspection
    from rhumbatron.product.dead_letters import DeadLetter
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["app", "dead_letters"]

app = typer.Typer(
    help="List, show, retry or dismiss dead letters (every tenant's). Exit status: 2 no such "
    "letter, 3 closed (or a letter that can only be dismissed), 4 NATS did not take a Retry.",
    no_args_is_help=True,
)

LetterId = Annotated[str, typer.Argument(metavar="ID", help="The dead letter's ID (dl_...).")]


class StatusFilter(StrEnum):
    OPEN = "open"
    CLOSED = "closed"
    ALL = "all"


class KindFilter(StrEnum):
    COMMAND = "command"
    POISON_EVENT = "poison_event"
    REACTION = "reaction"


@app.command("list", cls=GuardedCommand)
def list_command(
    status: Annotated[
        StatusFilter, typer.Option(help="Open letters, closed ones, or all.")
    ] = StatusFilter.OPEN,
    queue: Annotated[
        str | None, typer.Option(help="Only letters of commands that failed on this queue.")
    ] = None,
    kind: Annotated[KindFilter | None, typer.Option(help="Only letters of this kind.")] = None,
    project: Annotated[str | None, typer.Option(help="Only this project's letters.")] = None,
    json_: JsonFlag = False,
) -> int:
    """List letters, oldest first."""
    return dead_letters(
        argparse.Namespace(
            action="list",
            status=status.value,
            queue=queue,
            kind=kind.value if kind else None,
            project=project,
            json=json_,
        )
    )


@app.command("show", cls=GuardedCommand)
def show_command(letter_id: LetterId, json_: JsonFlag = False) -> int:
    """A letter with its full command payload and last error."""
    return dead_letters(argparse.Namespace(action="show", id=letter_id, json=json_))


@app.command("retry", cls=GuardedCommand)
def retry_command(letter_id: LetterId, json_: JsonFlag = False) -> int:
    """Send the command again as attempt + 1 (exactly once)."""
    return dead_letters(argparse.Namespace(action="retry", id=letter_id, json=json_))


@app.command("dismiss", cls=GuardedCommand)
def dismiss_command(letter_id: LetterId, json_: JsonFlag = False) -> int:
    """Close an open letter as dismissed."""
    return dead_letters(argparse.Namespace(action="dismiss", id=letter_id, json=json_))


def dead_letters(args: argparse.Namespace) -> int:
    """Run one dead-letter action. The operator's errors end the command with the exit
    statuses above (:func:`~rhumbatron.cli.common.exit_status_of`)."""
    from rhumbatron.errors import DeadLetterNotFoundError

    try:
        # One event loop for the whole action: the runtime's NATS connection (a Retry) opens
        # on it and must be drained on it.
        return run_on_runtime(lambda app: _dead_letter_action(app, args))
    except DeadLetterNotFoundError as exc:
        raise DeadLetterNotFoundError(
            f"{exc}; `rhumbatron dead-letters list --status all` shows all"
        ) from None


async def _dead_letter_action(app: Rhumbatron, args: argparse.Namespace) -> int:
    from rhumbatron import operator

    tenant = operator.ANY_TENANT
    if args.action == "list":
        letters = _all_letters(app, args)
        if args.json:
            print_json([wire(letter) for letter in letters])
        else:
            print_table(letters, args.status)
    elif args.action == "show":
        inspection = operator.inspect_dead_letter(app, args.id, tenant_id=tenant)
        if args.json:
            print_json(wire_detail(inspection))
        else:
            print_inspection(inspection)
    elif args.action == "retry":
        await _retry(app, args)
    else:
        letter = operator.dismiss_dead_letter(app, args.id, tenant_id=tenant)
        if args.json:
            print_json(wire(letter))
        else:
            print(f"dead letter {letter.dead_letter_id} dismissed: closed, resolution dismissed")
    return 0


async def _retry(app: Rhumbatron, args: argparse.Namespace) -> None:
    from rhumbatron import operator
    from rhumbatron.product.dead_letters import DeadLetterKind

    tenant = operator.ANY_TENANT
    # An unknown, closed or poison letter is answered as such (2, 3) even while NATS is
    # down; retry_dead_letter checks again, in the transaction that reserves the Retry.
    inspection = operator.inspect_dead_letter(app, args.id, tenant_id=tenant)
    _refuse_retry_early(inspection)
    if inspection.letter.kind is not DeadLetterKind.REACTION:
        await _ensure_streams(app)  # a webhook delivery's Retry sends nothing on NATS
    outcome = await operator.retry_dead_letter(app, args.id, tenant_id=tenant)
    if args.json:
        from rhumbatron.api.schemas import RetryBody

        print_json(RetryBody.of(outcome).model_dump(mode="json", by_alias=True))
    else:
        print(retry_line(outcome))


def _all_letters(app: Rhumbatron, args: argparse.Namespace) -> list[DeadLetter]:
    """Every letter the filters match, oldest first, page after page."""
    from rhumbatron import operator
    from rhumbatron.product.dead_letters import DeadLetterKind, DeadLetterStatus

    letters: list[DeadLetter] = []
    after: str | None = None
    while True:
        page = operator.list_dead_letters(
            app,
            tenant_id=operator.ANY_TENANT,
            status=None if args.status == "all" else DeadLetterStatus(args.status),
            kind=DeadLetterKind(args.kind) if args.kind else None,
            queue=args.queue,
            project_id=args.project,
            after=after,
            limit=operator.MAX_PAGE,
        )
        letters += page.letters
        if page.next_after is None:
            return letters
        after = page.next_after


def _refuse_retry_early(inspection: Inspection) -> None:
    """Raise what the Retry itself would for a closed letter or one that can only be
    dismissed, before the command opens a NATS connection it will not need."""
    from rhumbatron.errors import DeadLetterClosedError, DeadLetterError
    from rhumbatron.product.dead_letters import DeadLetterKind, DeadLetterStatus

    letter = inspection.letter
    if letter.status is DeadLetterStatus.CLOSED:
        raise DeadLetterClosedError(
            f"dead letter {letter.dead_letter_id} is already closed ({letter.resolution})"
        )
    if letter.kind is DeadLetterKind.POISON_EVENT:
        raise DeadLetterError(
            f"dead letter {letter.dead_letter_id} is a poison event of {letter.consumer}; it "
            f"can only be dismissed: rhumbatron dead-letters dismiss {letter.dead_letter_id}"
        )
    if letter.kind is DeadLetterKind.REACTION:
        return  # a webhook delivery: its Retry re-arms it, there is no Command to check
    if inspection.command is None:
        raise DeadLetterError(
            f"dead letter {letter.dead_letter_id} holds no valid Command "
            f"({inspection.body_problem}); it can only be dismissed"
        )


async def _ensure_streams(app: Rhumbatron) -> None:
    """The COMMANDS stream must exist before a Retry reserves anything, as the API makes
    sure before its first send; NATS down here means nothing was reserved."""
    from nats.errors import Error as NatsError

    from rhumbatron.errors import NatsUnavailableError

    try:
        await app.ensure_streams()
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"cannot reach JetStream at {app.settings.nats_url}: {type(exc).__name__}: {exc}; "
            "nothing was retried"
        ) from exc
