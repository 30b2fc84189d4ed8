"""Dead letters as operators triage them (issue #19): grouped by what failed, the failure's
IDs and numbers elided; a group retried or dismissed at once, idempotently, with a dry run;
a letter that can only be dismissed offers no Retry."""

from __future__ import annotations

from typing import Any

import pytest

from rhumbatron.operator.letter_groups import normalise_reason
from rhumbatron.runtime.bootstrap import Rhumbatron
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .conftest import TestClient
from .support import (
    OPERATOR,
    OTHER_OPERATOR,
    OTHER_TENANT,
    bearer,
    command,
    command_letter,
    poison_letter,
    queued,
    undecodable_letter,
)

pytestmark = pytest.mark.integration

AUTH = bearer(OPERATOR)


def test_the_same_error_about_different_records_normalises_alike() -> None:
    one = normalise_reason("RuntimeError: no fork for cand_1f2e3d (delivery 4 of 4)")
    two = normalise_reason("RuntimeError:  no fork for cand_9a8b7c (delivery 2 of 4)")
    assert one == two == "RuntimeError: no fork for <id> (delivery <n> of <n>)"
    quoted = normalise_reason("project 'acme-web' has no live app 'storefront'")
    assert quoted == "project '…' has no live app '…'"
    digest = normalise_reason("checksum 9f86d081884c7d659a2feaa0c55ad015 differs")
    assert digest == "checksum <hex> differs"
    # a different error stays apart
    assert normalise_reason("TimeoutError: the registry did not answer") != one


def groups(client: TestClient, token: str = OPERATOR) -> list[dict[str, Any]]:
    response = client.get("/dead-letters/groups", headers=bearer(token))
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["groups"]
    return found


def three_wakes_failing_alike(runtime: Rhumbatron) -> list[Any]:
    cmds = [command("agent.wake") for _ in range(3)]
    for n, cmd in enumerate(cmds):
        command_letter(
            runtime, cmd, reason=f"RuntimeError: agent agent-{n}7 unreachable (delivery {n + 2})"
        )
    return cmds


def test_letters_that_failed_alike_form_one_group_and_a_dismiss_only_one_says_so(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN three agent.wake letters failing alike, a poison event and a body that is no
    #   Command, and a letter of another tenant failing alike
    three_wakes_failing_alike(runtime)
    poison = poison_letter(runtime)
    undecodable = undecodable_letter(runtime)
    command_letter(
        runtime,
        command("agent.wake"),
        tenant=OTHER_TENANT,
        reason="RuntimeError: agent agent-99 unreachable (delivery 4)",
    )
    # WHEN the operator lists the groups
    found = groups(client)
    # THEN the three are one retryable group, first; the other two dismiss-only groups
    shapes = [(g["count"], g["kind"], g["retryable"]) for g in found]
    assert shapes[0] == (3, "command", True)
    assert sorted(shapes[1:]) == [(1, "command", False), (1, "poison_event", False)]
    wakes = found[0]
    assert (wakes["queue"], wakes["commandType"]) == ("agent-wakeups", "agent.wake")
    assert wakes["reason"] == "RuntimeError: agent <id> unreachable (delivery <n>)"
    assert {g["letterIds"][0] for g in found[1:]} == {poison, undecodable}
    # AND each letter says whether it can be retried, in the list too
    listed = client.get("/dead-letters", headers=AUTH).json()["items"]
    retryable = {item["id"]: item["retryable"] for item in listed}
    assert (retryable[poison], retryable[undecodable]) == (False, False)
    assert sum(retryable.values()) == 3
    # AND the other tenant sees only its own letter
    assert [g["count"] for g in groups(client, OTHER_OPERATOR)] == [1]


def test_a_group_retry_sends_each_letter_once_even_when_asked_twice(
    client: TestClient, runtime: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a group of three letters
    cmds = three_wakes_failing_alike(runtime)
    (group,) = groups(client)
    url = f"/dead-letters/groups/{group['id']}/retry"
    # WHEN it is retried as a dry run THEN it says the three, and sends nothing
    dry = client.post(url, json={"dryRun": True}, headers=AUTH).json()
    assert (dry["dryRun"], dry["count"], sorted(dry["done"])) == (
        True,
        3,
        sorted(group["letterIds"]),
    )
    assert all(queued(nats_server.url, c.command_id) == [] for c in cmds)
    # WHEN it is retried, twice
    first = client.post(url, json={}, headers=AUTH)
    second = client.post(url, json={}, headers=AUTH)
    # THEN the first sent each command once as attempt 2; the second sent nothing more
    assert first.status_code == 200, first.text
    assert (first.json()["count"], first.json()["already"]) == (3, [])
    assert (second.json()["count"], len(second.json()["already"])) == (0, 3)
    for cmd in cmds:
        assert [m.command["attempt"] for m in queued(nats_server.url, cmd.command_id)] == [2]


def test_a_dismiss_only_group_refuses_retry_and_a_dismissed_group_is_gone(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN a poison event's group
    poison = poison_letter(runtime)
    (group,) = groups(client)
    # WHEN it is retried THEN 409 says it can only be dismissed
    refused = client.post(f"/dead-letters/groups/{group['id']}/retry", json={}, headers=AUTH)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "not_retryable"
    assert "can only be dismissed" in refused.json()["error"]["message"]
    # WHEN it is dismissed (a dry run first) THEN its letter is closed, and the group gone
    url = f"/dead-letters/groups/{group['id']}/dismiss"
    assert client.post(url, json={"dryRun": True}, headers=AUTH).json()["done"] == [poison]
    assert client.get(f"/dead-letters/{poison}", headers=AUTH).json()["status"] == "open"
    assert client.post(url, json={}, headers=AUTH).json()["done"] == [poison]
    assert client.get(f"/dead-letters/{poison}", headers=AUTH).json()["status"] == "closed"
    assert groups(client) == []
    # AND asked again, no open letter is left in it: 404, nothing changes
    again = client.post(url, json={}, headers=AUTH)
    assert (again.status_code, again.json()["error"]["code"]) == (404, "not_found")


def test_another_tenants_group_is_not_found(client: TestClient, runtime: Rhumbatron) -> None:
    three_wakes_failing_alike(runtime)
    (group,) = groups(client)
    other = client.post(
        f"/dead-letters/groups/{group['id']}/dismiss", json={}, headers=bearer(OTHER_OPERATOR)
    )
    assert other.status_code == 404
    assert groups(client)[0]["count"] == 3
