"""The actors' outboxes over the API (issue #19): rows by state per actor, the failed rows
with their last error, and a requeue — within the caller's tenant, and audited."""

from __future__ import annotations

from typing import Any

import pytest

from rhumbatron.actors.alarms import alarm_due_at, delete_alarm
from rhumbatron.actors.outbox import mark_failed
from rhumbatron.runtime.bootstrap import Rhumbatron

from .conftest import TestClient
from .support import OPERATOR, OTHER_OPERATOR, PROJECT, READER, bearer

pytestmark = pytest.mark.integration

AUTH = bearer(OPERATOR)
ROOT = f"project_root:{PROJECT}"


def fail_the_first_row(runtime: Rhumbatron, error: str) -> str:
    """The project root's first outbox row (project.created) as the publisher leaves a row
    it gave up on: failed, with its error, and no alarm (nothing is due any more)."""
    db = runtime.project_root(PROJECT).connection
    seq, event_id = db.execute("SELECT seq, event_id FROM outbox ORDER BY seq").fetchone()
    with db:
        mark_failed(db, seq, error)
        delete_alarm(db)
    return str(event_id)


def outbox(client: TestClient, token: str = OPERATOR, **query: Any) -> dict[str, Any]:
    response = client.get("/outbox", params=query, headers=bearer(token))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_the_outbox_shows_rows_by_state_and_the_failed_rows_with_why(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN the project root's creation fact, not yet published
    (root,) = outbox(client)["items"]
    assert (root["actor"], root["projectId"]) == (ROOT, PROJECT)
    assert (root["rows"]["pending"], root["rows"]["failed"], root["failedRows"]) == (1, 0, [])
    # WHEN the publisher gave up on it
    event_id = fail_the_first_row(runtime, "SendRefusedError: stream EVENTS_03 refused it")
    # THEN the outbox says so, with the row and its last error; failedOnly finds it
    (root,) = outbox(client, failedOnly=True)["items"]
    assert (root["rows"]["pending"], root["rows"]["failed"]) == (0, 1)
    (row,) = root["failedRows"]
    assert (row["eventId"], row["eventType"]) == (event_id, "project.created")
    assert row["lastError"] == "SendRefusedError: stream EVENTS_03 refused it"


def test_a_requeue_puts_failed_rows_back_to_pending_once_and_is_audited(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN a failed row
    fail_the_first_row(runtime, "SendRefusedError: refused")
    assert alarm_due_at(runtime.project_root(PROJECT).connection) is None
    # WHEN the operator requeues the project, twice
    first = client.post("/outbox/requeue", json={"projectId": PROJECT}, headers=AUTH)
    second = client.post("/outbox/requeue", json={"projectId": PROJECT}, headers=AUTH)
    # THEN the first put the row back to pending and set the actor's alarm; the second
    #   found nothing failed
    assert first.status_code == 200, first.text
    assert first.json() == {"requeued": {ROOT: 1}, "total": 1}
    assert second.json() == {"requeued": {}, "total": 0}
    (root,) = outbox(client)["items"]
    assert (root["rows"]["pending"], root["rows"]["failed"]) == (1, 0)
    assert alarm_due_at(runtime.project_root(PROJECT).connection) is not None
    # AND both are in the audit
    audit = client.get("/audit", headers=AUTH).json()["items"]
    assert [e["operation"] for e in audit] == ["requeue_outbox", "requeue_outbox"]


def test_another_tenant_neither_sees_nor_requeues_the_outbox(client: TestClient) -> None:
    other = bearer(OTHER_OPERATOR)
    assert client.get("/outbox", headers=other).json()["items"] == []
    assert client.get("/outbox", params={"projectId": PROJECT}, headers=other).status_code == 404
    refused = client.post("/outbox/requeue", json={"projectId": PROJECT}, headers=other)
    assert refused.status_code == 404
    # AND a token that may only read cannot requeue
    reader = client.post("/outbox/requeue", json={"projectId": PROJECT}, headers=bearer(READER))
    assert reader.status_code == 403
