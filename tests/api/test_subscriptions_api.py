"""``/subscriptions`` over a real runtime: create (idempotent per name), read, list, govern and
delete; a webhook's generated secret shown once and never again; the agents' scopes; another
tenant's subscription not found; and 422s that name the field at fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rhumbatron.agents.signing import generate_secret
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.reactions.webhook_attempts import record_attempt
from rhumbatron.reactions.webhook_ledger import Attempt, RetryPolicy
from rhumbatron.runtime.bootstrap import Rhumbatron
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import (
    OPERATOR,
    OTHER_OPERATOR,
    OTHER_TENANT,
    PLATFORM,
    READER,
    TENANT,
    TOKENS,
    bearer,
)

pytestmark = pytest.mark.integration

VIEWER = "subs-viewer-token-aaaaaaaaa"
AUTH = bearer(OPERATOR)
HOOK = "http://127.0.0.1:8123/hook"


@pytest.fixture
def api_settings(tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    """The API tests' settings, with a read-only token and the loopback webhook host allowed."""
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        api_tokens={**TOKENS, VIEWER: {"tenant": TENANT, "scopes": ["agents:read"]}},
        webhook_allowed_hosts=("127.0.0.1",),
        nats_connect_timeout_s=0.5,
    )


def _workflow(name: str = "on-failures", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "selector": {"kinds": ["task.failed"]},
        "reaction": {"kind": "workflow", "workflow": "bisect"},
        **extra,
    }


def _create(client: TestClient, body: dict[str, Any], token: str = OPERATOR) -> Any:
    return client.post("/subscriptions", json=body, headers=bearer(token))


def test_a_subscription_is_created_read_listed_governed_and_deleted(client: TestClient) -> None:
    # GIVEN a workflow subscription on task failures with a filter
    body = _workflow(
        selector={"kinds": ["task.failed", "release.*"], "filter": {"subject.projectId": "web"}}
    )
    # WHEN it is created, then created again the same way
    created = _create(client, body)
    again = _create(client, body)
    # THEN the first is 201, the second 200 with the same subscription
    assert created.status_code == 201, created.text
    sub = created.json()
    assert again.status_code == 200 and again.json() == sub
    assert sub["subscriptionId"].startswith("sub_") and sub["tenantId"] == TENANT
    assert sub["selector"] == {
        "kinds": ["task.failed", "release.*"],
        "filter": {"subject.projectId": "web"},
    }
    assert sub["reaction"] == {"kind": "workflow", "workflow": "bisect"}
    assert sub["governance"] == {"cooldownS": 0, "enabled": True}
    url = f"/subscriptions/{sub['subscriptionId']}"
    # AND it is read and listed
    assert client.get(url, headers=AUTH).json() == sub
    assert client.get("/subscriptions", headers=AUTH).json() == {"items": [sub]}
    # WHEN it is disabled with a cooldown
    patched = client.patch(url, json={"enabled": False, "cooldownS": 60}, headers=AUTH)
    # THEN its governance changed, and it is off the enabled-only list
    assert patched.status_code == 200, patched.text
    assert patched.json()["governance"] == {"cooldownS": 60, "enabled": False}
    listed = client.get("/subscriptions", params={"enabledOnly": "true"}, headers=AUTH)
    assert listed.json() == {"items": []}
    # WHEN it is deleted  THEN it is answered once, and then not found
    deleted = client.delete(url, headers=AUTH)
    assert deleted.status_code == 200 and deleted.json()["name"] == "on-failures"
    gone = client.get(url, headers=AUTH)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert client.delete(url, headers=AUTH).status_code == 404


def test_the_governance_a_subscription_is_created_with_is_stored_and_read_back(
    client: TestClient,
) -> None:
    # GIVEN a subscription created disabled, with a cooldown
    body = _workflow(governance={"cooldownS": 30, "enabled": False})
    created = _create(client, body)
    assert created.status_code == 201, created.text
    sub = created.json()
    # WHEN it is read, listed, and created again the same way
    read = client.get(f"/subscriptions/{sub['subscriptionId']}", headers=AUTH).json()
    everything = client.get("/subscriptions", headers=AUTH).json()
    enabled = client.get("/subscriptions", params={"enabledOnly": "true"}, headers=AUTH).json()
    again = _create(client, body)
    # THEN every answer holds the governance it was created with, as the store keeps it
    assert read["governance"] == {"cooldownS": 30, "enabled": False}
    assert everything == {"items": [read]}
    assert enabled == {"items": []}
    assert again.status_code == 200 and again.json() == read


