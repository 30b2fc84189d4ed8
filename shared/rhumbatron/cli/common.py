"""What the commands share: the exit statuses, the one-line failure, JSON output, a runtime
of the local state for one action, and the registry commands' error mapping.

Nothing heavy at import: the runtime, pydantic and the errors are imported where used, so
``rhumbatron --help`` stays quick.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = [
    "EXIT_CANNOT",
    "EXIT_ERROR",
    "EXIT_GAP",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "EXIT_UNSAFE",
    "exit_status_of",
    "fail",
    "print_json",
    "read_json_object",
    "run_on_runtime",
    "run_registry_command",
]

EXIT_ERROR = 1
EXIT_NOT_FOUND = 2
EXIT_CANNOT = 3
EXIT_UNAVAILABLE = 4
EXIT_UNSAFE = 5
EXIT_GAP = 6

T = TypeVar("T")


def fail(status: int, message: str, *, command: str = "dead-letters") -> int:
    """Say on stderr, in one line naming the command, why it failed; return ``status``."""
    print(f"rhumbatron {command}: {message}", file=sys.stderr)
    return status


def exit_status_of(exc: Exception) -> int:
    """The documented exit status of an error a command raised, decided here only: 2 no such
    record (dead letter, subscription, schedule), 3 a record or a run that cannot take the
    action asked (closed, disabled, another content under the name, a replay or rebuild that
    cannot run as asked), 4 NATS or the log cannot be reached or answers with an error, 5
    the storage settings would lose data (durability refused), 1 anything else (a setting
    that cannot work, a damaged file)."""
    from rhumbatron.errors import (
        DeadLetterError,
        DeadLetterNotFoundError,
        MessagingError,
        ReplayError,
        ScheduleConflictError,
        ScheduleNotFoundError,
        SubscriptionConflictError,
        SubscriptionDisabledError,
        SubscriptionNotFoundError,
        UnsafeStorageError,
    )

    statuses: tuple[tuple[tuple[type[Exception], ...], int], ...] = (
        (
            (DeadLetterNotFoundError, SubscriptionNotFoundError, ScheduleNotFoundError),
            EXIT_NOT_FOUND,
        ),
        (
            (
                DeadLetterError,
                SubscriptionConflictError,
                SubscriptionDisabledError,
                ScheduleConflictError,
                ReplayError,
            ),
            EXIT_CANNOT,
        ),
        ((MessagingError,), EXIT_UNAVAILABLE),
        ((UnsafeStorageError,), EXIT_UNSAFE),
    )
    for kinds, status in statuses:
        if isinstance(exc, kinds):
            return status
    return EXIT_ERROR


def print_json(value: object) -> None:
    """Print ``value`` as indented JSON on stdout: what every command's ``--json`` prints."""
    print(json.dumps(value, indent=2))


def read_json_object(file: str, command: str) -> dict[str, Any] | None:
    """The JSON object in ``file`` (``-``: stdin), or None once it said why there is none."""
    from pathlib import Path

    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
        raw = json.loads(text)
    except (OSError, ValueError) as exc:
        fail(EXIT_ERROR, f"cannot read {file!r} as JSON: {exc}", command=command)
        return None
    if not isinstance(raw, dict):
        fail(EXIT_ERROR, f"{file!r} must hold a JSON object", command=command)
        return None
    return raw


def run_on_runtime(act: Callable[[Rhumbatron], Awaitable[T]]) -> T:
    """Run ``act`` on a runtime of the local state in one event loop, and close the runtime
    there: its NATS connection opens on that loop and must be drained on it."""
    from rhumbatron.runtime.bootstrap import bootstrap

    async def run() -> T:
        app = bootstrap()
        try:
            return await act(app)
        finally:
            await app.close()

    return asyncio.run(run())


def run_registry_command(
    command: str,
    what: str,
    act: Callable[[Rhumbatron], int],
    *,
    not_found: tuple[type[Exception], ...],
    cannot: tuple[type[Exception], ...],
) -> int:
    """Run ``act`` on a runtime of the local state (subscriptions, schedules), answering its
    refusals with the exit statuses: 2 not found, 3 cannot, 1 an invalid value, and any
    other error of the package the status :func:`exit_status_of` gives it."""
    from pydantic import ValidationError

    from rhumbatron.errors import RhumbatronError
    from rhumbatron.runtime.bootstrap import bootstrap

    try:
        app = bootstrap()
        try:
            return act(app)
        finally:
            app.product().close()
    except not_found as exc:
        return fail(EXIT_NOT_FOUND, str(exc), command=command)
    except cannot as exc:
        return fail(EXIT_CANNOT, str(exc), command=command)
    except ValidationError as exc:
        # Location and message only: pydantic's own text quotes the input, maybe a secret.
        problems = "; ".join(
            ".".join(str(part) for part in error["loc"]) + ": " + error["msg"]
            for error in exc.errors(include_url=False)
        )
        return fail(EXIT_ERROR, f"invalid {what}: {problems}", command=command)
    except RhumbatronError as exc:
        return fail(exit_status_of(exc), str(exc), command=command)
