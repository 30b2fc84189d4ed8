"""``/schedules`` over a real runtime: create (idempotent per name), read, list, enable, disable
and delete; the latest fire shown; the agents' scopes; another tenant's schedule not found and
another tenant's project refused; and 422s that name the field at fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.project import project_admin_key
from rhumbatron.reactions.schedule_firing import ScheduleSettings, fire_due_schedules
from rhumbatron.runtime.bootstrap import Rhumbatron
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import (
    OPERATOR,
    OTHER_OPERATOR,
    OTHER_TENANT,
    PLATFORM,
    PROJECT,
    READER,
    TENANT,
    TOKENS,
    bearer,
)

pytestmark = pytest.mark.integration

VIEWER = "sched-viewer-token-aaaaaaa"
AUTH = bearer(OPERATOR)
OTHER_PROJECT = "globex-web"


@pytest.fixture
def api_settings(tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    """The API tests' settings, with a read-only token."""
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        api_tokens={**TOKENS, VIEWER: {"tenant": TENANT, "scopes": ["agents:read"]}},
        nats_connect_timeout_s=0.5,
    )


@pytest.fixture
def runtime(runtime: Rhumbatron) -> Rhumbatron:
    """The API tests' runtime, with a project of the other tenant too."""
    owner = Caller(tenant_id=OTHER_TENANT, actor="user:bo", correlation_id="corr-2")
    runtime.project_root(OTHER_PROJECT).create_project(owner, name="Globex")
    return runtime


def _every(name: str = "every-15", **extra: Any) -> dict[str, Any]:
    return {"name": name, "projectId": PROJECT, "mode": "interval", "everyMinutes": 15, **extra}


def _create(client: TestClient, body: dict[str, Any], token: str = OPERATOR) -> Any:
    return client.post("/schedules", json=body, headers=bearer(token))


def test_a_schedule_is_created_read_listed_governed_and_deleted(
    client: TestClient, runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN an every-15-minutes schedule on the tenant's project
    # WHEN it is created, then created again the same way
    created = _create(client, _every())
    again = _create(client, _every())
    # THEN the first is 201, the second 200 with the same schedule
    assert created.status_code == 201, created.text
    sched = created.json()
    assert again.status_code == 200 and again.json() == sched
    assert sched["scheduleId"].startswith("sch_") and sched["tenantId"] == TENANT
    assert (sched["mode"], sched["everyMinutes"], sched["at"]) == ("interval", 15, None)
    assert sched["enabled"] is True and sched["lastFiredFor"] is None
    url = f"/schedules/{sched['scheduleId']}"
    # AND it is read and listed
    assert client.get(url, headers=AUTH).json() == sched
    assert client.get("/schedules", headers=AUTH).json() == {"items": [sched]}
    # WHEN it fires at its next slot  THEN the read shows that due time
    clock.advance(minutes=15)
    fire_due_schedules(runtime, clock.now(), settings=ScheduleSettings(sweep_tick_facts=False))
    fired = client.get(url, headers=AUTH).json()["lastFiredFor"]
    assert fired is not None and fired.endswith(":15:00Z")
    # WHEN it is disabled
    patched = client.patch(url, json={"enabled": False}, headers=AUTH)
    # THEN it is off the enabled-only list
    assert patched.status_code == 200, patched.text
    assert patched.json()["enabled"] is False
    listed = client.get("/schedules", params={"enabledOnly": "true"}, headers=AUTH)
    assert listed.json() == {"items": []}
    # WHEN it is deleted  THEN it is answered once, and then not found
    deleted = client.delete(url, headers=AUTH)
    assert deleted.status_code == 200 and deleted.json()["name"] == "every-15"
    gone = client.get(url, headers=AUTH)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert client.delete(url, headers=AUTH).status_code == 404


def test_a_daily_schedule_takes_a_time_of_day(client: TestClient) -> None:
    # GIVEN a daily schedule at 02:30 UTC  WHEN it is created
    body = {"name": "nightly", "projectId": PROJECT, "mode": "daily", "at": "02:30"}
    answer = _create(client, body)
    # THEN it is stored with its time and no interval
    assert answer.status_code == 201, answer.text
    assert (answer.json()["at"], answer.json()["everyMinutes"]) == ("02:30", None)


def test_other_content_under_a_taken_name_is_409(client: TestClient) -> None:
    # GIVEN a schedule named every-15
    assert _create(client, _every()).status_code == 201
    # WHEN another timing is created under the same name
    answer = _create(client, {**_every(), "everyMinutes": 30})
    # THEN it is a conflict naming the name
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "schedule_exists"
    assert answer.json()["error"]["field"] == "name"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "has space"}, "name"),
        ({"mode": "cron"}, "mode"),
        ({"everyMinutes": 0}, "everyMinutes"),
        ({"everyMinutes": 1441}, "everyMinutes"),
        ({"everyMinutes": None}, "everyMinutes"),
        ({"at": "02:00"}, "at"),
        ({"mode": "daily", "everyMinutes": None, "at": "25:00"}, "at"),
        ({"mode": "daily", "everyMinutes": None}, "at"),
        ({"projectId": OTHER_PROJECT}, "projectId"),
        ({"projectId": "no-such-project"}, "projectId"),
    ],
)
def test_an_invalid_request_is_422_naming_the_field(
    client: TestClient, change: dict[str, Any], field: str
) -> None:
    # GIVEN a request with one bad field (another tenant's project included)
    # WHEN it is sent
    answer = _create(client, {**_every(), **change})
    # THEN 422 names that field, and nothing is stored
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == field
    assert client.get("/schedules", headers=AUTH).json() == {"items": []}


