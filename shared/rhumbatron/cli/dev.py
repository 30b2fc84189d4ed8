"""``rhumbatron demo``, ``up`` and ``invoke``: they run the development package
:mod:`rhumbatron_dev` (the demo, the embedded stack, ``template.yaml``'s functions), imported
only when one of them runs: the Lambda layer leaves it out. Without it (or the ``local``
extra it needs) the command says in one line what to install, with exit status 1."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rhumbatron.cli.common import EXIT_ERROR

__all__ = ["LAUNCHERS", "add_invoke_parser", "add_launcher_parsers", "invoke", "launch"]

#: The commands that take their own arguments, parsed by the code they run.
LAUNCHERS = ("demo", "up")


def add_launcher_parsers(sub: Any) -> None:
    sub.add_parser("demo", help="run the sample project's Change lifecycle locally", add_help=False)
    sub.add_parser(
        "up",
        help="the embedded stack, the API and a live dashboard on 127.0.0.1, every role on "
        "its schedule (--root, --port, --duration); Ctrl-C stops",
        add_help=False,
    )


def add_invoke_parser(sub: Any) -> None:
    invoke = sub.add_parser(
        "invoke",
        help="run one function of template.yaml with an event, here (sam local without Docker)",
        description="Run a template function's real handler with an event file against the "
        "embedded stack (nats-server + moto S3). Prints what it mapped and the handler's logs "
        "on stderr, the response on stdout. Exit status: 1 the handler failed or overran its "
        "Timeout, 2 an unknown function, parameter or event file.",
    )
    invoke.add_argument("function", help="the function's logical ID (SweepFunction, ...)")
    invoke.add_argument("--event", "-e", required=True, help="the event's JSON file")
    invoke.add_argument("--template", "-t", default="template.yaml")
    invoke.add_argument("--root", default=".rhumbatron/invoke", help="stack store and /mnt/*")
    invoke.add_argument("--nats-url", help="use this NATS instead of starting nats-server")
    invoke.add_argument("--s3-endpoint-url", help="use this S3 instead of starting moto")
    invoke.add_argument("--parameter", action="append", help="a template parameter NAME=VALUE")
    invoke.add_argument("--env-vars", "-n", help="variable overrides (sam local's JSON file)")
    invoke.add_argument(
        "--keep-stack", action="store_true", help="keep the stack running until Ctrl-C"
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
