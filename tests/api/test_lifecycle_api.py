"""The lifecycle API over a real runtime and nats-server: projects provisioned through the
integration queue, Changes requested once per client request, agent callbacks, the view and
feed, agents, and the tenancy and scope checks of every route.

The tests are async and call the API through httpx's ASGI transport, on the same event loop
as the runtime: a test can then play the other roles itself (the integration queue, the
whole local loop) between requests, on the one NATS connection.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.shard_commands import AdmitAgent
from rhumbatron.agents.signing import verify
from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.lifecycle.requests import qualified_task_id
from rhumbatron.protocol.envelopes import Event
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.loop import LocalLoop
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import queued

pytestmark = pytest.mark.integration

TENANT, OTHER_TENANT = "tenant-a", "tenant-b"
PROJECT = "acme-web"
LIFECYCLE_SCOPES = [
    "projects:read",
    "projects:write",
    "changes:read",
    "changes:write",
    "agents:write",
]
OWNER = "lifecycle-token-aaaaaaaaaaaa"
VIEWER = "viewer-token-aaaaaaaaaaaaaa"
AGENT = "agent-token-aaaaaaaaaaaaaaa"
LETTERS_ONLY = "letters-token-aaaaaaaaaaaa"
OTHER = "lifecycle-token-bbbbbbbbbbbb"
PLATFORM = "platform-token-ffffffffffff"
TOKENS: dict[str, dict[str, Any]] = {
    OWNER: {"tenant": TENANT, "scopes": LIFECYCLE_SCOPES},
    VIEWER: {"tenant": TENANT, "scopes": ["projects:read", "changes:read"]},
    AGENT: {"tenant": TENANT, "scopes": ["agents:write"]},
    LETTERS_ONLY: {"tenant": TENANT, "scopes": ["dead-letters:read"]},
    OTHER: {"tenant": OTHER_TENANT, "scopes": LIFECYCLE_SCOPES},
    PLATFORM: {"tenant": "*", "scopes": LIFECYCLE_SCOPES},
}
FAST = {
    "queue_retry_delay_s": {
        q: 0.05 for q in ("agent-wakeups", "integration", "verification", "release", "indexing")
    },
    "integration_more_work_delay_s": 0.05,
    "conflict_review_delay_s": 0.05,
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


AUTH = bearer(OWNER)


@pytest_asyncio.fixture
async def lifecycle_app(
    tmp_path: Path, nats_server: NatsServerProcess, clock: ManualClock
) -> AsyncIterator[Rhumbatron]:
    settings = load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        api_tokens=TOKENS,
        webhook_allowed_hosts=("127.0.0.1",),
        command_send_timeout_s=1.0,
        **FAST,
    )
    runtime = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    await runtime.ensure_streams()
    yield runtime
    await runtime.close()


@pytest_asyncio.fixture
async def api(lifecycle_app: Rhumbatron) -> AsyncIterator[httpx.AsyncClient]:
    """The API over the runtime; the runtime outlives it (the fixture above closes it)."""
    asgi = create_api(
        lifecycle_app, StaticTokenAuth(lifecycle_app.settings.api_tokens), manage_runtime=False
    )
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
        yield client


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error model's body, checked to be exactly that model."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "field"}
    error: dict[str, Any] = body["error"]
    return error


async def run_until(app: Rhumbatron, done: Callable[[], bool]) -> None:
    """Play every role in rounds until ``done()``, bounded: at most 200 rounds, or 100 quiet
    rounds in a row (each waits 50 ms for a delayed redelivery to come due)."""
    loop = LocalLoop(app)
    finished = await loop.run_until(done, max_idle_rounds=100)
    assert finished, f"the local loop went quiet before it was done: {loop.rounds[-3:]}"


async def provision(
    api: httpx.AsyncClient, app: Rhumbatron, project: str = PROJECT, token: str = OWNER
) -> None:
    """POST /projects, then the integration queue once (as its consumer would)."""
    answer = await api.post(
        "/projects", json={"projectId": project, "name": "Web"}, headers=bearer(token)
    )
    assert answer.status_code == 202, answer.text
    queues = await app.queue_runtime()
    await queues.poll("integration", app.lifecycle().handler("integration"))
    assert app.project_tenant(project) is not None


def change_request(client_request_id: str = "req-1", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "clientRequestId": client_request_id,
        "title": "Gift cards",
        "tasks": [
            {"taskId": "t1", "title": "Schema", "agentId": "builder-a"},
            {"taskId": "t2", "title": "Payments", "agentId": "builder-b"},
            {"taskId": "t3", "title": "Docs", "agentId": "builder-a", "dependsOn": ["t1", "t2"]},
        ],
    }
    body.update(changes)
    return body


async def create_change(api: httpx.AsyncClient, **changes: Any) -> dict[str, Any]:
    answer = await api.post(
        f"/projects/{PROJECT}/changes", json=change_request(**changes), headers=AUTH
    )
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def admit(app: Rhumbatron, change_id: str, task_id: str, agent_id: str) -> None:
    """What the wake consumer does for a dispatcher's wake: the Task is the Agent's."""
    task_id = qualified_task_id(change_id, task_id)
    caller = Caller(TENANT, f"agent:{agent_id}", f"cmd_{task_id}_ready")
    shard = app.lifecycle().world.change_shard(PROJECT, change_id)
    shard.apply(caller, AdmitAgent(change_id=change_id, task_id=task_id, agent_id=agent_id))


# --------------------------------------------------------------------------------- projects


async def test_a_project_is_provisioned_through_the_integration_queue_and_read_back(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a request to provision a project, sent twice
    request = {"projectId": PROJECT, "name": "Web"}
    first = await api.post("/projects", json=request, headers=AUTH)
    second = await api.post("/projects", json=request, headers=AUTH)
    # THEN one project.provision is queued, under a stable ID; the repeat is a duplicate
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json() == {
        "commandId": f"cmd_provision_{PROJECT}",
        "queue": "integration",
        "duplicate": False,
    }
    assert second.json()["duplicate"] is True
    (stored,) = await asyncio.to_thread(queued, nats_server.url, f"cmd_provision_{PROJECT}")
    assert stored.command["payload"] == {"name": "Web", "tenantId": TENANT}
    # AND until the integration module runs it, there is no project
    assert (await api.get(f"/projects/{PROJECT}", headers=AUTH)).status_code == 404
    # WHEN the integration queue runs
    queues = await lifecycle_app.queue_runtime()
    await queues.poll("integration", lifecycle_app.lifecycle().handler("integration"))
    # THEN the project is the tenant's, active, at generation 0, with no app
    answer = await api.get(f"/projects/{PROJECT}", headers=bearer(VIEWER))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "projectId": PROJECT,
        "name": "Web",
        "tenantId": TENANT,
        "status": "active",
        "canonicalGeneration": 0,
        "liveApps": [],
    }


async def test_a_project_id_of_another_tenant_is_unavailable_without_naming_it(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN tenant A's project
    await provision(api, lifecycle_app)
    # WHEN tenant B asks for the same project ID
    answer = await api.post(
        "/projects", json={"projectId": PROJECT, "name": "Web"}, headers=bearer(OTHER)
    )
    # THEN 409, naming neither tenant, and nothing is queued
    assert answer.status_code == 409
    error = error_of(answer)
    assert (error["code"], error["field"]) == ("project_id_unavailable", "projectId")
    assert TENANT not in error["message"]
    assert await asyncio.to_thread(queued, nats_server.url) == []
    # AND tenant A renaming it by provisioning again is refused too
    renamed = await api.post("/projects", json={"projectId": PROJECT, "name": "Shop"}, headers=AUTH)
    assert (renamed.status_code, error_of(renamed)["code"]) == (409, "project_exists")


async def test_a_platform_token_reads_every_project_but_owns_none(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    await provision(api, lifecycle_app)
    # A platform operator sees the tenant's project ...
    answer = await api.get(f"/projects/{PROJECT}", headers=bearer(PLATFORM))
    assert (answer.status_code, answer.json()["tenantId"]) == (200, TENANT)
    # ... but cannot create one: it would belong to no tenant
    refused = await api.post(
        "/projects", json={"projectId": "acme-ops", "name": "Ops"}, headers=bearer(PLATFORM)
    )
    assert (refused.status_code, error_of(refused)["code"]) == (403, "tenant_required")


async def test_an_app_is_provisioned_and_removed_through_the_queue(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a project
    await provision(api, lifecycle_app)

    async def live_apps() -> list[str]:
        answer = await api.get(f"/projects/{PROJECT}", headers=AUTH)
        apps: list[str] = answer.json()["liveApps"]
        return apps

    queues = await lifecycle_app.queue_runtime()
    integration = lifecycle_app.lifecycle().handler("integration")
    # WHEN an app is provisioned
    added = await api.post(
        f"/projects/{PROJECT}/apps", json={"appName": "storefront"}, headers=AUTH
    )
    assert added.status_code == 202, added.text
    assert added.json()["commandId"] == f"cmd_app_{PROJECT}.storefront.provision.20260101T000000Z"
    await queues.poll("integration", integration)
    # THEN it is live
    assert await live_apps() == ["storefront"]
    # WHEN it is removed, and provisioned again a second later
    removed = await api.delete(f"/projects/{PROJECT}/apps/storefront", headers=AUTH)
    assert removed.status_code == 202, removed.text
    await queues.poll("integration", integration)
    assert await live_apps() == []
    clock.advance(1)
    again = await api.post(
        f"/projects/{PROJECT}/apps", json={"appName": "storefront"}, headers=AUTH
    )
    # THEN the second provisioning is a command of its own, not a dropped repeat
    assert again.json()["duplicate"] is False
    await queues.poll("integration", integration)
    assert await live_apps() == ["storefront"]
    # AND a client's request ID makes the command ID, so its retry is a duplicate
    keyed = {"appName": "admin", "clientRequestId": "add-admin-1"}
    first = await api.post(f"/projects/{PROJECT}/apps", json=keyed, headers=AUTH)
    clock.advance(5)
    retry = await api.post(f"/projects/{PROJECT}/apps", json=keyed, headers=AUTH)
    assert first.json()["commandId"] == f"cmd_app_{PROJECT}.admin.provision.add-admin-1"
    assert (first.json()["duplicate"], retry.json()["duplicate"]) == (False, True)


async def test_an_archived_project_is_cleaned_up_and_takes_no_more_work(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    # GIVEN a project with a live app
    await provision(api, lifecycle_app)
    await api.post(f"/projects/{PROJECT}/apps", json={"appName": "storefront"}, headers=AUTH)
    queues = await lifecycle_app.queue_runtime()
    integration = lifecycle_app.lifecycle().handler("integration")
    await queues.poll("integration", integration)
    # WHEN it is cleaned up while active THEN 409: archive it first
    early = await api.post(f"/projects/{PROJECT}/cleanup", headers=AUTH)
    assert (early.status_code, error_of(early)["code"]) == (409, "project_active")
    # WHEN it is archived (twice)
    archived = await api.post(
        f"/projects/{PROJECT}/archive", json={"reason": "shop closed"}, headers=AUTH
    )
    again = await api.post(f"/projects/{PROJECT}/archive", headers=AUTH)
    # THEN it is archived at once, and archiving again changes nothing
    assert archived.status_code == again.status_code == 200, archived.text
    assert archived.json()["status"] == again.json()["status"] == "archived"
    # AND it takes no Change and no app any more
    change = await api.post(f"/projects/{PROJECT}/changes", json=change_request(), headers=AUTH)
    assert (change.status_code, error_of(change)["code"]) == (409, "project_not_active")
    app = await api.post(f"/projects/{PROJECT}/apps", json={"appName": "x"}, headers=AUTH)
    assert (app.status_code, error_of(app)["code"]) == (409, "project_not_active")
    # WHEN it is cleaned up (the day's command, then a client's own)
    cleanup = await api.post(f"/projects/{PROJECT}/cleanup", headers=AUTH)
    repeat = await api.post(f"/projects/{PROJECT}/cleanup", json={}, headers=AUTH)
    keyed = await api.post(
        f"/projects/{PROJECT}/cleanup", json={"clientRequestId": "close-1"}, headers=AUTH
    )
    assert cleanup.json()["commandId"] == f"cmd_cleanup_{PROJECT}.2026-01-01"
    assert (cleanup.json()["duplicate"], repeat.json()["duplicate"]) == (False, True)
    assert keyed.json()["commandId"] == f"cmd_cleanup_{PROJECT}.close-1"
    await queues.poll("integration", integration)
    # THEN its apps are removed
    assert (await api.get(f"/projects/{PROJECT}", headers=AUTH)).json()["liveApps"] == []


# --------------------------------------------------------------------------------- Changes


async def test_a_change_is_created_once_per_client_request(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a project
    await provision(api, lifecycle_app)
    # WHEN a Change is requested, then requested again with the same clientRequestId
    first = await api.post(f"/projects/{PROJECT}/changes", json=change_request(), headers=AUTH)
    repeat = await api.post(
        f"/projects/{PROJECT}/changes",
        json=change_request(title="Something else entirely"),
        headers=AUTH,
    )
    # THEN the first is created (201) and the repeat answers the same first Change (200)
    assert (first.status_code, repeat.status_code) == (201, 200), repeat.text
    change = first.json()
    assert repeat.json() == change
    assert change["changeId"].startswith("chg_")
    assert (change["status"], change["title"], change["clientRequestId"]) == (
        "open",
        "Gift cards",
        "req-1",
    )
    assert change["requestedBy"].startswith("user:")
    assert change["createdAt"] is not None
    # (Task IDs are qualified by their Change, as in their events and wakes.)
    tasks = {t["taskId"].removeprefix(change["changeId"] + "."): t for t in change["tasks"]}
    assert {t: tasks[t]["status"] for t in tasks} == {"t1": "ready", "t2": "ready", "t3": "planned"}
    assert tasks["t3"]["dependsOn"] == [f"{change['changeId']}.t1", f"{change['changeId']}.t2"]
    assert tasks["t1"]["plannedAgent"] == "builder-a"
    assert (change["candidates"], change["releases"]) == ([], [])
    # AND another request ID is another Change
    clock.advance(1)
    other = await api.post(
        f"/projects/{PROJECT}/changes", json=change_request("req-2"), headers=AUTH
    )
    assert other.status_code == 201
    assert other.json()["changeId"] != change["changeId"]
    # AND reads answer what was created
    read = await api.get(
        f"/projects/{PROJECT}/changes/{change['changeId']}", headers=bearer(VIEWER)
    )
    assert read.json() == change
    listed = await api.get(f"/projects/{PROJECT}/changes", headers=bearer(VIEWER))
    assert [c["changeId"] for c in listed.json()["items"]] == [
        change["changeId"],
        other.json()["changeId"],
    ]
    task_list = await api.get(
        f"/projects/{PROJECT}/changes/{change['changeId']}/tasks", headers=bearer(VIEWER)
    )
    assert task_list.json()["items"] == change["tasks"]


async def test_changes_are_listed_by_status(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN two Changes, one of them cancelled
    await provision(api, lifecycle_app)
    kept = await create_change(api, client_request_id="req-1")
    clock.advance(1)
    dropped = await create_change(api, client_request_id="req-2")
    cancel = await api.post(
        f"/projects/{PROJECT}/changes/{dropped['changeId']}/cancel",
        json={"reason": "not needed"},
        headers=AUTH,
    )
    assert cancel.status_code == 200, cancel.text
    assert (cancel.json()["status"], cancel.json()["reason"]) == ("cancelled", "not needed")

    async def ids(*statuses: str) -> list[str]:
        answer = await api.get(
            f"/projects/{PROJECT}/changes", params={"status": list(statuses)}, headers=AUTH
        )
        assert answer.status_code == 200, answer.text
        return [c["changeId"] for c in answer.json()["items"]]

    # WHEN they are listed by status THEN each filter narrows the list
    assert await ids("open") == [kept["changeId"]]
    assert await ids("cancelled") == [dropped["changeId"]]
    assert await ids("open", "cancelled") == [kept["changeId"], dropped["changeId"]]
    assert await ids("completed") == []
    bad = await api.get(f"/projects/{PROJECT}/changes", params={"status": "done"}, headers=AUTH)
    assert (bad.status_code, error_of(bad)["field"]) == (422, "status.0")


def _tasks(*tasks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"title": "T", "agentId": "builder-a", **t} for t in tasks]


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        pytest.param({"tasks": []}, "tasks", "at least 1", id="no-tasks"),
        pytest.param(
            {"tasks": _tasks({"taskId": "t1"}, {"taskId": "t1"})},
            "tasks",
            "named twice",
            id="twice",
        ),
        pytest.param(
            {"tasks": _tasks({"taskId": "t1", "dependsOn": ["t9"]})},
            "tasks",
            "not tasks of this change",
            id="unknown-dependency",
        ),
        pytest.param(
            {"tasks": _tasks({"taskId": "t1", "dependsOn": ["t1"]})},
            "tasks",
            "depends on itself",
            id="self-dependency",
        ),
        pytest.param(
            {
                "tasks": _tasks(
                    {"taskId": "t1", "dependsOn": ["t2"]}, {"taskId": "t2", "dependsOn": ["t1"]}
                )
            },
            "tasks",
            "cycle",
            id="cycle",
        ),
        pytest.param(
            {"tasks": _tasks({"taskId": "t1", "agentId": "no spaces"})},
            "tasks.0.agentId",
            "pattern",
            id="bad-agent-id",
        ),
        pytest.param(
            {"clientRequestId": "has space"}, "clientRequestId", "pattern", id="bad-request-id"
        ),
        pytest.param({"title": ""}, "title", "at least 1", id="no-title"),
    ],
)
async def test_a_malformed_change_is_422_naming_the_field(
    api: httpx.AsyncClient,
    lifecycle_app: Rhumbatron,
    changes: dict[str, Any],
    field: str,
    says: str,
) -> None:
    await provision(api, lifecycle_app)
    answer = await api.post(
        f"/projects/{PROJECT}/changes", json=change_request(**changes), headers=AUTH
    )
    assert answer.status_code == 422, answer.text
    error = error_of(answer)
    assert (error["code"], error["field"]) == ("invalid_request", field)
    assert says in error["message"]


async def test_a_change_naming_an_agent_id_another_tenant_uses_names_its_own_agent(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    # GIVEN an agent registered by tenant B
    registered = await api.post(
        "/agents", json={"agentId": "builder-a", "kind": "scripted"}, headers=bearer(OTHER)
    )
    assert registered.status_code == 201, registered.text
    await provision(api, lifecycle_app)
    # WHEN tenant A plans a Task for the same agent ID THEN the Change is created: the ID
    # names tenant A's agent (agent IDs are per tenant), and nothing tells A of B's
    answer = await api.post(f"/projects/{PROJECT}/changes", json=change_request(), headers=AUTH)
    assert answer.status_code == 201, answer.text
    assert OTHER_TENANT not in answer.text


async def test_approving_a_change_not_awaiting_approval_is_409(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    # GIVEN an open Change
    await provision(api, lifecycle_app)
    change_id = (await create_change(api))["changeId"]
    # WHEN it is approved or declined THEN 409, saying its status
    approve = await api.post(f"/projects/{PROJECT}/changes/{change_id}/approve", headers=AUTH)
    assert approve.status_code == 409
    error = error_of(approve)
    assert error["code"] == "not_awaiting_approval"
    assert "is open" in error["message"]
    decline = await api.post(
        f"/projects/{PROJECT}/changes/{change_id}/decline", json={"reason": "no"}, headers=AUTH
    )
    assert (decline.status_code, error_of(decline)["code"]) == (409, "illegal_transition")
    # AND a Change that does not exist is 404
    missing = await api.post(f"/projects/{PROJECT}/changes/chg_nothing/approve", headers=AUTH)
    assert (missing.status_code, error_of(missing)["code"]) == (404, "not_found")
    # AND cancelling it works, twice (the second changes nothing); then approval is 409
    first = await api.post(f"/projects/{PROJECT}/changes/{change_id}/cancel", headers=AUTH)
    second = await api.post(f"/projects/{PROJECT}/changes/{change_id}/cancel", headers=AUTH)
    assert first.json()["status"] == second.json()["status"] == "cancelled"
    late = await api.post(f"/projects/{PROJECT}/changes/{change_id}/approve", headers=AUTH)
    assert late.status_code == 409


async def test_reading_a_change_that_does_not_exist_creates_no_actor_file(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    await provision(api, lifecycle_app)
    before = sorted(
        p.name for p in (lifecycle_app.settings.state_dir / "projects" / PROJECT).iterdir()
    )
    for change_id in ("chg_a", "chg_b", "chg_c", "chg_d", "chg_e"):
        answer = await api.get(f"/projects/{PROJECT}/changes/{change_id}", headers=AUTH)
        assert answer.status_code == 404
    after = sorted(
        p.name for p in (lifecycle_app.settings.state_dir / "projects" / PROJECT).iterdir()
    )
    assert after == before


# --------------------------------------------------------------------------------- callbacks


def task_path(change_id: str, task_id: str) -> str:
    return f"/projects/{PROJECT}/changes/{change_id}/tasks/{task_id}"


async def test_an_external_agent_reports_its_task_through_the_callbacks(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a Change whose t1 and t2 the dispatcher gave to builder-a and builder-b
    await provision(api, lifecycle_app)
    change_id = (await create_change(api))["changeId"]
    admit(lifecycle_app, change_id, "t1", "builder-a")
    admit(lifecycle_app, change_id, "t2", "builder-b")
    t1, t2 = task_path(change_id, "t1"), task_path(change_id, "t2")
    a, b = {"agentId": "builder-a"}, {"agentId": "builder-b"}
    headers = bearer(AGENT)

    # WHEN builder-a starts (twice) THEN t1 runs
    for _ in range(2):
        started = await api.post(f"{t1}/start", json=a, headers=headers)
        assert started.status_code == 200, started.text
        assert (started.json()["status"], started.json()["agentId"]) == ("running", "builder-a")
    # WHEN it declares an intent and claims a file
    intent = await api.post(
        f"{t1}/intents",
        json={**a, "intentId": "int-1", "paths": ["src/app.py"], "summary": "the schema"},
        headers=headers,
    )
    assert intent.status_code == 200, intent.text
    assert intent.json()["paths"] == ["src/app.py"]
    claim = await api.post(f"{t1}/claims", json={**a, "resource": "src/app.py"}, headers=headers)
    assert claim.status_code == 200, claim.text
    assert claim.json()["held"] is True
    assert claim.json()["expiresAt"].startswith("2026-01-01T00:15:00")
    # THEN builder-b can neither claim nor release it
    taken = await api.post(f"{t2}/claims", json={**b, "resource": "src/app.py"}, headers=headers)
    assert (taken.status_code, error_of(taken)["code"]) == (409, "claimed_by_another")
    assert "builder-a" in error_of(taken)["message"]
    not_its = await api.delete(
        f"{t2}/claims", params={**b, "resource": "src/app.py"}, headers=headers
    )
    assert not_its.status_code == 409
    # AND builder-b cannot report on builder-a's Task
    wrong = await api.post(f"{t1}/complete", json=b, headers=headers)
    assert (wrong.status_code, error_of(wrong)["code"]) == (409, "not_holder")
    # WHEN builder-a proposes a changeset (twice), then the same ID with other files
    files = {"src/app.py": "print('gift cards')\n"}
    for _ in range(2):
        proposed = await api.post(
            f"{t1}/changesets", json={**a, "changesetId": "cs-1", "files": files}, headers=headers
        )
        assert proposed.status_code == 200, proposed.text
    assert proposed.json() == {
        "changesetId": "cs-1",
        "changeId": change_id,
        "taskId": f"{change_id}.t1",
        "agentId": "builder-a",
        "paths": ["src/app.py"],
        "baseGeneration": 0,
    }
    reused = await api.post(
        f"{t1}/changesets",
        json={**a, "changesetId": "cs-1", "files": {"src/other.py": "x"}},
        headers=headers,
    )
    assert (reused.status_code, error_of(reused)["code"]) == (409, "changeset_refused")
    # WHEN it releases its claim and completes t1 (twice)
    released = await api.delete(
        f"{t1}/claims", params={**a, "resource": "src/app.py"}, headers=headers
    )
    assert (released.status_code, released.json()["held"]) == (200, False)
    for _ in range(2):
        done = await api.post(f"{t1}/complete", json={**a, "changesetId": "cs-1"}, headers=headers)
        assert done.status_code == 200, done.text
        assert (done.json()["status"], done.json()["changesetId"]) == ("completed", "cs-1")
    # AND builder-b fails t2
    failed = await api.post(f"{t2}/fail", json={**b, "reason": "card API down"}, headers=headers)
    assert failed.status_code == 200, failed.text
    assert (failed.json()["status"], failed.json()["reason"]) == ("failed", "card API down")
    # THEN the Change shows both reports; t3 still waits for t2
    change = (await api.get(f"/projects/{PROJECT}/changes/{change_id}", headers=AUTH)).json()
    assert {t["taskId"]: t["status"] for t in change["tasks"]} == {
        f"{change_id}.t1": "completed",
        f"{change_id}.t2": "failed",
        f"{change_id}.t3": "planned",
    }


async def test_an_agent_challenges_another_agents_claim_once(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    # GIVEN a Change whose t1 builder-a holds, with its claim on src/app.py, and whose t2
    # builder-b holds
    await provision(api, lifecycle_app)
    change_id = (await create_change(api))["changeId"]
    admit(lifecycle_app, change_id, "t1", "builder-a")
    admit(lifecycle_app, change_id, "t2", "builder-b")
    t1, t2 = task_path(change_id, "t1"), task_path(change_id, "t2")
    headers = bearer(AGENT)
    claim = {"agentId": "builder-a", "resource": "src/app.py"}
    assert (await api.post(f"{t1}/claims", json=claim, headers=headers)).status_code == 200
    request = {
        "agentId": "builder-b",
        "challengeId": "chl-1",
        "resource": "src/app.py",
        "targetAgentId": "builder-a",
        "reason": "it breaks the checkout",
    }

    # WHEN builder-b challenges builder-a's claim, twice (a retried request)
    first = await api.post(f"{t2}/challenges", json=request, headers=headers)
    again = await api.post(f"{t2}/challenges", json=request, headers=headers)

    # THEN both answer the challenge as created
    assert (first.status_code, again.status_code) == (200, 200), first.text
    assert first.json() == again.json() == {**request, "taskId": f"{change_id}.t2"}
    # AND challenge.created is in the resource's shard once: by builder-b, about its Change
    shard = lifecycle_app.resource_shard(PROJECT, "src/app.py")
    rows = shard.connection.execute(
        "SELECT envelope FROM outbox WHERE event_type = 'challenge.created'"
    ).fetchall()
    (event,) = [Event.parse(bytes(row[0])) for row in rows]
    assert (event.actor, event.resource, event.change_id) == (
        "agent:builder-b",
        "src/app.py",
        change_id,
    )
    assert event.payload.model_dump(mode="json", by_alias=True) == {
        "challengeId": "chl-1",
        "agentId": "builder-b",
        "targetAgentId": "builder-a",
        "reason": "it breaks the checkout",
    }
    # WHEN the ID is reused for another challenge THEN 409, and nothing more is written
    reused = await api.post(
        f"{t2}/challenges", json={**request, "reason": "something else"}, headers=headers
    )
    assert (reused.status_code, error_of(reused)["code"]) == (409, "challenge_refused")
    # WHEN an agent challenges from a Task it does not hold THEN 409
    not_its = await api.post(
        f"{t1}/challenges", json={**request, "challengeId": "chl-2"}, headers=headers
    )
    assert (not_its.status_code, error_of(not_its)["code"]) == (409, "not_holder")
    count = shard.connection.execute(
        "SELECT COUNT(*) FROM outbox WHERE event_type = 'challenge.created'"
    ).fetchone()[0]
    assert count == 1


@pytest.mark.parametrize(
    ("action", "body", "field"),
    [
        ("start", {"agentId": "has space"}, "agentId"),
        ("intents", {"agentId": "builder-a", "intentId": "i1", "paths": []}, "paths"),
        ("claims", {"agentId": "builder-a", "resource": "a\nb"}, "resource"),
        (
            "challenges",
            {"agentId": "builder-a", "challengeId": "c1", "resource": "a", "reason": "  "},
            "reason",
        ),
        (
            "challenges",
            {
                "agentId": "builder-a",
                "challengeId": "c1",
                "resource": "a",
                "targetAgentId": "builder-a",
                "reason": "r",
            },
            "targetAgentId",
        ),
        ("changesets", {"agentId": "builder-a", "changesetId": "c1", "files": {}}, "files"),
        (
            "changesets",
            {"agentId": "builder-a", "changesetId": "c1", "files": {"../etc/passwd": "x"}},
            "files",
        ),
        ("complete", {"agentId": "builder-a", "changesetId": "bad id"}, "changesetId"),
        ("fail", {"agentId": "builder-a", "reason": "   "}, "reason"),
        ("fail", {"agentId": "builder-a"}, "reason"),
    ],
)
async def test_a_malformed_callback_is_422_naming_the_field(
    api: httpx.AsyncClient,
    lifecycle_app: Rhumbatron,
    action: str,
    body: dict[str, Any],
    field: str,
) -> None:
    await provision(api, lifecycle_app)
    change_id = (await create_change(api))["changeId"]
    admit(lifecycle_app, change_id, "t1", "builder-a")
    answer = await api.post(f"{task_path(change_id, 't1')}/{action}", json=body, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert error_of(answer)["field"] == field


async def test_callbacks_for_unknown_tasks_and_unknown_agents_are_refused(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    # GIVEN a Change, and an agent registered by tenant B
    await provision(api, lifecycle_app)
    change_id = (await create_change(api))["changeId"]
    registered = await api.post(
        "/agents", json={"agentId": "intruder", "kind": "scripted"}, headers=bearer(OTHER)
    )
    assert registered.status_code == 201
    # WHEN a report names a Task that is not the Change's THEN 404
    unknown = await api.post(
        f"{task_path(change_id, 't9')}/start", json={"agentId": "builder-a"}, headers=AUTH
    )
    assert (unknown.status_code, error_of(unknown)["code"]) == (404, "not_found")
    # WHEN tenant A's token reports as an agent only tenant B has THEN the answer is the one
    # for an agent nobody registered: tenant A's "intruder" does not hold the Task
    foreign = await api.post(
        f"{task_path(change_id, 't1')}/start", json={"agentId": "intruder"}, headers=AUTH
    )
    nobody = await api.post(
        f"{task_path(change_id, 't1')}/start", json={"agentId": "nobody-1"}, headers=AUTH
    )
    assert foreign.status_code == nobody.status_code == 409, foreign.text
    assert error_of(foreign)["code"] == error_of(nobody)["code"]
    assert OTHER_TENANT not in foreign.text
    # WHEN an agent that was not admitted starts the Task THEN 409, saying so
    early = await api.post(
        f"{task_path(change_id, 't1')}/start", json={"agentId": "builder-a"}, headers=AUTH
    )
    assert early.status_code == 409
    assert f"does not hold task '{change_id}.t1'" in error_of(early)["message"]


# --------------------------------------------------------------------------------- agents


async def test_a_webhook_agent_is_registered_with_a_secret_shown_once(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    request = {"agentId": "reviewer-1", "kind": "webhook", "url": "http://127.0.0.1:9/wake?k=v"}
    # WHEN a webhook agent is registered, then registered again
    first = await api.post("/agents", json=request, headers=bearer(AGENT))
    again = await api.post("/agents", json=request, headers=bearer(AGENT))
    # THEN the first answer carries the generated secret, once; neither carries the query
    assert (first.status_code, again.status_code) == (201, 200), first.text
    secret = first.json()["secret"]
    assert secret.startswith("whsec_")
    record = lifecycle_app.lifecycle().registry.get(TENANT, "reviewer-1")
    assert record is not None
    assert secret == record.secrets[0]
    assert again.json()["secret"] is None
    assert first.json()["url"] == again.json()["url"] == "http://127.0.0.1:9/wake"
    assert (first.json()["tenantId"], first.json()["secretCount"]) == (TENANT, 1)
    assert "secrets" not in first.json()
    # WHEN secrets are given THEN they are never echoed
    given = await api.post(
        "/agents", json={**request, "secrets": [secret, "whsec_" + "A" * 44]}, headers=AUTH
    )
    assert given.status_code == 200, given.text
    assert (given.json()["secret"], given.json()["secretCount"]) == (None, 2)
    assert secret not in given.text


_SECRET = "whsec_" + "B" * 44


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"agentId": "r1", "kind": "webhook", "url": "http://10.0.0.7/wake"}, 422, "url"),
        ({"agentId": "r1", "kind": "webhook", "url": "http://169.254.169.254/"}, 422, "url"),
        ({"agentId": "r1", "kind": "webhook", "url": "ftp://127.0.0.1/"}, 422, "url"),
        ({"agentId": "r1", "kind": "webhook"}, 422, "body"),
        ({"agentId": "r1", "kind": "scripted", "url": "http://127.0.0.1/"}, 422, "body"),
        (
            {"agentId": "r1", "kind": "webhook", "url": "http://127.0.0.1/", "secrets": ["x"]},
            422,
            "secrets",
        ),
        (
            {"agentId": "r1", "kind": "webhook", "url": "http://127.0.0.1/", "secrets": []},
            422,
            "secrets",
        ),
        (
            {
                "agentId": "r1",
                "kind": "webhook",
                "url": "http://127.0.0.1/",
                "secrets": [_SECRET, _SECRET],
            },
            422,
            "secrets",
        ),
        ({"agentId": "no spaces", "kind": "scripted"}, 422, "agentId"),
    ],
)
async def test_a_registration_that_cannot_be_done_is_refused_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], status: int, field: str
) -> None:
    answer = await api.post("/agents", json=body, headers=AUTH)
    assert answer.status_code == status, answer.text
    assert error_of(answer)["field"] == field
    # A refused secret is never quoted back
    assert _SECRET not in answer.text


async def test_another_tenant_registers_its_own_agent_of_the_same_id(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    mine = await api.post("/agents", json={"agentId": "r1", "kind": "scripted"}, headers=AUTH)
    assert mine.status_code == 201
    theirs = await api.post(
        "/agents",
        json={"agentId": "r1", "kind": "webhook", "url": "http://127.0.0.1/"},
        headers=bearer(OTHER),
    )
    # THEN tenant B has its own r1 (201, as for a fresh ID), and tenant A's is untouched
    assert theirs.status_code == 201, theirs.text
    assert theirs.json()["tenantId"] == OTHER_TENANT and TENANT not in theirs.text
    registry = lifecycle_app.lifecycle().registry
    record = registry.get(TENANT, "r1")
    assert record is not None and (record.kind.value, record.url) == ("scripted", None)
    platform = await api.post(
        "/agents", json={"agentId": "r2", "kind": "scripted"}, headers=bearer(PLATFORM)
    )
    assert (platform.status_code, error_of(platform)["code"]) == (403, "tenant_required")


# --------------------------------------------------------------------------------- the whole way


@dataclass
class Receiver:
    """An external agent's webhook endpoint: a real HTTP server on 127.0.0.1 taking wakes."""

    wakes: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    @contextmanager
    def serving(self) -> Iterator[str]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.wakes.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/wake"
        finally:
            server.shutdown()
            server.server_close()


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    found = Receiver()
    with found.serving() as url:
        yield found, url


