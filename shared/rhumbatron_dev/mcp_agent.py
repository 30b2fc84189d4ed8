"""The demo's ops agent: the MCP SDK's own client, connected in process to the MCP server
over a running operator API (``rhumbatron.mcp_server``), each tool call printed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rhumbatron.mcp_server.server import build_server
from rhumbatron.mcp_server.tools import ToolCaller, operations

if TYPE_CHECKING:
    import httpx
    from mcp import Client

__all__ = ["McpAgent"]


@dataclass
class McpAgent:
    """Calls the API's operations as MCP tools and says each call on ``say``."""

    client: Client
    say: Callable[[str], None]
    tools: int = 0

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, http: httpx.AsyncClient, say: Callable[[str], None]
    ) -> AsyncIterator[McpAgent]:
        """An agent over the API ``http`` talks to (its base URL and bearer token)."""
        from mcp import Client

        ops = operations((await http.get("/openapi.json")).json())
        server = build_server(ToolCaller(http, {op.name: op for op in ops}), ops)
        async with Client(server) as client:
            agent = cls(client, say)
            agent.tools = len((await client.list_tools()).tools)
            yield agent

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """The tool's answer (the API's JSON); raises RuntimeError with it on a tool error."""
        import mcp_types

        result = await self.client.call_tool(name, arguments)
        first = result.content[0]
        if not isinstance(first, mcp_types.TextContent):
            raise RuntimeError(f"tool {name} answered {type(first).__name__}, not text")
        answer = json.loads(first.text)
        shown = json.dumps(arguments, sort_keys=True) if arguments else ""
        self.say(f"  mcp tool {name}({shown}) -> {'error' if result.is_error else 'ok'}")
        if result.is_error:
            raise RuntimeError(f"tool {name} answered an error: {answer}")
        return answer
