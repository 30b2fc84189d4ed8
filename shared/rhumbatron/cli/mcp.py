"""``rhumbatron mcp [--http]``: the operator API's operations as MCP tools, for ops agents;
``rhumbatron openapi``: the operator API's OpenAPI document, the tools' source."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from typing import Annotated, Any

import typer

from rhumbatron.cli.common import EXIT_ERROR
from rhumbatron.cli.options import JsonAlways

__all__ = ["mcp_command", "openapi", "openapi_command", "serve"]

#: Where the stdio server reads the API token its tools act with.
TOKEN_VARIABLE = "RHUMBATRON_MCP_TOKEN"


def mcp_command(
    http: Annotated[
        bool, typer.Option("--http", help="Serve streamable HTTP at /mcp instead of stdio.")
    ] = False,
    host: Annotated[str, typer.Option(help="--http: the address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="--http: the port to bind.")] = 8081,
    token: Annotated[
        str | None,
        typer.Option(
            help=f"stdio: the API token the tools act with (default: ${TOKEN_VARIABLE}); over "
            "HTTP every request brings its own.",
        ),
    ] = None,
) -> int:
    """Serve the operator API's operations as MCP tools (stdio; --http for streamable HTTP)."""
    return serve(argparse.Namespace(http=http, host=host, port=port, token=token))


def openapi_command(json_: JsonAlways = False) -> int:
    """Print the operator API's OpenAPI document (JSON)."""
    return openapi(argparse.Namespace(json=json_))


def _api() -> tuple[Any, Any, Any]:
    """The runtime, the API over it (in process: no server) and its authenticator."""
    from rhumbatron.api.app import create_api
    from rhumbatron.api.auth import authenticator_from_settings
    from rhumbatron.runtime.bootstrap import bootstrap

    runtime = bootstrap()
    auth = authenticator_from_settings(runtime.settings, runtime.clock)
    return runtime, create_api(runtime, auth, manage_runtime=False), auth


def openapi(args: argparse.Namespace) -> int:
    """Print the OpenAPI document the MCP tools are read from."""
    runtime, api, _ = _api()
    print(json.dumps(api.openapi(), indent=2, sort_keys=True))
    asyncio.run(runtime.close())
    return 0


def serve(args: argparse.Namespace) -> int:
    """Serve the tools until stdin closes (stdio) or until interrupted (``--http``)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        print(
            "rhumbatron mcp: the MCP SDK is not installed; install the mcp extra "
            "(pip install -e '.[mcp]')",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if args.http:
        return _serve_http(args.host, args.port)
    token = args.token or os.environ.get(TOKEN_VARIABLE)
    if not token:
        print(
            f"rhumbatron mcp: no API token: set {TOKEN_VARIABLE} (or pass --token) to a "
            "token of RHUMBATRON_API_TOKENS (or a JWT); its scopes are the tools' scopes",
            file=sys.stderr,
        )
        return EXIT_ERROR
    asyncio.run(_serve_stdio(token))
    return 0


async def _serve_stdio(token: str) -> None:
    from mcp.server.stdio import stdio_server

    from rhumbatron.mcp_server.server import build_server, in_process_caller

    runtime, api, _ = _api()
    caller, ops, client = in_process_caller(api)
    server = build_server(caller, ops, session_token=token)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await client.aclose()
        await runtime.close()


def _serve_http(host: str, port: int) -> int:
    try:
        import uvicorn
    except ImportError:
        print("rhumbatron mcp: uvicorn is not installed (the local extra)", file=sys.stderr)
        return EXIT_ERROR
    from rhumbatron.mcp_server.server import BearerRequired, build_server, in_process_caller

    _runtime, api, auth = _api()
    caller, ops, _client = in_process_caller(api)
    server = build_server(caller, ops)
    app = BearerRequired(server.streamable_http_app(streamable_http_path="/mcp", host=host), auth)
    print(
        f"rhumbatron mcp: http://{host}:{port}/mcp ({len(ops)} tools; a bearer token on "
        "every request)",
        file=sys.stderr,
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0
