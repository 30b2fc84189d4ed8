"""The MCP server (issue #19): every operator API operation is a tool and every tool an
operation — same names, inputs, errors and scopes — driven by the MCP SDK's own client over
stdio and over streamable HTTP, against a real nats-server and real SQLite files."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.mcp_server.tools import DESTRUCTIVE, operations
from rhumbatron.product.dead_letters import command_dead_letter_id, record_command_dead_letter
from rhumbatron.protocol.envelopes import Command
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess, free_port
from workflow_instances import left_running

pytestmark = pytest.mark.integration

TENANT = "tenant-a"
PROJECT = "acme-web"
OPERATOR = "mcp-operator-token-aaaa"
READER = "mcp-reader-token-aaaaaa"
TOKENS: dict[str, dict[str, Any]] = {
    OPERATOR: {
        "tenant": TENANT,
        "scopes": ["dead-letters:read", "dead-letters:write", "audit:read", "commands:send"],
    },
    READER: {"tenant": TENANT, "scopes": ["dead-letters:read"]},
}
RHUMBATRON = str(Path(sys.executable).with_name("rhumbatron"))


@pytest.fixture
def env(tmp_path: Path, nats_server: NatsServerProcess) -> dict[str, str]:
    """The environment ``rhumbatron mcp`` runs with: the test's state, NATS and tokens."""
    return {
        **os.environ,
        "RHUMBATRON_STATE_DIR": str(tmp_path / "state"),
        "RHUMBATRON_NATS_URL": nats_server.url,
        "RHUMBATRON_API_TOKENS": json.dumps(TOKENS),
    }


def failed_wakes(env: dict[str, str], count: int) -> list[str]:
    """``count`` agent.wake commands of the tenant that failed alike, dead-lettered."""
    settings = load_settings(state_dir=Path(env["RHUMBATRON_STATE_DIR"]), nats_url="x")
    app = bootstrap(settings, clock=ManualClock(), alarms=RecordingAlarmSink())
    app.project_root(PROJECT).create_project(Caller(TENANT, "user:ann", "c"), name="Web")
    ids = []
    with app.product().transaction() as db:
        for n in range(count):
            cmd = Command.create(
                command_id=f"cmd_wake_{n}",
                command_type="agent.wake",
                project_id=PROJECT,
                change_id="chg-1",
                task_id=f"tsk-{n}",
                created_at=datetime(2026, 1, 1, tzinfo=UTC),
                payload={"agentId": f"agent-{n}", "reason": "task.ready"},
            )
            record_command_dead_letter(
                db,
                command_id=cmd.command_id,
                command_type=cmd.command_type,
                queue="agent-wakeups",
                attempt=1,
                reason=f"RuntimeError: agent agent-{n} unreachable (delivery 4)",
                body=cmd.to_json().decode(),
                now_s=1_767_225_600 + n,
                tenant_id=TENANT,
                project_id=PROJECT,
                change_id="chg-1",
                task_id=f"tsk-{n}",
            )
            ids.append(command_dead_letter_id(cmd.command_id))
    asyncio.run(app.close())
    return ids