async def test_a_change_goes_from_request_to_release_through_the_api(
    api: httpx.AsyncClient,
    lifecycle_app: Rhumbatron,
    clock: ManualClock,
    receiver: tuple[Receiver, str],
) -> None:
    endpoint, url = receiver
    app = lifecycle_app
    # GIVEN a project with a live app, and a webhook agent, all set up through the API
    await api.post("/projects", json={"projectId": PROJECT, "name": "Web"}, headers=AUTH)
    await run_until(app, lambda: app.project_tenant(PROJECT) is not None)
    storefront = {"appName": "storefront"}
    added = await api.post(f"/projects/{PROJECT}/apps", json=storefront, headers=AUTH)
    assert added.status_code == 202, added.text
    registered = await api.post(
        "/agents", json={"agentId": "builder-a", "kind": "webhook", "url": url}, headers=AUTH
    )
    secret = registered.json()["secret"]
    world = app.lifecycle().world
    await run_until(app, lambda: world.admin_shard(PROJECT).live_apps() == ["storefront"])
    # WHEN two Changes of one Task each are requested
    change_ids: list[str] = []
    for key in ("req-1", "req-2"):
        task = {"taskId": "t1", "title": "Schema", "agentId": "builder-a"}
        request = change_request(key, tasks=[task])
        created = await api.post(f"/projects/{PROJECT}/changes", json=request, headers=AUTH)
        assert created.status_code == 201, created.text
        change_ids.append(created.json()["changeId"])
        clock.advance(1)
    first, second = change_ids
    # THEN the dispatcher wakes the agent at its URL for each, signed with the secret it got
    await run_until(app, lambda: len(endpoint.wakes) >= 2)
    wakes: dict[str, dict[str, Any]] = {}
    for headers, body in endpoint.wakes:
        verify([secret], headers, body, now=clock.now(), tolerance_s=300)
        wake = json.loads(body)
        wakes[wake["changeId"]] = wake
    assert {c: (w["taskId"], w["taskStatus"]) for c, w in wakes.items()} == {
        c: (f"{c}.t1", "assigned") for c in change_ids
    }
    # WHEN the agent reports its work through the callbacks, on the Task each wake named
    a = {"agentId": "builder-a"}
    for n, change_id in enumerate(change_ids):
        t1 = task_path(change_id, wakes[change_id]["taskId"])
        files = {f"src/gift_{n}.py": f"GIFT = {n}\n"}
        for path, report in (
            ("start", a),
            ("changesets", {**a, "changesetId": f"cs-{n}", "files": files}),
            ("complete", {**a, "changesetId": f"cs-{n}"}),
        ):
            answer = await api.post(f"{t1}/{path}", json=report, headers=bearer(AGENT))
            assert answer.status_code == 200, answer.text

    def status_of(change_id: str) -> str:
        change = app.lifecycle().requests.change(PROJECT, change_id)
        return change.status if change else "missing"

    # THEN both are verified by themselves and wait for approval, each with its Candidate
    await run_until(app, lambda: {status_of(c) for c in change_ids} == {"awaiting_approval"})
    answer = await api.get(f"/projects/{PROJECT}/changes/{first}", headers=AUTH)
    assert answer.json()["status"] == "awaiting_approval"
    listed = (await api.get(f"/projects/{PROJECT}/candidates", headers=AUTH)).json()["items"]
    candidates = {c["changeId"]: c for c in listed}
    assert {(c["status"], c["changeStatus"], c["baseGeneration"]) for c in listed} == {
        ("verified", "awaiting_approval", 0)
    }
    assert candidates[first]["paths"] == ["src/gift_0.py"]
    # WHEN the first is approved, and the second right after it
    approved = await api.post(f"/projects/{PROJECT}/changes/{first}/approve", headers=AUTH)
    conflict = await api.post(f"/projects/{PROJECT}/changes/{second}/approve", headers=AUTH)
    # THEN the first's Candidate is promoted; the second's base is no longer canonical: 409
    assert approved.status_code == 200, approved.text
    assert approved.json()["candidateId"] == candidates[first]["candidateId"]
    assert conflict.status_code == 409, conflict.text
    assert error_of(conflict)["code"] == "promotion_conflict"
    assert "recompose" in error_of(conflict)["message"]
    # AND canonical advances and the first's release completes
    await run_until(app, lambda: status_of(first) == "completed")
    change = (await api.get(f"/projects/{PROJECT}/changes/{first}", headers=AUTH)).json()
    assert [c["status"] for c in change["candidates"]] == ["promoted"]
    assert [(r["status"], r["appName"], r["generation"]) for r in change["releases"]] == [
        ("completed", "storefront", 1)
    ]
    project = (await api.get(f"/projects/{PROJECT}", headers=AUTH)).json()
    assert project["canonicalGeneration"] == 1
    # AND approving it again answers the promoted Candidate
    again = await api.post(f"/projects/{PROJECT}/changes/{first}/approve", headers=AUTH)
    assert (again.status_code, again.json()["status"]) == (200, "promoted")
    # AND the view and the feed show what the events said, once the router applied them
    projector = app.router().projector
    await run_until(
        app, lambda: projector.view(PROJECT).snapshot()["changesByState"].get("completed") == 1
    )
    view = await api.get(f"/projects/{PROJECT}/view", headers=bearer(VIEWER))
    assert view.status_code == 200, view.text
    summary = view.json()
    assert (summary["projectId"], summary["name"], summary["canonicalGeneration"]) == (
        PROJECT,
        "Web",
        1,
    )
    assert summary["changesByState"]["completed"] == 1
    assert {c["candidateId"] for c in summary["candidates"]} >= {candidates[first]["candidateId"]}
    assert summary["latestEvents"]
    feed = await api.get(f"/projects/{PROJECT}/feed", params={"limit": 3}, headers=AUTH)
    items = feed.json()["items"]
    assert len(items) == 3
    assert [i["streamSeq"] for i in items] == sorted((i["streamSeq"] for i in items), reverse=True)
    assert items == summary["latestEvents"][:3]
    # AND each event the feed names can be read whole, where a webhook's pointer links
    for item in items:
        read = await api.get(f"/projects/{PROJECT}/events/{item['eventId']}", headers=AUTH)
        assert read.status_code == 200, read.text
        assert (read.json()["eventId"], read.json()["eventType"]) == (
            item["eventId"],
            item["eventType"],
        )
        assert read.json()["projectId"] == PROJECT and "payload" in read.json()
    unknown = await api.get(f"/projects/{PROJECT}/events/evt_{'0' * 32}", headers=AUTH)
    assert unknown.status_code == 404 and "not applied it yet" in error_of(unknown)["message"]