def test_other_content_under_a_taken_name_is_409(client: TestClient) -> None:
    # GIVEN a subscription named on-failures
    assert _create(client, _workflow()).status_code == 201
    # WHEN another reaction is created under the same name
    answer = _create(client, {**_workflow(), "reaction": {"kind": "workflow", "workflow": "x"}})
    # THEN it is a conflict naming the name
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "subscription_exists"
    assert answer.json()["error"]["field"] == "name"


def test_a_webhook_secret_is_generated_and_shown_only_once(client: TestClient) -> None:
    # GIVEN a webhook reaction without secrets, to a URL with credentials in its query
    body = {
        **_workflow("hook"),
        "reaction": {"kind": "webhook", "url": HOOK + "?token=abc", "timeoutS": 2.5},
    }
    # WHEN it is created twice and read
    first = _create(client, body).json()
    again = _create(client, body).json()
    read = client.get(f"/subscriptions/{first['subscriptionId']}", headers=AUTH).json()
    # THEN the first answer shows the generated secret; no later one does; no query is shown
    assert first["reaction"]["secret"].startswith("whsec_")
    assert first["reaction"]["secretCount"] == 1
    assert first["reaction"]["url"] == HOOK and first["reaction"]["timeoutS"] == 2.5
    assert again["reaction"]["secret"] is None and read["reaction"]["secret"] is None
    assert again["subscriptionId"] == first["subscriptionId"]


def test_given_secrets_are_counted_and_a_malformed_one_is_refused_unquoted(
    client: TestClient,
) -> None:
    # GIVEN two secrets (a rotation)
    secrets = [generate_secret(), generate_secret()]
    body = {**_workflow("hook"), "reaction": {"kind": "webhook", "url": HOOK, "secrets": secrets}}
    # WHEN created  THEN both sign, and neither is shown
    answer = _create(client, body)
    assert answer.status_code == 201
    assert answer.json()["reaction"]["secretCount"] == 2
    assert all(secret not in answer.text for secret in secrets)
    # WHEN a malformed secret, or three, are given  THEN 422 on reaction.secrets, unquoted
    bad = {**body, "name": "bad", "reaction": {**body["reaction"], "secrets": ["sekrit-value"]}}
    refused = _create(client, bad)
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "reaction.secrets"
    assert "whsec_" in refused.text and "sekrit-value" not in refused.text
    three = {**body, "name": "three", "reaction": {**body["reaction"], "secrets": secrets * 2}}
    too_many = _create(client, three)
    assert too_many.status_code == 422 and too_many.json()["error"]["field"] == "reaction.secrets"


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "http://10.1.2.3/admin", "ftp://x/"]
)
def test_an_unsafe_webhook_url_is_422_on_reaction_url(client: TestClient, url: str) -> None:
    # GIVEN a webhook to a metadata, private or non-HTTP address  WHEN it is created
    answer = _create(client, {**_workflow("hook"), "reaction": {"kind": "webhook", "url": url}})
    # THEN 422 naming reaction.url, and nothing is stored
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == "reaction.url"
    assert client.get("/subscriptions", headers=AUTH).json() == {"items": []}


