"""Agent IDs are a tenant's own (issue #21): the registry's key is ``(tenant_id, agent_id)``.

Two tenants may each register ``agent-7`` and never see or affect each other: another
tenant's registration neither blocks nor receives this tenant's wakes, and no answer says
whether another tenant has an agent of some ID — a registration answers as for a fresh ID,
a callback by another tenant is the 404 of a missing task. A product database made when the
ID was one namespace is migrated in place at open, every row keeping its tenant. And the
registry and the API take one agent ID alphabet, ``protocol.values.AGENT_ID``: no ``.``,
``..`` or ``-x``.

Everything runs on the real app (FastAPI's TestClient over a runtime on a real nats-server),
the real registry on the real product database, and real HTTP receivers on loopback.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from api.conftest import make_client, make_runtime
from api.support import OPERATOR, OTHER_OPERATOR, OTHER_TENANT, PROJECT, TENANT, bearer
from rhumbatron.agents.registry import AgentKind, AgentRegistry
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import AgentRegistryError
from rhumbatron.runtime.bootstrap import Rhumbatron
from rhumbatron_dev.local.loop import LocalLoop

pytestmark = pytest.mark.integration

A, B = bearer(OPERATOR), bearer(OTHER_OPERATOR)
AGENT = "agent-7"
#: How the product database created ``agents`` before the key held the tenant.
OLD_AGENTS_SCHEMA = """
CREATE TABLE agents (
    agent_id   TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('scripted', 'webhook')),
    url        TEXT,
    secrets    TEXT NOT NULL DEFAULT '[]',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX agents_by_tenant ON agents (tenant_id, agent_id);
"""


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    """The API tests' settings, with the loopback receivers allowed as webhook hosts."""
    return api_settings.model_copy(update={"webhook_allowed_hosts": ("127.0.0.1",)})


@dataclass
class Receiver:
    """A tenant's webhook endpoint on 127.0.0.1: it takes every wake (204) and keeps it."""

    wakes: list[bytes] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    """Tenant A's receiver and tenant B's, each its own HTTP server."""
    found = (Receiver(), Receiver())
    servers = []
    for receiver in found:

        class Handler(BaseHTTPRequestHandler):
            taker = receiver

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                self.taker.wakes.append(self.rfile.read(length))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        receiver.url = f"http://127.0.0.1:{server.server_address[1]}/wake"
        servers.append(server)
    yield found
    for server in servers:
        server.shutdown()
        server.server_close()


def _register(client: Any, token: dict[str, str], agent_id: str, url: str | None = None) -> Any:
    body = {"agentId": agent_id, "kind": "scripted" if url is None else "webhook"}
    if url is not None:
        body["url"] = url
    return client.post("/agents", json=body, headers=token)


def _change(client: Any, agent_id: str = AGENT) -> str:
    """Tenant A's Change with one Task, t1, for ``agent_id``."""
    task = {"taskId": "t1", "title": "Schema", "agentId": agent_id}
    request = {"clientRequestId": "req-1", "title": "Gift cards", "tasks": [task]}
    answer = client.post(f"/projects/{PROJECT}/changes", json=request, headers=A)
    assert answer.status_code == 201, answer.text
    change_id: str = answer.json()["changeId"]
    return change_id


def _play_until(client: Any, runtime: Rhumbatron, done: Any) -> None:
    """Every role of the local loop, on the app's own event loop (the TestClient's portal:
    the runtime's NATS connection lives there), until ``done()``."""

    async def play() -> bool:
        await runtime.ensure_streams()
        return await LocalLoop(runtime).run_until(done, max_idle_rounds=40)

    assert client.portal.call(play), "the local loop went quiet before it was done"


def _task(client: Any, change_id: str) -> dict[str, Any]:
    change = client.get(f"/projects/{PROJECT}/changes/{change_id}", headers=A).json()
    [task] = change["tasks"]
    assert isinstance(task, dict)
    return task


def test_another_tenant_claiming_the_agent_id_of_a_change_neither_blocks_nor_receives_its_wake(
    client: Any, runtime: Rhumbatron, receivers: tuple[Receiver, Receiver]
) -> None:
    mine, theirs = receivers
    # GIVEN tenant A's Change whose Task names agent-7, which A has not registered yet
    change_id = _change(client)
    # WHEN tenant B registers agent-7 first, as a webhook at its own URL
    squatted = _register(client, B, AGENT, theirs.url)
    # AND tenant A then registers its own agent-7 at its URL
    registered = _register(client, A, AGENT, mine.url)
    # THEN both are registrations of a fresh agent ID: 201, each of its own tenant
    assert (squatted.status_code, registered.status_code) == (201, 201), registered.text
    assert squatted.json()["tenantId"] == OTHER_TENANT
    assert registered.json()["tenantId"] == TENANT
    # WHEN the dispatcher wakes the Task's agent
    _play_until(client, runtime, lambda: bool(mine.wakes))
    # THEN tenant A's own agent-7 got the wake, and tenant B's URL received nothing
    assert len(mine.wakes) == 1 and b'"agentId":"agent-7"' in mine.wakes[0]
    assert change_id.encode() in mine.wakes[0]
    assert theirs.wakes == []
    # AND A's Task is assigned to its agent, not blocked
    task = _task(client, change_id)
    assert (task["status"], task["agentId"]) == ("assigned", AGENT)