@asynccontextmanager
async def stdio_session(env: dict[str, str], token: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=RHUMBATRON, args=["mcp"], env={**env, "RHUMBATRON_MCP_TOKEN": token}
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def answer(result: Any) -> Any:
    return json.loads(result.content[0].text)


def test_every_operation_is_a_tool_and_every_tool_an_operation(env: dict[str, str]) -> None:
    # GIVEN the OpenAPI document `rhumbatron openapi` prints
    printed = subprocess.run(
        [RHUMBATRON, "openapi"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    document = json.loads(printed.stdout)
    api = {
        op["operationId"]: (method, path, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
    }

    # WHEN an agent lists the tools over stdio
    async def listed() -> list[Any]:
        async with stdio_session(env, OPERATOR) as session:
            return list((await session.list_tools()).tools)

    tools = {tool.name: tool for tool in asyncio.run(listed())}
    # THEN the names are the operations', one for one
    assert set(tools) == set(api)
    for name, tool in tools.items():
        method, path, op = api[name]
        # AND each tool takes the operation's parameters, by the API's names, and its body
        params = {p["name"] for p in op.get("parameters", []) if p["in"] in ("path", "query")}
        expected = params | ({"body"} if "requestBody" in op else set())
        expected |= {"confirm"} if name in DESTRUCTIVE else set()
        assert set(tool.input_schema["properties"]) == expected, name
        # AND a read is marked read-only; a destructive one needs confirm; every one says
        #   which operation it is
        assert tool.annotations.read_only_hint is (method == "get"), name
        assert tool.annotations.destructive_hint is (name in DESTRUCTIVE), name
        assert ("confirm" in tool.input_schema.get("required", [])) is (name in DESTRUCTIVE)
        assert f"(API: {method.upper()} {path}.)" in tool.description


def test_an_agent_triages_a_dead_letter_group_over_stdio_and_the_audit_names_it(
    env: dict[str, str],
) -> None:
    # GIVEN three agent.wake letters failing alike
    letters = failed_wakes(env, 3)

    async def triage() -> dict[str, Any]:
        async with stdio_session(env, OPERATOR) as session:
            # WHEN the agent lists the groups
            groups = answer(await session.call_tool("list_dead_letter_groups", {}))["groups"]
            (group,) = groups
            # AND dismisses without confirming (refused), then retries the group
            unconfirmed = await session.call_tool(
                "dismiss_dead_letter_group", {"groupId": group["id"], "body": {}}
            )
            retried = await session.call_tool(
                "retry_dead_letter_group", {"groupId": group["id"], "body": {}}
            )
            # AND reads the audit
            audit = answer(await session.call_tool("read_audit", {}))
            return {
                "group": group,
                "unconfirmed": (unconfirmed.is_error, answer(unconfirmed)),
                "retried": (retried.is_error, answer(retried)),
                "audit": audit,
            }

    seen = asyncio.run(triage())
    # THEN the group held the three, the dismissal needed a confirmation and changed nothing,
    #   the retry sent all three, and the audit holds the retry by the token's principal
    assert sorted(seen["group"]["letterIds"]) == sorted(letters)
    is_error, refusal = seen["unconfirmed"]
    assert is_error and refusal["error"]["code"] == "confirmation_required"
    is_error, retried = seen["retried"]
    assert not is_error and retried["count"] == 3
    (entry,) = seen["audit"]["items"]
    assert (entry["operation"], entry["outcome"], entry["tenantId"]) == (
        "retry_dead_letter_group",
        "succeeded",
        TENANT,
    )


def test_a_token_without_the_scope_gets_the_apis_refusal_as_the_tools_error(
    env: dict[str, str],
) -> None:
    failed_wakes(env, 1)

    async def as_reader() -> Any:
        async with stdio_session(env, READER) as session:
            return await session.call_tool("read_audit", {})

    result = asyncio.run(as_reader())
    assert result.is_error
    error = answer(result)["error"]
    assert error["code"] == "insufficient_scope" and "audit:read" in error["message"]


@pytest.fixture
def http_server(env: dict[str, str]) -> Iterator[str]:
    """``rhumbatron mcp --http`` on a free loopback port; its endpoint's URL."""
    port = free_port()
    process = subprocess.Popen(
        [RHUMBATRON, "mcp", "--http", "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        banner = process.stderr.readline()  # printed once the app is built
        assert f"http://127.0.0.1:{port}/mcp" in banner, banner
        url = f"http://127.0.0.1:{port}/mcp"
        for _ in range(200):  # bounded: until uvicorn accepts connections
            try:
                httpx2.get(url.replace("/mcp", "/"), timeout=0.2)
                break
            except httpx2.TransportError:
                continue
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_over_http_every_request_needs_a_token_and_the_tools_act_with_it(
    env: dict[str, str], http_server: str
) -> None:
    failed_wakes(env, 2)
    # WHEN a client comes without a token THEN 401 in the API's error model
    bare = httpx2.post(http_server, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert bare.status_code == 401
    assert bare.json()["error"]["code"] == "invalid_token"

    # WHEN an agent with the operator's token lists the tools and the groups
    async def with_token() -> tuple[int, dict[str, Any]]:
        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {OPERATOR}"})
        async with (
            client,
            streamable_http_client(http_server, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = (await session.list_tools()).tools
            groups = answer(await session.call_tool("list_dead_letter_groups", {}))
            return len(tools), groups

    count, groups = asyncio.run(with_token())
    # THEN every operation is there, and the tool acted within the token's tenant
    assert count == len(
        operations(
            json.loads(
                subprocess.run(
                    [RHUMBATRON, "openapi"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=True,
                ).stdout
            )
        )
    )
    assert [g["count"] for g in groups["groups"]] == [2]


PLATFORM_OPERATOR = "mcp-platform-token-aaaa"


def test_an_ops_agent_reads_and_cancels_a_workflow_over_stdio(env: dict[str, str]) -> None:
    # GIVEN a verification left running, and a platform operator's token
    settings = load_settings(state_dir=Path(env["RHUMBATRON_STATE_DIR"]), nats_url="x")
    left_running(settings, ManualClock(), "cand_stuck")
    tokens = {
        **TOKENS,
        PLATFORM_OPERATOR: {"tenant": "*", "scopes": ["changes:read", "changes:write"]},
    }
    env = {**env, "RHUMBATRON_API_TOKENS": json.dumps(tokens)}

    async def cancel() -> dict[str, Any]:
        async with stdio_session(env, PLATFORM_OPERATOR) as session:
            # WHEN the agent lists the running verifications and reads the stuck one
            listed = answer(
                await session.call_tool(
                    "list_workflows", {"workflow": "verification", "status": "running"}
                )
            )
            read = answer(
                await session.call_tool(
                    "read_workflow", {"workflow": "verification", "instanceId": "cand_stuck"}
                )
            )
            # AND cancels it, confirming
            where = {"workflow": "verification", "instanceId": "cand_stuck"}
            cancelled = await session.call_tool(
                "cancel_workflow", {**where, "body": {"reason": "stuck"}, "confirm": True}
            )
            after = answer(await session.call_tool("read_workflow", where))
            return {"listed": listed, "read": read, "cancelled": cancelled, "after": after}

    seen = asyncio.run(cancel())
    # THEN it found the instance waiting on its check step, cancelled it with the reason,
    #   and the instance is cancelled
    assert [i["instanceId"] for i in seen["listed"]["items"]] == ["cand_stuck"]
    assert seen["read"]["pendingStep"] == "check"
    assert not seen["cancelled"].is_error
    assert answer(seen["cancelled"])["done"] is True
    assert seen["after"]["instance"]["status"] == "cancelled"
    assert seen["after"]["instance"]["error"] == "cancelled by an operator: stuck"
