"""The MCP server over the operator API: stdio (one token for the session) and streamable
HTTP (a bearer token on every request, checked by the API's own authenticator).

Each tool call is the API operation it names, sent to the API in process
(:class:`~rhumbatron.mcp_server.tools.ToolCaller`): over HTTP with the request's own
``Authorization`` header, over stdio with the token the server was started with. So a
token without an operation's scope gets the API's 403 as the tool's error, and every
mutation is audited under the token's principal, exactly as over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import httpx

from rhumbatron.mcp_server.tools import Operation, ToolCaller, operations

if TYPE_CHECKING:
    from fastapi import FastAPI
    from mcp.server.lowlevel import Server
    from starlette.types import ASGIApp, Receive, Scope, Send

    from rhumbatron.api.auth import Authenticator

__all__ = ["INSTRUCTIONS", "BearerRequired", "build_server", "in_process_caller"]

INSTRUCTIONS = (
    "Rhumbatron's operator tools: every tool is one operation of the operator API, with the "
    "same name, inputs, errors and scopes. Start with list_dead_letter_groups, "
    "list_consumers and read_audit to see the state; read-only tools change nothing; a "
    "destructive tool needs confirm: true. Errors come back in the API's error model "
    '({"error": {"code", "message", "field"}}): read the message, it says what to do.'
)


def in_process_caller(api: FastAPI) -> tuple[ToolCaller, list[Operation], httpx.AsyncClient]:
    """The API's operations and a caller that sends them to ``api`` in process (close the
    client when done)."""
    ops = operations(api.openapi())
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://rhumbatron.local"
    )
    return ToolCaller(client, {op.name: op for op in ops}), ops, client


def build_server(
    caller: ToolCaller,
    ops: list[Operation],
    *,
    session_token: str | None = None,
    lifespan: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None,
) -> Server[Any]:
    """The MCP server of ``ops``. A call's token is the HTTP request's bearer token, else
    ``session_token`` (stdio)."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    tools = [
        types.Tool(
            name=op.name,
            title=op.title,
            description=op.description,
            inputSchema=dict(op.input_schema),
            annotations=types.ToolAnnotations(
                title=op.title,
                readOnlyHint=op.read_only,
                destructiveHint=op.destructive,
                idempotentHint=op.read_only or op.method in ("PUT", "DELETE"),
                openWorldHint=False,
            ),
        )
        for op in ops
    ]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        token = _bearer_of(getattr(ctx, "request", None)) or session_token
        is_error, answer = await caller.call(params.name, params.arguments, token)
        structured = answer if isinstance(answer, dict) else {"items": answer}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(answer, indent=2))],
            structuredContent=structured,
            isError=is_error,
        )

    extra: dict[str, Any] = {} if lifespan is None else {"lifespan": lifespan}
    return Server(
        "rhumbatron",
        version="1",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        **extra,
    )


def _bearer_of(request: Any) -> str | None:
    """The bearer token of an HTTP request (None over stdio, or without one)."""
    if request is None:
        return None
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class BearerRequired:
    """ASGI middleware in front of the streamable HTTP endpoint: a request without a bearer
    token the API's authenticator accepts is answered 401 in the API's error model, before
    the MCP layer sees it. (Each tool call is then checked again, scope by scope, by the
    API operation it is.)"""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        from rhumbatron.errors import AuthenticationError

        token = _bearer_of(Request(scope))
        message = "this endpoint needs an Authorization: Bearer <token> header"
        if token is not None:
            try:
                self.authenticator.authenticate(token)
            except AuthenticationError as exc:
                message = str(exc)
            else:
                await self.app(scope, receive, send)
                return
        refusal = JSONResponse(
            {"error": {"code": "invalid_token", "message": message, "field": None}},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
        await refusal(scope, receive, send)