def test_registering_an_agent_id_another_tenant_uses_answers_as_for_a_fresh_id(
    client: Any, receivers: tuple[Receiver, Receiver]
) -> None:
    mine, theirs = receivers
    # GIVEN tenant A's webhook agent agent-7
    assert _register(client, A, AGENT, mine.url).status_code == 201
    # WHEN tenant B registers agent-7, and agent-8 that nobody uses, the same way
    used = _register(client, B, AGENT, theirs.url)
    fresh = _register(client, B, "agent-8", theirs.url)
    # THEN both answers are the same but for the ID and the generated secret: 201, B's own
    assert (used.status_code, fresh.status_code) == (201, 201), used.text
    ignored = {"agentId", "secret"}
    assert {k: v for k, v in used.json().items() if k not in ignored} == {
        k: v for k, v in fresh.json().items() if k not in ignored
    }
    assert used.json()["secret"].startswith("whsec_")
    # AND nothing in it speaks of tenant A
    assert TENANT not in used.text and mine.url not in used.text
    # AND tenant A's agent-7 is untouched: its URL, its secret
    again = _register(client, A, AGENT, mine.url)
    assert (again.status_code, again.json()["url"], again.json()["secret"]) == (
        200,
        mine.url,
        None,
    )


def test_a_callback_by_another_tenant_as_the_agent_of_a_task_is_the_404_of_a_missing_task(
    client: Any, runtime: Rhumbatron, receivers: tuple[Receiver, Receiver]
) -> None:
    mine, theirs = receivers
    # GIVEN tenant A's Task t1, held by A's agent-7, and tenant B's own agent-7
    assert _register(client, A, AGENT, mine.url).status_code == 201
    change_id = _change(client)
    _play_until(client, runtime, lambda: bool(mine.wakes))
    assert _register(client, B, AGENT, theirs.url).status_code == 201
    report = {"agentId": AGENT}
    task = f"/projects/{PROJECT}/changes/{change_id}/tasks/t1"
    # WHEN tenant B reports as agent-7 on A's Task, on a Task A's Change lacks, in no project
    on_theirs = client.post(f"{task}/start", json=report, headers=B)
    no_task = client.post(
        f"/projects/{PROJECT}/changes/{change_id}/tasks/t9/start", json=report, headers=B
    )
    no_project = client.post(
        f"/projects/nowhere/changes/{change_id}/tasks/t1/start", json=report, headers=B
    )
    # THEN all three are the same 404, and none names tenant A
    answers = [on_theirs, no_task, no_project]
    assert [a.status_code for a in answers] == [404, 404, 404], on_theirs.text
    assert len({a.json()["error"]["code"] for a in answers}) == 1
    assert all(TENANT not in a.text for a in answers)
    # AND A's Task is still A's agent's, not started by B
    assert (_task(client, change_id)["status"], _task(client, change_id)["agentId"]) == (
        "assigned",
        AGENT,
    )


def test_a_callback_as_an_agent_only_another_tenant_has_answers_as_for_an_unregistered_agent(
    client: Any, runtime: Rhumbatron, receivers: tuple[Receiver, Receiver]
) -> None:
    mine, theirs = receivers
    # GIVEN tenant A's Task held by A's agent-7, and agent-9 that only tenant B registered
    assert _register(client, A, AGENT, mine.url).status_code == 201
    change_id = _change(client)
    _play_until(client, runtime, lambda: bool(mine.wakes))
    assert _register(client, B, "agent-9", theirs.url).status_code == 201
    task = f"/projects/{PROJECT}/changes/{change_id}/tasks/t1"
    # WHEN tenant A reports as agent-9, and as agent-0 that nobody registered
    b_only = client.post(f"{task}/start", json={"agentId": "agent-9"}, headers=A)
    nobody = client.post(f"{task}/start", json={"agentId": "agent-0"}, headers=A)
    # THEN both get the same answer (neither holds the Task), saying nothing of tenant B
    assert b_only.status_code == nobody.status_code == 409, b_only.text
    assert b_only.json()["error"]["code"] == nobody.json()["error"]["code"] == "not_holder"
    assert b_only.json()["error"]["message"] == nobody.json()["error"]["message"].replace(
        "agent-0", "agent-9"
    )
    assert OTHER_TENANT not in b_only.text