# --------------------------------------------------------------------------------- tenancy, scopes

_CHANGE = "chg_x"
_TASK = f"/projects/{PROJECT}/changes/{_CHANGE}/tasks/t1"
#: Every route under a project, with a body that validates.
PROJECT_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", f"/projects/{PROJECT}", None),
    ("POST", f"/projects/{PROJECT}/cleanup", None),
    ("POST", f"/projects/{PROJECT}/archive", None),
    ("POST", f"/projects/{PROJECT}/apps", {"appName": "storefront"}),
    ("DELETE", f"/projects/{PROJECT}/apps/storefront", None),
    ("GET", f"/projects/{PROJECT}/view", None),
    ("GET", f"/projects/{PROJECT}/feed", None),
    ("GET", f"/projects/{PROJECT}/events/evt_{'0' * 32}", None),
    ("POST", f"/projects/{PROJECT}/changes", change_request()),
    ("GET", f"/projects/{PROJECT}/changes", None),
    ("GET", f"/projects/{PROJECT}/changes/{_CHANGE}", None),
    ("GET", f"/projects/{PROJECT}/changes/{_CHANGE}/tasks", None),
    ("POST", f"/projects/{PROJECT}/changes/{_CHANGE}/approve", None),
    ("POST", f"/projects/{PROJECT}/changes/{_CHANGE}/decline", None),
    ("POST", f"/projects/{PROJECT}/changes/{_CHANGE}/cancel", None),
    ("GET", f"/projects/{PROJECT}/candidates", None),
    ("POST", f"{_TASK}/start", {"agentId": "builder-a"}),
    ("POST", f"{_TASK}/intents", {"agentId": "builder-a", "intentId": "i1", "paths": ["a"]}),
    ("POST", f"{_TASK}/claims", {"agentId": "builder-a", "resource": "a"}),
    ("DELETE", f"{_TASK}/claims?agentId=builder-a&resource=a", None),
    (
        "POST",
        f"{_TASK}/challenges",
        {"agentId": "builder-a", "challengeId": "c1", "resource": "a", "reason": "r"},
    ),
    (
        "POST",
        f"{_TASK}/changesets",
        {"agentId": "builder-a", "changesetId": "c", "files": {"a": ""}},
    ),
    ("POST", f"{_TASK}/complete", {"agentId": "builder-a"}),
    ("POST", f"{_TASK}/fail", {"agentId": "builder-a", "reason": "r"}),
]


