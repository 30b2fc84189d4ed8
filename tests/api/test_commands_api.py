"""``POST /commands`` checks what a command refers to before it sends it (issue #19):
a project never provisioned, a Change, a Candidate, a generation never promoted, an app
not live. Each refusal is a 422 in the error model, naming the field, and nothing is
queued."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from rhumbatron.protocol.envelopes import Command
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .conftest import TestClient
from .support import OPERATOR, PLATFORM, PROJECT, bearer, queued

pytestmark = pytest.mark.integration

NEVER_PROVISIONED = "proj-never"


def make(
    command_type: str,
    payload: dict[str, Any],
    *,
    project: str = PROJECT,
    change_id: str | None = "chg-1",
) -> Command:
    return Command.create(
        command_id=f"cmd_{uuid.uuid4().hex}",
        command_type=command_type,
        project_id=project,
        change_id=change_id,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        payload=payload,
    )


def send(client: TestClient, cmd: Command, token: str = OPERATOR) -> Any:
    return client.post(
        "/commands",
        json={"queue": cmd.spec.queue, "command": cmd.to_wire()},
        headers=bearer(token),
    )


def refused_field(response: Any) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "unknown_subject"
    assert "None" not in error["message"]
    return str(error["field"])


@pytest.mark.parametrize(
    ("cmd", "field", "names"),
    [
        pytest.param(
            make("release.start", {"releaseId": "rel-9", "generation": 9}, change_id=None),
            "command.changeId",
            "names no Change",
            id="release-of-no-change",
        ),
        pytest.param(
            make("release.start", {"releaseId": "rel-9", "generation": 9}),
            "command.changeId",
            "Change 'chg-1' does not exist",
            id="release-of-an-unknown-change",
        ),
        pytest.param(
            make("verification.start", {"candidateId": "cand-unknown"}),
            "command.changeId",
            "Change 'chg-1' does not exist",
            id="verification-of-an-unknown-change",
        ),
    ],
)
def test_a_workflow_start_that_refers_to_nothing_is_refused_and_not_sent(
    client: TestClient, nats_server: NatsServerProcess, cmd: Command, field: str, names: str
) -> None:
    # WHEN an operator sends it THEN 422 names the field, and nothing is queued
    response = send(client, cmd)
    assert refused_field(response) == field
    assert names in response.json()["error"]["message"]
    assert queued(nats_server.url, cmd.command_id) == []


def test_an_app_of_a_project_never_provisioned_is_refused_for_a_platform_operator(
    client: TestClient, nats_server: NatsServerProcess
) -> None:
    # GIVEN a project nobody provisioned (a tenant's operator gets 404 for it, as for any
    #   project not theirs; the platform's operator may command any project)
    cmd = make("app.provision", {"appName": "storefront"}, project=NEVER_PROVISIONED)
    assert send(client, cmd).status_code == 404
    # WHEN the platform's operator sends app.provision for it
    response = send(client, cmd, token=PLATFORM)
    # THEN it is refused, naming the project, and nothing is queued
    assert refused_field(response) == "command.projectId"
    assert "was never provisioned" in response.json()["error"]["message"]
    assert queued(nats_server.url, cmd.command_id) == []


def test_the_provisioning_of_a_new_project_passes_the_door(
    client: TestClient, nats_server: NatsServerProcess
) -> None:
    # A project.provision creates its project: that it does not exist yet is the point
    cmd = make(
        "project.provision",
        {"name": "New", "tenantId": "acme"},
        project=NEVER_PROVISIONED,
        change_id=None,
    )
    response = send(client, cmd, token=PLATFORM)
    assert response.status_code == 202, response.text
    assert [m.command["commandId"] for m in queued(nats_server.url, cmd.command_id)] == [
        cmd.command_id
    ]
