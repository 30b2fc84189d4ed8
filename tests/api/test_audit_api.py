"""The audit log (issue #19): every mutation asked of the API — who, what, when and the
outcome — readable through ``GET /audit``, newest first, within the caller's tenant."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta
from typing import Any

import pytest

from rhumbatron.core.clock import ManualClock
from rhumbatron.product.audit import list_audit, prune_audit, record_audit
from rhumbatron.runtime.bootstrap import Rhumbatron

from .conftest import TestClient
from .support import (
    OPERATOR,
    OTHER_OPERATOR,
    PLATFORM,
    READER,
    TENANT,
    bearer,
    command,
    command_letter,
)

pytestmark = pytest.mark.integration

AUTH = bearer(OPERATOR)


def subject_of(token: str) -> str:
    """The principal a static token authenticates as (``token:`` and its digest's start)."""
    return f"token:{hashlib.sha256(token.encode()).hexdigest()[:8]}"


def audit(client: TestClient, token: str = OPERATOR, **query: Any) -> dict[str, Any]:
    response = client.get("/audit", params=query, headers=bearer(token))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_mutation_is_audited_with_who_what_when_and_the_outcome(
    client: TestClient, runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a dead letter of the tenant
    letter_id = command_letter(runtime, command())
    # WHEN the operator dismisses it, and reads the letters (a read)
    assert client.post(f"/dead-letters/{letter_id}/dismiss", headers=AUTH).status_code == 200
    assert client.get("/dead-letters", headers=AUTH).status_code == 200
    # THEN the audit holds the dismissal, and only it: who, what, when and how it ended
    (entry,) = audit(client)["items"]
    assert entry["principal"] == subject_of(OPERATOR)
    assert entry["tenantId"] == TENANT
    assert (entry["operation"], entry["method"]) == ("dismiss_dead_letter", "POST")
    assert entry["path"] == f"/dead-letters/{letter_id}/dismiss"
    assert entry["target"] == {"id": letter_id}
    assert (entry["status"], entry["outcome"], entry["errorCode"]) == (200, "succeeded", None)
    assert entry["at"].startswith(clock.now().date().isoformat())


def test_refusals_are_audited_with_their_error_code_and_reads_never(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # WHEN a reader tries to dismiss (403), the operator dismisses a letter that does not
    #   exist (404) and sends a command naming a Change that does not exist (422)
    assert client.post("/dead-letters/dl_nope/dismiss", headers=bearer(READER)).status_code == 403
    assert client.post("/dead-letters/dl_nope/dismiss", headers=AUTH).status_code == 404
    cmd = command("verification.start")
    sent = client.post(
        "/commands", json={"queue": cmd.spec.queue, "command": cmd.to_wire()}, headers=AUTH
    )
    assert sent.status_code == 422
    # THEN each is audited as refused, newest first, with the error model's code
    items = audit(client)["items"]
    assert [(e["operation"], e["status"], e["outcome"], e["errorCode"]) for e in items] == [
        ("send_command", 422, "refused", "unknown_subject"),
        ("dismiss_dead_letter", 404, "refused", "not_found"),
        ("dismiss_dead_letter", 403, "refused", "insufficient_scope"),
    ]
    assert items[2]["principal"] == subject_of(READER)


def test_a_request_whose_token_does_not_verify_is_audited_for_the_platform_only(
    client: TestClient,
) -> None:
    # WHEN a request with an unknown token tries a mutation
    response = client.post("/dead-letters/dl_x/dismiss", headers=bearer("not-a-token-we-know"))
    assert response.status_code == 401
    # THEN the platform reads it, with no principal; no tenant does
    (entry,) = audit(client, PLATFORM)["items"]
    assert (entry["principal"], entry["tenantId"], entry["errorCode"]) == (
        None,
        None,
        "invalid_token",
    )
    assert audit(client)["items"] == []


def test_each_tenant_reads_its_own_rows_and_the_platform_every_row(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN one mutation by each tenant's operator
    assert client.post("/dead-letters/dl_a/dismiss", headers=AUTH).status_code == 404
    other = client.post("/dead-letters/dl_b/dismiss", headers=bearer(OTHER_OPERATOR))
    assert other.status_code == 404
    # THEN each tenant sees its own; the platform both, or one tenant's when it asks
    assert [e["target"] for e in audit(client)["items"]] == [{"id": "dl_a"}]
    assert [e["target"] for e in audit(client, OTHER_OPERATOR)["items"]] == [{"id": "dl_b"}]
    assert len(audit(client, PLATFORM)["items"]) == 2
    assert [e["target"] for e in audit(client, PLATFORM, tenantId=TENANT)["items"]] == [
        {"id": "dl_a"}
    ]
    # AND a tenant's token cannot ask for another tenant's rows
    refused = client.get("/audit", params={"tenantId": "tenant-b"}, headers=AUTH)
    assert (refused.status_code, refused.json()["error"]["field"]) == (422, "tenantId")


def test_the_audit_needs_its_scope_and_pages_newest_first(client: TestClient) -> None:
    # A token without audit:read
    assert client.get("/audit", headers=bearer(READER)).status_code == 403
    # GIVEN five audited refusals
    ids = [f"dl_{n}" for n in range(5)]
    for letter_id in ids:
        client.post(f"/dead-letters/{letter_id}/dismiss", headers=AUTH)
    # WHEN it is read two at a time
    seen: list[str] = []
    query: dict[str, Any] = {"limit": 2}
    while True:
        page = audit(client, **query)
        seen += [e["target"]["id"] for e in page["items"]]
        if page["next"] is None:
            break
        query["before"] = page["next"]
    # THEN every row came once, newest first
    assert seen == list(reversed(ids))


def test_a_subscriptions_webhook_secret_never_reaches_the_audit(
    client: TestClient, runtime: Rhumbatron
) -> None:
    secret = "whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="
    client.post(
        "/subscriptions",
        json={"name": f"hook-{uuid.uuid4().hex[:6]}", "secret": secret, "url": "https://x"},
        headers=AUTH,
    )
    rows = runtime.product().connection.execute("SELECT * FROM audit_log").fetchall()
    assert rows and not any(secret in str(tuple(row)) for row in rows)


def test_rows_past_their_retention_are_pruned_and_younger_ones_kept(
    runtime: Rhumbatron, clock: ManualClock
) -> None:
    now_s = clock.now().timestamp()
    day = timedelta(days=1).total_seconds()
    with runtime.product().transaction() as db:
        for age_days in (400, 366, 364, 1):
            record_audit(
                db,
                at_s=now_s - age_days * day,
                principal="p",
                tenant_id=TENANT,
                operation="dismiss_dead_letter",
                method="POST",
                path="/x",
                target={},
                status_code=200,
            )
    cutoff = now_s - runtime.settings.audit_retention_days * day
    with runtime.product().transaction() as db:
        assert prune_audit(db, older_than_s=cutoff, limit=1) == 1  # bounded per pass
        assert prune_audit(db, older_than_s=cutoff, limit=10) == 1
    kept = list_audit(runtime.product().connection)
    assert sorted(round((now_s - e.at_s) / day) for e in kept) == [1, 364]