async def test_another_tenants_project_is_not_found_on_every_route(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    # GIVEN tenant A's project, and a project ID nobody has
    await provision(api, lifecycle_app)
    for method, path, body in PROJECT_ROUTES:
        # WHEN tenant B calls any route of tenant A's project
        theirs = await api.request(method, path, json=body, headers=bearer(OTHER))
        # THEN it is not found, exactly like a project that does not exist
        nobodys = await api.request(
            method, path.replace(PROJECT, "acme-none"), json=body, headers=bearer(OTHER)
        )
        assert theirs.status_code == nobodys.status_code == 404, (method, path, theirs.text)
        assert error_of(theirs)["message"].replace(PROJECT, "?") == error_of(nobodys)[
            "message"
        ].replace("acme-none", "?")
    # AND tenant A's project is untouched
    project = (await api.get(f"/projects/{PROJECT}", headers=AUTH)).json()
    assert (project["status"], project["liveApps"]) == ("active", [])
    assert (await api.get(f"/projects/{PROJECT}/changes", headers=AUTH)).json()["items"] == []


def _scope(method: str, path: str) -> str:
    if "/tasks/" in path:
        return "agents:write"
    if "/changes" in path or path.endswith("/candidates"):
        return "changes:read" if method == "GET" else "changes:write"
    return "projects:read" if method == "GET" else "projects:write"


async def test_a_token_without_the_scope_is_403_naming_it(api: httpx.AsyncClient) -> None:
    routes = [
        *PROJECT_ROUTES,
        ("POST", "/projects", {"projectId": PROJECT, "name": "Web"}),
        ("POST", "/agents", {"agentId": "r1", "kind": "scripted"}),
    ]
    for method, path, body in routes:
        scope = _scope(method, path) if path != "/agents" else "agents:write"
        # A read-only token for writes, a dead-letters token for reads
        token = VIEWER if scope.endswith(":write") else LETTERS_ONLY
        answer = await api.request(method, path, json=body, headers=bearer(token))
        assert answer.status_code == 403, (method, path, answer.text)
        error = error_of(answer)
        assert (error["code"], repr(scope) in error["message"]) == ("insufficient_scope", True)
        assert f'scope="{scope}"' in answer.headers["WWW-Authenticate"]
    # AND without a token at all, 401
    anonymous = await api.get(f"/projects/{PROJECT}")
    assert (anonymous.status_code, error_of(anonymous)["code"]) == (401, "missing_token")


async def test_a_bad_feed_limit_is_422_naming_it(
    api: httpx.AsyncClient, lifecycle_app: Rhumbatron
) -> None:
    await provision(api, lifecycle_app)
    for limit in (0, 201):
        answer = await api.get(f"/projects/{PROJECT}/feed", params={"limit": limit}, headers=AUTH)
        assert (answer.status_code, error_of(answer)["field"]) == (422, "limit")
