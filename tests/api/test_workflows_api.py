"""``/workflows`` over a real runtime on the in-process engine (issue #19): an operator
lists a workflow's instances, reads one's steps, cancels, terminates and redrives; each
control is audited; a tenant's token, a missing scope, an unknown instance and an unknown
workflow are refused as documented. The Step Functions adapter behind the same port is in
tests/integration/test_step_functions_engine.py."""

from __future__ import annotations

from collections import Counter

import pytest
from fastapi.testclient import TestClient

from rhumbatron.runtime.bootstrap import Rhumbatron
from workflow_instances import left_running

from .support import OPERATOR, PLATFORM, bearer

pytestmark = pytest.mark.integration

AS_PLATFORM = bearer(PLATFORM)


def test_an_operator_reads_cancels_terminates_and_redrives_instances_and_each_is_audited(
    runtime: Rhumbatron, client: TestClient
) -> None:
    # GIVEN two verifications left running
    left_running(runtime.settings, runtime.clock, "cand_a")
    left_running(runtime.settings, runtime.clock, "cand_b")
    # WHEN the operator lists the running ones and reads one
    listed = client.get("/workflows/verification?status=running", headers=AS_PLATFORM)
    read = client.get("/workflows/verification/cand_a", headers=AS_PLATFORM)
    # THEN both are listed, and the one read waits on its check step
    assert listed.status_code == 200, listed.text
    assert sorted(i["instanceId"] for i in listed.json()["items"]) == ["cand_a", "cand_b"]
    assert read.json()["pendingStep"] == "check"
    assert [(s["name"], s["status"]) for s in read.json()["steps"]] == [
        ("check", "running"),
        ("decide", "not_started"),
    ]
    # WHEN one is cancelled (twice) and the other terminated
    cancel = {"reason": "wrong candidate"}
    first = client.post("/workflows/verification/cand_a/cancel", json=cancel, headers=AS_PLATFORM)
    again = client.post("/workflows/verification/cand_a/cancel", json=cancel, headers=AS_PLATFORM)
    stop = {"reason": "stuck"}
    ended = client.post("/workflows/verification/cand_b/terminate", json=stop, headers=AS_PLATFORM)
    # THEN the first cancel stopped it, the second changed nothing, the other failed
    assert (first.json()["done"], first.json()["status"]) == (True, "cancelled")
    assert (again.json()["done"], again.json()["status"]) == (False, "cancelled")
    assert (ended.json()["done"], ended.json()["status"]) == (True, "failed")
    # AND a cancelled instance is not redriven, while the terminated one is: it runs the
    # real verification from its check step, which fails on an input with no project
    refused = client.post("/workflows/verification/cand_a/redrive", headers=AS_PLATFORM)
    redriven = client.post("/workflows/verification/cand_b/redrive", headers=AS_PLATFORM)
    assert refused.json()["done"] is False
    assert redriven.json()["done"] is True
    history = client.get("/workflows/verification/cand_b", headers=AS_PLATFORM).json()
    assert history["instance"]["status"] == "failed"
    assert history["steps"][0]["attempts"] == 1
    assert "projectId" in history["steps"][0]["error"]
    # AND every control is in the audit, by name
    audit = client.get("/audit", headers=AS_PLATFORM).json()["items"]
    assert Counter(entry["operation"] for entry in audit) == {
        "cancel_workflow": 2,
        "terminate_workflow": 1,
        "redrive_workflow": 2,
    }


def test_workflow_operations_are_refused_as_documented(
    runtime: Rhumbatron, client: TestClient
) -> None:
    left_running(runtime.settings, runtime.clock, "cand_a")
    # A tenant's token, whatever its scopes: 403 (an instance is the platform's)
    tenant = client.get("/workflows/verification", headers=bearer(OPERATOR))
    assert tenant.status_code == 403, tenant.text
    # An unknown instance: 404; an unknown workflow or a malformed ID: 422
    missing = client.get("/workflows/verification/cand_nobody", headers=AS_PLATFORM)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    gone = client.post(
        "/workflows/release/rel_x_1/cancel", json={"reason": "x"}, headers=AS_PLATFORM
    )
    assert gone.status_code == 404
    assert client.get("/workflows/deploy", headers=AS_PLATFORM).status_code == 422
    bad_id = client.get("/workflows/verification/not%20an%20id", headers=AS_PLATFORM)
    assert bad_id.status_code == 422
    # A stop without a reason: 422 naming it
    no_reason = client.post("/workflows/verification/cand_a/cancel", json={}, headers=AS_PLATFORM)
    assert no_reason.status_code == 422
    assert no_reason.json()["error"]["field"] == "reason"
