"""The operator API as an MCP server, for ops agents: one tool per API operation.

The tools are read off the API's own OpenAPI document and each call goes through the API
itself, in process, with the caller's bearer token (:mod:`.tools`): a tool has the
operation's name, inputs, errors and scopes because it *is* the operation. ``rhumbatron
mcp`` serves it over stdio (the token from ``RHUMBATRON_MCP_TOKEN``) or, with ``--http``,
over streamable HTTP, where every request carries its own bearer token (:mod:`.server`).
"""

from rhumbatron.mcp_server.tools import DESTRUCTIVE, Operation, ToolCaller, operations

__all__ = ["DESTRUCTIVE", "Operation", "ToolCaller", "operations"]