def test_reads_need_agents_read_and_writes_agents_write(client: TestClient) -> None:
    # GIVEN a schedule
    sched = _create(client, _every()).json()
    url = f"/schedules/{sched['scheduleId']}"
    # WHEN a token with agents:read only reads, and then writes
    # THEN it reads; every write is 403 naming agents:write
    assert client.get(url, headers=bearer(VIEWER)).status_code == 200
    assert client.get("/schedules", headers=bearer(VIEWER)).status_code == 200
    for answer in (
        _create(client, _every("other"), token=VIEWER),
        client.patch(url, json={"enabled": False}, headers=bearer(VIEWER)),
        client.delete(url, headers=bearer(VIEWER)),
    ):
        assert answer.status_code == 403
        assert "'agents:write'" in answer.json()["error"]["message"]
    # AND a token without agents:read cannot list (403), nor can no token (401)
    denied = client.get("/schedules", headers=bearer(READER))
    assert denied.status_code == 403 and "'agents:read'" in denied.json()["error"]["message"]
    assert client.get("/schedules").status_code == 401


def test_another_tenants_schedule_is_not_found_and_the_platform_sees_all(
    client: TestClient,
) -> None:
    # GIVEN a schedule of each tenant, each on its own project
    mine = _create(client, _every()).json()
    theirs = _create(client, _every(projectId=OTHER_PROJECT), token=OTHER_OPERATOR).json()
    url = f"/schedules/{mine['scheduleId']}"
    other = bearer(OTHER_OPERATOR)
    # WHEN the other tenant reads, governs or deletes mine
    # THEN each is 404, and its list holds only its own
    assert client.get(url, headers=other).status_code == 404
    assert client.patch(url, json={"enabled": False}, headers=other).status_code == 404
    assert client.delete(url, headers=other).status_code == 404
    assert client.get("/schedules", headers=other).json() == {"items": [theirs]}
    assert client.get(url, headers=AUTH).json()["enabled"] is True
    # AND a platform token lists both and may govern, but cannot create (owns nothing)
    platform = bearer(PLATFORM)
    assert client.get("/schedules", headers=platform).json() == {"items": [mine, theirs]}
    assert client.patch(url, json={"enabled": False}, headers=platform).status_code == 200
    refused = _create(client, _every("platform"), token=PLATFORM)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "tenant_required"


def test_an_unknown_schedule_id_is_404_and_a_malformed_one_422(client: TestClient) -> None:
    # GIVEN no schedule  WHEN a well-formed and a malformed ID are read
    missing = client.get("/schedules/sch_" + "0" * 32, headers=AUTH)
    malformed = client.get("/schedules/nope", headers=AUTH)
    # THEN 404 and 422 on the path parameter
    assert missing.status_code == 404
    assert malformed.status_code == 422
    assert malformed.json()["error"]["field"] == "scheduleId"


def test_a_schedule_fired_now_writes_one_fact_a_minute_and_keeps_its_timing(
    client: TestClient, runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a disabled every-15-minutes schedule
    sched = _create(client, _every(enabled=False)).json()
    url = f"/schedules/{sched['scheduleId']}"
    # WHEN an operator fires it now, twice in the minute
    first = client.post(f"{url}/fire", headers=AUTH)
    second = client.post(f"{url}/fire", headers=AUTH)
    # THEN one schedule.fired was written, for this minute, under the schedule's ID for it
    assert first.status_code == 200, first.text
    fired = first.json()
    assert fired["written"] is True and second.json()["written"] is False
    assert second.json()["eventId"] == fired["eventId"]
    assert fired["scheduledAt"].startswith(clock.now().strftime("%Y-%m-%dT%H:%M"))
    admin = runtime.resource_shard(PROJECT, project_admin_key(PROJECT))
    rows = admin.connection.execute(
        "SELECT event_id FROM outbox WHERE event_type = 'schedule.fired'"
    ).fetchall()
    assert [r[0] for r in rows] == [fired["eventId"]]
    # AND it is not its timing's fire: still disabled, no due fire recorded
    read = client.get(url, headers=AUTH).json()
    assert (read["enabled"], read["lastFiredFor"]) == (False, None)
    # AND another tenant cannot fire it; a reader may not; the fire is audited
    assert client.post(f"{url}/fire", headers=bearer(OTHER_OPERATOR)).status_code == 404
    assert client.post(f"{url}/fire", headers=bearer(VIEWER)).status_code == 403
    audit = client.get("/audit", params={"operation": "fire_schedule"}, headers=AUTH)
    assert [e["status"] for e in audit.json()["items"]] == [403, 200, 200]