def test_an_agent_reaction_names_an_agent_of_the_callers_tenant(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN an agent of the tenant and one of another tenant
    registry = runtime.lifecycle().registry
    registry.register_scripted(TENANT, "reviewer")
    registry.register_scripted(OTHER_TENANT, "their-reviewer")
    agent = {**_workflow("review"), "reaction": {"kind": "agent", "agentId": "reviewer"}}
    # WHEN the tenant subscribes its agent, then the other tenant's
    mine = _create(client, agent)
    theirs = _create(
        client,
        {**agent, "name": "theirs", "reaction": {"kind": "agent", "agentId": "their-reviewer"}},
    )
    # THEN its own is taken; the other is 422 on reaction.agentId
    assert mine.status_code == 201
    assert mine.json()["reaction"] == {"kind": "agent", "agentId": "reviewer"}
    assert theirs.status_code == 422
    assert theirs.json()["error"]["field"] == "reaction.agentId"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "has space"}, "name"),
        ({"selector": {"kinds": ["task.complete"]}}, "selector.kinds"),
        ({"selector": {"kinds": ["*"]}}, "selector.kinds"),
        ({"selector": {"kinds": ["task.failed"], "filter": {"payload.nope": "x"}}}, "selector"),
        ({"reaction": {"kind": "mattermost"}}, "reaction"),
        ({"reaction": {"kind": "workflow", "workflow": ""}}, "reaction.workflow.workflow"),
        ({"governance": {"cooldownS": -1}}, "governance.cooldownS"),
    ],
)
def test_an_invalid_request_is_422_naming_the_field(
    client: TestClient, change: dict[str, Any], field: str
) -> None:
    # GIVEN a request with one bad field  WHEN it is sent
    answer = _create(client, {**_workflow(), **change})
    # THEN 422 names that field
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == field


def test_reads_need_agents_read_and_writes_agents_write(client: TestClient) -> None:
    # GIVEN a subscription
    sub = _create(client, _workflow()).json()
    url = f"/subscriptions/{sub['subscriptionId']}"
    # WHEN a token with agents:read only reads, and then writes
    # THEN it reads; every write is 403 naming agents:write
    assert client.get(url, headers=bearer(VIEWER)).status_code == 200
    assert client.get("/subscriptions", headers=bearer(VIEWER)).status_code == 200
    for answer in (
        _create(client, _workflow("other"), token=VIEWER),
        client.patch(url, json={"enabled": False}, headers=bearer(VIEWER)),
        client.delete(url, headers=bearer(VIEWER)),
    ):
        assert answer.status_code == 403
        assert "'agents:write'" in answer.json()["error"]["message"]
    # AND a token without agents:read cannot list (403), nor can no token (401)
    denied = client.get("/subscriptions", headers=bearer(READER))
    assert denied.status_code == 403 and "'agents:read'" in denied.json()["error"]["message"]
    assert client.get("/subscriptions").status_code == 401


def test_another_tenants_subscription_is_not_found_and_the_platform_sees_all(
    client: TestClient,
) -> None:
    # GIVEN a subscription of each tenant
    mine = _create(client, _workflow()).json()
    theirs = _create(client, _workflow(), token=OTHER_OPERATOR).json()
    url = f"/subscriptions/{mine['subscriptionId']}"
    other = bearer(OTHER_OPERATOR)
    # WHEN the other tenant reads, governs or deletes mine
    # THEN each is 404, and its list holds only its own
    assert client.get(url, headers=other).status_code == 404
    assert client.patch(url, json={"enabled": False}, headers=other).status_code == 404
    assert client.delete(url, headers=other).status_code == 404
    assert client.get("/subscriptions", headers=other).json() == {"items": [theirs]}
    assert client.get(url, headers=AUTH).json()["governance"]["enabled"] is True
    # AND a platform token lists both and may govern, but cannot create (owns nothing)
    platform = bearer(PLATFORM)
    assert client.get("/subscriptions", headers=platform).json() == {"items": [mine, theirs]}
    assert client.patch(url, json={"enabled": False}, headers=platform).status_code == 200
    refused = _create(client, _workflow("platform"), token=PLATFORM)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "tenant_required"


def test_an_unknown_subscription_id_is_404_and_a_malformed_one_422(client: TestClient) -> None:
    # GIVEN no subscription  WHEN a well-formed and a malformed ID are read
    missing = client.get("/subscriptions/sub_" + "0" * 32, headers=AUTH)
    malformed = client.get("/subscriptions/nope", headers=AUTH)
    # THEN 404 and 422 on the path parameter
    assert missing.status_code == 404
    assert malformed.status_code == 422
    assert malformed.json()["error"]["field"] == "subscriptionId"


