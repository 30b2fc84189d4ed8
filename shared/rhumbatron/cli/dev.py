"""``rhumbatron demo``, ``up`` and ``invoke``: they run the development package
:mod:`rhumbatron_dev` (the demo, the embedded stack, ``template.yaml``'s functions), imported
only when one of them runs: the Lambda layer leaves it out. Without it (or the ``local``
extra it needs) the command says in one line what to install, with exit status 1."""

from __future__ import annotations

import argparse
import sys
from typing import Annotated

import typer

from rhumbatron.cli.common import EXIT_ERROR

__all__ = ["LAUNCHER_SETTINGS", "demo_command", "invoke", "invoke_command", "launch", "up_command"]

#: ``demo`` and ``up`` take their own arguments, parsed (and their ``--help`` answered) by the
#: code they run: the CLI passes everything after the command name on as it is.
LAUNCHER_SETTINGS = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "help_option_names": [],
}


def demo_command(ctx: typer.Context) -> int:
    """Run the sample project's Change lifecycle locally (its own options: demo --help)."""
    return launch("demo", list(ctx.args))


def up_command(ctx: typer.Context) -> int:
    """The embedded stack, the API and a live dashboard on 127.0.0.1, every role on its
    schedule (--root, --port, --duration; up --help); Ctrl-C stops."""
    return launch("up", list(ctx.args))


def invoke_command(
    function: Annotated[
        str, typer.Argument(help="The function's logical ID (SweepFunction, ...).")
    ],
    *,
    event: Annotated[str, typer.Option("--event", "-e", help="The event's JSON file.")],
    template: Annotated[
        str, typer.Option("--template", "-t", help="The SAM template.")
    ] = "template.yaml",
    root: Annotated[
        str, typer.Option(help="The stack's store and the functions' /mnt/* folders.")
    ] = ".rhumbatron/invoke",
    nats_url: Annotated[
        str | None, typer.Option(help="Use this NATS instead of starting nats-server.")
    ] = None,
    s3_endpoint_url: Annotated[
        str | None, typer.Option(help="Use this S3 instead of starting moto.")
    ] = None,
    parameter: Annotated[
        list[str] | None,
        typer.Option(help="A template parameter NAME=VALUE (repeatable)."),
    ] = None,
    env_vars: Annotated[
        str | None,
        typer.Option("--env-vars", "-n", help="Variable overrides (sam local's JSON file)."),
    ] = None,
    keep_stack: Annotated[
        bool, typer.Option("--keep-stack", help="Keep the stack running until Ctrl-C.")
    ] = False,
) -> int:
    """Run one function of template.yaml with an event, here (sam local without Docker).

    The real handler runs against the embedded stack (nats-server + moto S3); what it mapped
    and the handler's logs go to stderr, the response to stdout. Exit status: 1 the handler
    failed or overran its Timeout, 2 an unknown function, parameter or event file.
    """
    return invoke(
        argparse.Namespace(
            command="invoke",
            function=function,
            event=event,
            template=template,
            root=root,
            nats_url=nats_url,
            s3_endpoint_url=s3_endpoint_url,
            parameter=parameter,
            env_vars=env_vars,
            keep_stack=keep_stack,
        )
    )


def launch(command: str, rest: list[str]) -> int:
    """Run ``demo`` or ``up`` (``command``) with the arguments after it."""
    if command == "demo":
        try:
            from rhumbatron_dev.demo import main as demo_main
        except ModuleNotFoundError as exc:
            return _dev_package_missing(command, exc)
        return demo_main(rest)
    try:
        from rhumbatron_dev.local.up import main as up_main
    except ModuleNotFoundError as exc:
        return _dev_package_missing(command, exc)
    return up_main(rest)


def invoke(args: argparse.Namespace) -> int:
    try:
        from rhumbatron_dev.local.invoke import run_command
    except ModuleNotFoundError as exc:
        return _dev_package_missing(args.command, exc)
    return run_command(args)


def _dev_package_missing(command: str, exc: ModuleNotFoundError) -> int:
    """Exit status 1 (``EXIT_ERROR``), with one line on stderr naming what to install, when
    ``rhumbatron <command>`` cannot import the development code it runs: ``demo``, ``up`` and
    ``invoke`` run :mod:`rhumbatron_dev` (the embedded stack, the demo), which the Lambda
    layer leaves out and which needs the ``local`` extra."""
    missing = exc.name or str(exc)
    if missing.partition(".")[0] == "rhumbatron_dev":
        missing = "rhumbatron_dev"
    print(
        f"rhumbatron {command}: {missing} is not installed; this command runs the "
        "development package rhumbatron_dev, which needs the local extra: install both from "
        "a checkout (pip install -e '.[local]', or make venv)",
        file=sys.stderr,
    )
    return EXIT_ERROR
