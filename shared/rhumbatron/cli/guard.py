"""The one place a command's failure becomes an exit status: :class:`GuardedCommand`.

Every command of the ``rhumbatron`` app is declared with ``cls=GuardedCommand``. It runs the
command and turns what the command raised into one line on stderr naming the command
(``rhumbatron <command>: <why>``) and the documented exit status
(:func:`~rhumbatron.cli.common.exit_status_of`), never a traceback:

* an error Rhumbatron raises on purpose (:class:`~rhumbatron.errors.RhumbatronError`): its
  message, with the status of its kind (4 NATS, 5 durability, 2 not found, ...);
* an error of nats-py we did not turn into our own (JetStream off on the server, say): 4;
* an ``OSError`` (a state directory that cannot be made or written): 1;
* the output's reader gone (``| head``): nothing more is written, exit status 141;
* anything else is a bug: one line saying so, 1, and the traceback only with ``--traceback``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import typer
from typer.core import TyperCommand
from typer.exceptions import TyperException

from rhumbatron.cli.common import EXIT_ERROR, EXIT_UNAVAILABLE, exit_status_of, fail

__all__ = ["EXIT_READER_GONE", "GuardedCommand", "reader_gone"]

#: The exit status of a command whose output's reader went away (``| head``): a shell's for a
#: process ended by SIGPIPE (128 + 13).
EXIT_READER_GONE = 141


def reader_gone() -> int:
    """The output's reader closed the pipe: no traceback, and nothing more written. stdout
    points at /dev/null from here, so the interpreter's last flush at exit cannot fail too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_READER_GONE


class GuardedCommand(TyperCommand):
    """A command whose callback returns its exit status, and whose failures end in one line
    on stderr and an exit status (see the module docstring)."""

    def invoke(self, ctx: Any) -> Any:
        command = ctx.command_path.partition(" ")[2] or ctx.command_path
        # nats-py logs every failed connect attempt with a traceback; the command says in one
        # line that NATS did not answer, so the library's retries are only noise here.
        logging.getLogger("nats").setLevel(logging.CRITICAL)
        try:
            status = super().invoke(ctx)
            sys.stdout.flush()  # a reader gone (``| head``) shows here, not at exit
        except BrokenPipeError:
            status = reader_gone()
        except (TyperException, typer.Exit, typer.Abort):
            raise  # a usage error (the command's usage, status 2) or an exit asked for
        except Exception as exc:
            status = _failed(exc, command, traceback=_wants_traceback(ctx))
        if status:
            raise typer.Exit(status)
        return status


def _failed(exc: Exception, command: str, *, traceback: bool) -> int:
    """Say in one line why ``command`` failed; the exit status that says it."""
    from rhumbatron.errors import RhumbatronError

    if isinstance(exc, RhumbatronError):
        return fail(exit_status_of(exc), str(exc), command=command)
    if isinstance(exc, OSError):  # a state directory that cannot be made or written, say
        return fail(EXIT_ERROR, f"{type(exc).__name__}: {exc}", command=command)
    if type(exc).__module__.partition(".")[0] == "nats":
        # An answer of nats-py we did not turn into our own error is NATS's, not a bug.
        return fail(
            EXIT_UNAVAILABLE,
            f"NATS answered with an error: {type(exc).__name__}: {exc}",
            command=command,
        )
    if traceback:
        raise exc
    return fail(
        EXIT_ERROR,
        f"unexpected {type(exc).__name__}: {exc} (a bug: run `rhumbatron --traceback "
        f"{command} ...` to see where, and report it)",
        command=command,
    )


def _wants_traceback(ctx: Any) -> bool:
    return bool(ctx.find_root().params.get("traceback"))
