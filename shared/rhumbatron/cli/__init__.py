"""The ``rhumbatron`` command: ``outbox`` (inspect, requeue), ``streams``, ``dead-letters``
(list, show, retry, dismiss), ``kinds`` (the Event kind grammar), ``subscriptions`` and
``schedules`` (list, show, create, enable, disable, delete), ``capacity`` (the router's
ceilings against the volume), ``doctor`` (what the deployment needs, checked),
``inspect`` (what the state's SQLite files hold),
``reconcile`` (the log against the outbox), ``api`` (serve the operator API);
and ``demo``, ``up`` (the local stack, API and dashboard) and ``invoke`` (one function of
``template.yaml``, here), which run the development package :mod:`rhumbatron_dev`, imported
only when they run (the Lambda layer leaves it out).

One module per command group (:mod:`~rhumbatron.cli.dead_letters`,
:mod:`~rhumbatron.cli.subscriptions`, ..., :mod:`~rhumbatron.cli.dev` for the development
commands), each adding its own subcommands to the parser; :mod:`~rhumbatron.cli.common`
holds what they share. Each imports what it needs inside the command it runs, so
``rhumbatron --help`` imports none of the package's heavy parts.

``dead-letters`` acts on the local state directory and NATS (``RHUMBATRON_*`` settings)
through the same operator functions as the HTTP API, as a platform operator: it sees every
tenant's letters. Exit status, so scripts can tell the failures apart:

==  =====================================================================================
0   done (a Retry that finds its attempt already sent is done: it sends nothing)
1   anything else went wrong (bad settings, an unreadable product file), with the reason
2   no dead letter with that ID (or a usage error, as argparse reports it)
3   the letter cannot take that action: it is closed, or it can only be dismissed
4   NATS did not take the Retry (down, or JetStream refused it); nothing is reserved
==  =====================================================================================

Every command ends an error it does not handle itself in one line on stderr, never a
traceback: ``rhumbatron <command>: <why>``, with exit status 4 when NATS (or the log) cannot
be reached or answers with an error, 5 when durability is demanded and the deployment cannot
give it (``RHUMBATRON_REQUIRE_DURABLE_JETSTREAM``), and 1 for a setting that cannot work, a
file that cannot be written, or any other error Rhumbatron raises on purpose. A command whose
reader goes away (``| head``) stops without a word, with exit status 141, as a shell reports
a process ended by SIGPIPE.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from rhumbatron.cli import (
    api,
    capacity,
    dead_letters,
    dev,
    doctor,
    inspect,
    kinds,
    mcp,
    outbox,
    reconcile,
    replay,
    schedules,
    subscriptions,
    views,
)
from rhumbatron.cli.common import (
    EXIT_CANNOT,
    EXIT_ERROR,
    EXIT_GAP,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_UNSAFE,
    exit_status_of,
    fail,
)

__all__ = [
    "EXIT_CANNOT",
    "EXIT_ERROR",
    "EXIT_GAP",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "EXIT_UNSAFE",
    "main",
]

#: What runs each command but ``demo`` and ``up`` (:data:`~rhumbatron.cli.dev.LAUNCHERS`).
_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "outbox": outbox.outbox,
    "streams": outbox.streams,
    "dead-letters": dead_letters.dead_letters,
    "kinds": kinds.kinds,
    "replay": replay.replay,
    "views": views.views,
    "capacity": capacity.capacity,
    "doctor": doctor.doctor,
    "inspect": inspect.inspect,
    "reconcile": reconcile.reconcile,
    "subscriptions": subscriptions.subscriptions,
    "schedules": schedules.schedules,
    "api": api.serve,
    "mcp": mcp.serve,
    "openapi": mcp.openapi,
    "invoke": dev.invoke,
}


def _parser() -> argparse.ArgumentParser:
    """The command's parser; the subcommands in the order ``rhumbatron --help`` lists them."""
    parser = argparse.ArgumentParser(prog="rhumbatron")
    sub = parser.add_subparsers(dest="command", required=True)
    dev.add_launcher_parsers(sub)
    outbox.add_outbox_parser(sub)
    outbox.add_streams_parser(sub)
    dead_letters.add_parser(sub)
    kinds.add_parser(sub)
    replay.add_parser(sub)
    views.add_parser(sub)
    capacity.add_parser(sub)
    doctor.add_parser(sub)
    inspect.add_parser(sub)
    reconcile.add_parser(sub)
    subscriptions.add_parser(sub)
    schedules.add_parser(sub)
    api.add_parser(sub)
    mcp.add_parser(sub)
    dev.add_invoke_parser(sub)
    return parser


#: The exit status of a command whose output's reader went away (``| head``): a shell's for a
#: process ended by SIGPIPE (128 + 13).
EXIT_READER_GONE = 141


def _reader_gone() -> int:
    """The output's reader closed the pipe: no traceback, and nothing more written. stdout
    points at /dev/null from here, so the interpreter's last flush at exit cannot fail too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_READER_GONE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rhumbatron`` command; returns the exit status."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in dev.LAUNCHERS:
        return dev.launch(args.command, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from rhumbatron.errors import RhumbatronError

    try:
        status = _COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader gone (``| head``) shows here, not at exit
        return status
    except BrokenPipeError:
        return _reader_gone()
    except RhumbatronError as exc:
        return fail(exit_status_of(exc), str(exc), command=args.command)
    except OSError as exc:  # a state directory that cannot be made or written, say
        return fail(EXIT_ERROR, f"{type(exc).__name__}: {exc}", command=args.command)
    except Exception as exc:
        # An answer of nats-py we did not turn into our own error (JetStream off on the
        # server, say) is NATS's, not a bug of this command: one line, not a traceback.
        if type(exc).__module__.partition(".")[0] != "nats":
            raise
        return fail(
            EXIT_UNAVAILABLE,
            f"NATS answered with an error: {type(exc).__name__}: {exc}",
            command=args.command,
        )