def test_the_migration_from_the_global_agent_id_keeps_every_row_and_its_tenant(
    api_settings: Settings, clock: ManualClock
) -> None:
    # GIVEN a product database whose agents table was keyed by the agent ID alone
    api_settings.state_dir.mkdir(parents=True, exist_ok=True)
    path = api_settings.state_dir / "product.sqlite"
    rows = [
        ("agent-7", TENANT, "webhook", "http://127.0.0.1:9/a", '["whsec_' + "A" * 44 + '"]'),
        ("agent-8", OTHER_TENANT, "scripted", None, "[]"),
        ("reviewer.1", TENANT, "scripted", None, "[]"),
    ]
    old = sqlite3.connect(path)
    old.executescript(OLD_AGENTS_SCHEMA)
    old.executemany(
        "INSERT INTO agents VALUES (?, ?, ?, ?, ?, '2026-01-01T00:00:00+00:00', "
        "'2026-01-02T00:00:00+00:00')",
        rows,
    )
    old.execute("PRAGMA user_version = 12345")
    old.commit()
    old.close()
    # WHEN the runtime opens it, then opens it again
    for _ in range(2):
        runtime = make_runtime(api_settings, clock)
        registry = runtime.lifecycle().registry
        # THEN every row is there, under its own tenant, with all its values
        for agent_id, tenant, kind, url, secrets in rows:
            record = registry.get(tenant, agent_id)
            assert record is not None, agent_id
            assert (record.tenant_id, record.kind, record.url) == (tenant, AgentKind(kind), url)
            assert list(record.secrets) == ([] if secrets == "[]" else ["whsec_" + "A" * 44])
            assert record.created_at.isoformat() == "2026-01-01T00:00:00+00:00"
            assert record.updated_at.isoformat() == "2026-01-02T00:00:00+00:00"
        assert [r.agent_id for r in registry.list(TENANT)] == ["agent-7", "reviewer.1"]
        assert [r.agent_id for r in registry.list(OTHER_TENANT)] == ["agent-8"]
        # AND the key is (tenant, agent), with no table or index of the old shape left over
        db = runtime.product().connection
        key = {row[1]: row[5] for row in db.execute("PRAGMA table_info(agents)") if row[5]}
        assert key == {"tenant_id": 1, "agent_id": 2}
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert not {n for n in names if n.startswith("agents") and n != "agents"}
        # ... and the columns keep their constraints: a kind the CHECK does not list is refused
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            db.execute(
                "INSERT INTO agents (tenant_id, agent_id, kind, created_at, updated_at) "
                "VALUES ('t', 'x', 'robot', 'a', 'b')"
            )
        runtime.product().close()
    # WHEN, on the migrated file, tenant B registers the agent ID tenant A has
    runtime = make_runtime(api_settings, clock)
    with make_client(runtime) as client:
        answer = _register(client, B, "agent-7")
    # THEN it is B's own agent, and A's is unchanged
    assert answer.status_code == 201, answer.text
    registry = AgentRegistry(runtime.product(), runtime.settings, clock)
    record = registry.get(TENANT, "agent-7")
    assert record is not None and record.url == "http://127.0.0.1:9/a"
    theirs = registry.get(OTHER_TENANT, "agent-7")
    assert theirs is not None and theirs.kind is AgentKind.SCRIPTED


@pytest.mark.parametrize("agent_id", [".", "..", "-x"])
def test_the_registry_and_the_api_refuse_dot_dotdot_and_a_leading_dash(
    client: Any, runtime: Rhumbatron, agent_id: str
) -> None:
    # WHEN the registry is asked to register it THEN it refuses, naming the value
    registry = runtime.lifecycle().registry
    with pytest.raises(AgentRegistryError, match=f"agent ID {agent_id!r} is invalid"):
        registry.register_scripted(TENANT, agent_id)
    with pytest.raises(AgentRegistryError, match="is invalid"):
        registry.register_webhook(TENANT, agent_id, "http://127.0.0.1:9/wake")
    # WHEN the API gets it as an agent to register, a Task's agent, a reporting agent, a
    # release's agent (a query) or a subscription's agent
    task = {"taskId": "t1", "title": "T", "agentId": agent_id}
    change = {"clientRequestId": "req-x", "title": "X", "tasks": [task]}
    reaction = {"kind": "agent", "agentId": agent_id}
    subscription = {"name": "s1", "selector": {"kinds": ["task.failed"]}, "reaction": reaction}
    tasks = f"/projects/{PROJECT}/changes/chg-1/tasks/t1"
    answers = [
        ("agentId", _register(client, A, agent_id)),
        ("tasks.0.agentId", client.post(f"/projects/{PROJECT}/changes", json=change, headers=A)),
        ("agentId", client.post(f"{tasks}/start", json={"agentId": agent_id}, headers=A)),
        (
            "agentId",
            client.delete(
                f"{tasks}/claims", params={"agentId": agent_id, "resource": "src/a.py"}, headers=A
            ),
        ),
        ("reaction.agent.agentId", client.post("/subscriptions", json=subscription, headers=A)),
    ]
    # THEN each is a 422 on that field, quoting the value; nothing was registered
    for where, answer in answers:
        assert answer.status_code == 422, (where, answer.text)
        error = answer.json()["error"]
        assert error["field"] == where, (where, error)
        assert f"={agent_id!r}" in error["message"], error
    assert registry.get(TENANT, agent_id) is None
