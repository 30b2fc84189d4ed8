"""``rhumbatron api``: serve the operator HTTP API with uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import sys
from enum import StrEnum
from typing import Annotated

import typer

from rhumbatron.cli.common import EXIT_ERROR

__all__ = ["api_command", "serve"]


class LogLevel(StrEnum):
    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    DEBUG = "debug"


def api_command(
    host: Annotated[str, typer.Option(help="The address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The port to bind.")] = 8080,
    log_level: Annotated[LogLevel, typer.Option(help="uvicorn's log level.")] = LogLevel.INFO,
) -> int:
    """Serve the operator HTTP API with uvicorn until Ctrl-C."""
    return serve(argparse.Namespace(host=host, port=port, log_level=log_level.value))


def serve(args: argparse.Namespace) -> int:
    """Serve the operator API with uvicorn until interrupted. Exit status 1 (``EXIT_ERROR``),
    with one line on stderr naming the variable, when a setting cannot work (a
    ``RHUMBATRON_API_TOKENS`` that is not a JSON object of grants, ...): checked before any
    port is bound."""
    try:
        import uvicorn
    except ImportError:
        print(
            "rhumbatron api: uvicorn is not installed; install the local extra "
            "(pip install -e '.[local]')",
            file=sys.stderr,
        )
        return EXIT_ERROR
    from rhumbatron.api.app import create_api
    from rhumbatron.api.auth import authenticator_from_settings
    from rhumbatron.errors import RhumbatronError
    from rhumbatron.runtime.bootstrap import bootstrap

    try:
        app = bootstrap()
        api = create_api(app, authenticator_from_settings(app.settings, app.clock))
    except RhumbatronError as exc:
        print(f"rhumbatron api: {exc}", file=sys.stderr)
        return EXIT_ERROR
    settings = app.settings
    if settings.api_auth_mode == "static" and not settings.api_tokens:
        print(
            "rhumbatron api: RHUMBATRON_API_TOKENS is empty, so every operation but /health is "
            "refused (401); set it to JSON such as "
            '\'{"<token>": {"tenant": "*", "scopes": ["dead-letters:read", '
            '"dead-letters:write", "commands:send"]}}\'',
            file=sys.stderr,
        )
    print(
        f"rhumbatron api: http://{args.host}:{args.port} (OpenAPI at /openapi.json, docs at "
        f"/docs), {settings.api_auth_mode} bearer tokens, NATS {settings.nats_url}, state "
        f"{settings.state_dir}",
        file=sys.stderr,
    )
    # The app's lifespan ensures the streams at start-up and drains NATS at shutdown.
    # uvicorn shuts down gracefully on Ctrl-C, then raises the signal again; the operator
    # asked for the stop, so it is no error and needs no traceback.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.run(api, host=args.host, port=args.port, log_level=args.log_level)
    return 0
