"""``docs/operations.md`` lists every operation of the ops surface — its MCP tool, route,
scope, token, what it changes and its audit — as the API itself says (issue #19)."""

from __future__ import annotations

from pathlib import Path

from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.core.settings import Settings
from rhumbatron.mcp_server.catalogue import BEGIN, END, catalogue, render
from rhumbatron.mcp_server.tools import DESTRUCTIVE, operations
from rhumbatron.runtime.bootstrap import bootstrap

OPERATIONS_DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_table_in_the_docs_is_the_one_the_api_gives() -> None:
    text = OPERATIONS_DOC.read_text(encoding="utf-8")
    table = text.partition(BEGIN)[2].partition(END)[0].strip()
    assert table == render(catalogue()), (
        "docs/operations.md's table is out of date: run "
        "`.venv/bin/python -m rhumbatron.mcp_server.catalogue --write`"
    )


def test_the_catalogue_holds_every_operation_and_tool_with_its_scope(
    offline_settings: Settings,
) -> None:
    # GIVEN the API's OpenAPI document and the MCP tools read off it
    api = create_api(bootstrap(offline_settings), StaticTokenAuth({}))
    tools = {op.name: (op.method, op.path) for op in operations(api.openapi())}
    rows = catalogue()
    # THEN the catalogue has each, once, with the same route
    assert {row.tool: (row.method, row.path) for row in rows} == tools
    assert len(rows) == len(tools)
    # AND every operation but the health check needs exactly one scope; the destructive
    #   ones are the tools that need confirm
    assert all(len(row.scopes) == 1 for row in rows if row.tool != "health")
    assert {row.tool for row in rows if "destructive" in row.changes} == set(DESTRUCTIVE)
    assert {row.tool for row in rows if row.platform} == {
        "replay",
        "list_consumers",
        "read_capacity",
        "read_reconciliation",
        "repair_log",
        "pause_consumer",
        "resume_consumer",
        "list_workflows",
        "read_workflow",
        "cancel_workflow",
        "terminate_workflow",
        "redrive_workflow",
    }