# -- webhook deliveries: the ledger through the API ---------------------------------------------


def _answered(runtime: Rhumbatron, subscription_id: str, n: int, attempt: Attempt) -> str:
    """The reactions consumer's first attempt of a delivery, as the ledger records it."""
    key = f"evt_{n:032x}:{subscription_id}"
    with runtime.product().transaction() as db:
        disabled = record_attempt(
            db,
            delivery_key=key,
            tenant_id=TENANT,
            project_id="acme-web",
            event_id=f"evt_{n:032x}",
            event_type="task.completed",
            subscription_id=subscription_id,
            body=b'{"eventId": "x"}',
            attempt=attempt,
            now_s=runtime.clock.now().timestamp(),
            policy=RetryPolicy(schedule_s=(), disable_after_s=10**9),
        )
    assert disabled is None or disabled.subscription_id == subscription_id
    return key


def _webhook(name: str = "hook") -> dict[str, Any]:
    return {
        "name": name,
        "selector": {"kinds": ["task.completed"]},
        "reaction": {"kind": "webhook", "url": HOOK},
    }


def test_a_disabled_endpoints_deliveries_are_listed_and_replayed_once_enabled(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN a webhook subscription whose endpoint answered 410 Gone to a delivery
    sub = _create(client, _webhook()).json()["subscriptionId"]
    key = _answered(runtime, sub, 1, Attempt(ok=False, status_code=410, error="gone"))

    # WHEN its record and its skipped deliveries are read, and a replay is asked for
    record = client.get(f"/subscriptions/{sub}", headers=AUTH).json()
    listed = client.get(f"/subscriptions/{sub}/deliveries?status=skipped", headers=AUTH)
    refused = client.post(f"/subscriptions/{sub}/deliveries/replay", headers=AUTH)
    # THEN it says the platform disabled it and why; the delivery is kept; the replay is 409
    assert record["governance"]["enabled"] is False
    assert record["endpointDisabled"]["reason"] == "gone"
    assert [(d["webhookId"], d["status"], d["lastStatusCode"]) for d in listed.json()["items"]] == [
        (key, "skipped", 410)
    ]
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "subscription_disabled"

    # WHEN an operator enables it, then replays (another tenant cannot)
    enabled = client.patch(f"/subscriptions/{sub}", json={"enabled": True}, headers=AUTH)
    foreign = client.post(f"/subscriptions/{sub}/deliveries/replay", headers=bearer(OTHER_OPERATOR))
    replayed = client.post(f"/subscriptions/{sub}/deliveries/replay", headers=AUTH)
    # THEN the disablement is gone, and the one delivery is due again
    assert enabled.json()["endpointDisabled"] is None and enabled.json()["governance"]["enabled"]
    assert foreign.status_code == 404
    assert replayed.status_code == 200 and replayed.json() == {"replayed": 1}
    due = client.get(f"/subscriptions/{sub}/deliveries", headers=AUTH).json()["items"]
    assert [(d["status"], d["attempts"]) for d in due] == [("retrying", 0)]


def test_a_dead_webhook_delivery_is_a_reaction_letter_an_operator_retries(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN a webhook delivery that failed with no retry left (a schedule of none)
    sub = _create(client, _webhook()).json()["subscriptionId"]
    key = _answered(runtime, sub, 2, Attempt(ok=False, status_code=500, error="boom"))

    # WHEN the reaction letters are listed, and the letter is retried
    letters = client.get("/dead-letters?kind=reaction", headers=AUTH).json()["items"]
    retried = client.post(f"/dead-letters/{letters[0]['id']}/retry", headers=AUTH)

    # THEN the letter names the delivery, and the Retry made it due again
    assert [(x["kind"], x["eventId"], x["consumer"]) for x in letters] == [
        ("reaction", key, "reactions")
    ]
    assert retried.status_code == 200, retried.text
    assert (retried.json()["queue"], retried.json()["messageId"], retried.json()["sent"]) == (
        "reactions",
        key,
        True,
    )
    (due,) = client.get(f"/subscriptions/{sub}/deliveries", headers=AUTH).json()["items"]
    assert due["status"] == "retrying"
