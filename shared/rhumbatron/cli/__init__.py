"""The ``rhumbatron`` command, on typer and rich: ``outbox`` (status, requeue), ``streams``,
``dead-letters`` (list, show, retry, dismiss), ``kinds`` (the Event kind grammar),
``subscriptions`` and ``schedules`` (list, show, create, enable, disable, delete),
``capacity`` (the router's ceilings against the volume), ``doctor`` (what the deployment
needs, checked), ``inspect`` (what the state's SQLite files hold), ``reconcile`` (the log
against the outbox), ``replay``, ``views rebuild``, ``api`` (serve the operator API), ``mcp``
and ``openapi``; and ``demo``, ``up`` (the local stack, API and dashboard) and ``invoke``
(one function of ``template.yaml``, here), which run the development package
:mod:`rhumbatron_dev`, imported only when they run (the Lambda layer leaves it out).

One module per command group (:mod:`~rhumbatron.cli.dead_letters`,
:mod:`~rhumbatron.cli.subscriptions`, ..., :mod:`~rhumbatron.cli.dev` for the development
commands), each declaring its typer commands, every option and argument with its help;
:mod:`~rhumbatron.cli.common` holds what they share, :mod:`~rhumbatron.cli.options` the
options several take, :mod:`~rhumbatron.cli.progress` the progress bar of long work. Each
imports the package's heavy parts inside the command it runs, so ``rhumbatron --help``
imports none of them. Every command that prints data takes ``--json``.

Exit status, so scripts can tell the failures apart (decided in one place,
:func:`~rhumbatron.cli.common.exit_status_of`):

===  ==================================================================================
0    done (a Retry that finds its attempt already sent is done: it sends nothing)
1    anything else went wrong (bad settings, an unreadable product file), with the reason
2    no such dead letter, subscription or schedule; or a usage error (a mistyped option:
     the subcommand's usage and the error are shown)
3    the record or run cannot take that action: a closed letter (or one that can only be
     dismissed), a name holding other content, a replay that cannot run as asked
4    NATS (or the log) cannot be reached or answers with an error; nothing is reserved
5    durability is demanded and the deployment cannot give it
     (``RHUMBATRON_REQUIRE_DURABLE_JETSTREAM``)
6    ``reconcile`` found a gap
141  the output's reader went away (``| head``): the command stops without a word, as a
     shell reports a process ended by SIGPIPE
===  ==================================================================================

Every command ends an error in one line on stderr, never a traceback:
``rhumbatron <command>: <why>`` (:class:`~rhumbatron.cli.guard.GuardedCommand`). An error
that is a bug says so, and ``rhumbatron --traceback <command> ...`` shows where it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

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
)
from rhumbatron.cli.guard import EXIT_READER_GONE, GuardedCommand, reader_gone

__all__ = [
    "EXIT_CANNOT",
    "EXIT_ERROR",
    "EXIT_GAP",
    "EXIT_NOT_FOUND",
    "EXIT_READER_GONE",
    "EXIT_UNAVAILABLE",
    "EXIT_UNSAFE",
    "app",
    "main",
]

app = typer.Typer(
    name="rhumbatron",
    help="Operate Rhumbatron: its outboxes, streams, dead letters, subscriptions, schedules, "
    "views and log; serve its API; run the local stack.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Markdown: a docstring's lines join into paragraphs, as in the rest of the package.
    rich_markup_mode="markdown",
)


@app.callback()
def _root(
    traceback: Annotated[
        bool,
        typer.Option("--traceback", help="Show the traceback of an unexpected error (a bug) too."),
    ] = False,
) -> None:
    """Operate Rhumbatron: its outboxes, streams, dead letters, subscriptions, schedules,
    views and log; serve its API; run the local stack."""


def _add(name: str, command: Callable[..., int], **settings: Any) -> None:
    app.command(name, cls=GuardedCommand, **settings)(command)


# The commands in the order ``rhumbatron --help`` lists them.
_add("demo", dev.demo_command, context_settings=dev.LAUNCHER_SETTINGS)
_add("up", dev.up_command, context_settings=dev.LAUNCHER_SETTINGS)
_add("outbox", outbox.outbox_command)
_add("streams", outbox.streams_command)
app.add_typer(dead_letters.app, name="dead-letters")
_add("kinds", kinds.kinds_command)
_add("replay", replay.replay_command)
app.add_typer(views.app, name="views")
_add("capacity", capacity.capacity_command)
_add("doctor", doctor.doctor_command)
_add("inspect", inspect.inspect_command)
_add("reconcile", reconcile.reconcile_command)
app.add_typer(subscriptions.app, name="subscriptions")
app.add_typer(schedules.app, name="schedules")
_add("api", api.api_command)
_add("mcp", mcp.mcp_command)
_add("openapi", mcp.openapi_command)
_add("invoke", dev.invoke_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rhumbatron`` command; returns the exit status (the process's
    arguments when ``argv`` is None)."""
    command = typer.main.get_command(app)
    try:
        # standalone: click answers a usage error with the subcommand's usage and the error
        # (exit status 2), Ctrl-C with 130; each command's own status comes as typer.Exit.
        command.main(args=list(argv) if argv is not None else None, prog_name="rhumbatron")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else EXIT_ERROR
    except BrokenPipeError:  # the help or a usage error into a pipe closed early
        return reader_gone()
    return 0
