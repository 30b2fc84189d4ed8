"""The operator API over real dead letters, a real runtime and a real nats-server.

Letters are written by the product functions the router and the dead-letter consumer use;
what a Retry or a command sent is read back from the COMMANDS stream itself (its
``Nats-Msg-Id`` and body), not from the API's answer.
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import timedelta
from typing import Any

import pytest

from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.core.clock import ManualClock
from rhumbatron.domain.facts import Caller
from rhumbatron.product.dead_letters import (
    Resolution,
    claim_retry,
    close_command_dead_letter,
    get_dead_letter,
)
from rhumbatron.runtime.bootstrap import Rhumbatron
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .conftest import TestClient, make_client, make_runtime
from .support import (
    OPERATOR,
    OTHER_OPERATOR,
    OTHER_TENANT,
    PLATFORM,
    PROJECT,
    READER,
    SENDER,
    TENANT,
    bearer,
    command,
    command_letter,
    poison_letter,
    publish_command,
    queued,
    reservation,
    undecodable_letter,
    wait_until,
)

pytestmark = pytest.mark.integration

AUTH = bearer(OPERATOR)


def error_of(response: Any) -> dict[str, Any]:
    """The error model's body, checked to be exactly that model."""
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "field"}
    error: dict[str, Any] = body["error"]
    return error


# --------------------------------------------------------------------------- list and inspect


def test_list_filters_by_status_kind_queue_and_project_oldest_first(
    client: TestClient, runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN letters of several kinds, queues, projects and states
    wake = command_letter(runtime, command("agent.wake"))
    clock.advance(1)
    settle = command_letter(runtime, command("change.settle"))
    clock.advance(1)
    other_project = command_letter(runtime, command("change.settle", project="acme-api"))
    clock.advance(1)
    poison = poison_letter(runtime)
    clock.advance(1)
    closed = command_letter(runtime, cleared := command("change.settle"))
    with runtime.product().transaction() as db:
        close_command_dead_letter(db, cleared.command_id, Resolution.SUCCEEDED, now_s=0)

    def ids(**query: str) -> list[str]:
        response = client.get("/dead-letters", params=query, headers=AUTH)
        assert response.status_code == 200, response.text
        return [item["id"] for item in response.json()["items"]]

    # WHEN the operator filters THEN each filter narrows the open letters, oldest first
    assert ids() == [wake, settle, other_project, poison]
    assert ids(status="closed") == [closed]
    assert ids(status="all") == [wake, settle, other_project, poison, closed]
    assert ids(kind="poison_event") == [poison]
    assert ids(kind="command", queue="agent-wakeups") == [wake]
    assert ids(queue="integration") == [settle, other_project]
    assert ids(projectId="acme-api") == [other_project]


def test_list_pages_with_the_next_cursor_until_the_last_page(
    client: TestClient, runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN five open letters
    letters = []
    for _ in range(5):
        letters.append(command_letter(runtime, command()))
        clock.advance(1)
    # WHEN the operator reads pages of two
    seen: list[str] = []
    pages = 0
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        page = client.get("/dead-letters", params=params, headers=AUTH).json()
        pages += 1
        seen += [item["id"] for item in page["items"]]
        after = page["next"]
        if after is None:
            break
    # THEN every letter comes once, in order, and the last page has no next
    assert seen == letters
    assert pages == 3


def test_a_page_cursor_naming_no_letter_is_422_on_after(client: TestClient) -> None:
    response = client.get("/dead-letters", params={"after": "dl_nothing"}, headers=AUTH)
    assert response.status_code == 422
    assert error_of(response)["field"] == "after"


def test_inspect_shows_the_full_command_last_error_attempts_and_resolution(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN a dead-lettered agent.wake
    cmd = command("agent.wake")
    letter_id = command_letter(runtime, cmd, reason="TimeoutError: agent did not answer")
    # WHEN the operator inspects it
    response = client.get(f"/dead-letters/{letter_id}", headers=bearer(READER))
    # THEN the answer carries the whole command, the last error, attempts and resolution
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["command"] == cmd.to_wire()
    assert body["bodyJson"] == cmd.to_wire()
    assert body["lastError"] == "TimeoutError: agent did not answer"
    assert (body["attempt"], body["retriedAttempt"]) == (1, None)
    assert (body["status"], body["resolution"]) == ("open", None)
    assert (body["kind"], body["queue"], body["tenantId"]) == ("command", "agent-wakeups", TENANT)


def test_inspect_of_an_undecodable_letter_says_why_it_is_no_command(
    client: TestClient, runtime: Rhumbatron
) -> None:
    letter_id = undecodable_letter(runtime)
    body = client.get(f"/dead-letters/{letter_id}", headers=AUTH).json()
    assert (body["command"], body["bodyJson"], body["body"]) == (None, None, "{not json")
    assert "not JSON" in body["bodyProblem"]


# --------------------------------------------------------------------------- Retry


@pytest.mark.parametrize(
    ("command_type", "queue"),
    [
        ("agent.wake", "agent-wakeups"),
        ("change.settle", "integration"),
        ("verification.start", "integration"),
        ("release.start", "integration"),
    ],
)
def test_retry_sends_the_command_once_with_attempt_two_on_its_retry_queue(
    client: TestClient,
    runtime: Rhumbatron,
    nats_server: NatsServerProcess,
    command_type: str,
    queue: str,
) -> None:
    # GIVEN a command sent, failed on its queue, and dead-lettered — all within the window
    #   (the workflow starts name a Candidate and a generation that do not exist: the door
    #   of POST /commands would refuse them, a producer inside the system sent them)
    cmd = command(command_type)
    if command_type.endswith(".start"):
        publish_command(nats_server.url, cmd)
    else:
        first = client.post(
            "/commands", json={"queue": cmd.spec.queue, "command": cmd.to_wire()}, headers=AUTH
        )
        assert first.status_code == 202, first.text
    letter_id = command_letter(runtime, cmd)
    # WHEN the operator clicks Retry
    response = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH)
    # THEN the command is on its retry queue again, attempt 2, under a message ID of its own
    # (the window keeps the first ID, and would have dropped a repeat of it)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["sent"], body["duplicate"], body["attempt"]) == (True, False, 2)
    assert body["messageId"] == f"{queue}:{cmd.command_id}:2"
    stored = queued(nats_server.url, cmd.command_id)
    assert [(m.subject, m.message_id, m.command["attempt"]) for m in stored] == [
        (f"cmd.{cmd.spec.queue}", f"{cmd.spec.queue}:{cmd.command_id}", 1),
        (f"cmd.{queue}", f"{queue}:{cmd.command_id}:2", 2),
    ]
    assert stored[1].command == cmd.model_copy(update={"attempt": 2}).to_wire()
    # AND the letter stays open until the command succeeds or fails again
    letter = body["deadLetter"]
    assert (letter["status"], letter["retriedAttempt"]) == ("open", 2)


def test_a_double_click_on_retry_sends_one_message(
    client: TestClient, runtime: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a dead-lettered command
    cmd = command()
    letter_id = command_letter(runtime, cmd)
    # WHEN Retry is clicked twice
    first = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH).json()
    second = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH).json()
    # THEN one message went out; the second click says the attempt was already retried
    assert (first["sent"], first["alreadyRetriedAs"]) == (True, None)
    assert (second["sent"], second["alreadyRetriedAs"]) == (False, 2)
    assert [m.message_id for m in queued(nats_server.url, cmd.command_id)] == [
        f"integration:{cmd.command_id}:2"
    ]


@pytest.mark.parametrize("processes", [1, 2], ids=["one-process", "two-processes"])
def test_two_concurrent_retries_send_one_message(
    runtime: Rhumbatron,
    clock: ManualClock,
    nats_server: NatsServerProcess,
    processes: int,
) -> None:
    # GIVEN a dead-lettered command, and two operators on one API process or on two
    cmd = command()
    letter_id = command_letter(runtime, cmd)
    other = make_runtime(runtime.settings, clock) if processes == 2 else None
    with make_client(runtime) as first_client:
        if other is None:
            clients = [first_client, first_client]
            answers = _at_once(clients, f"/dead-letters/{letter_id}/retry")
        else:
            with make_client(other) as second_client:
                clients = [first_client, second_client]
                answers = _at_once(clients, f"/dead-letters/{letter_id}/retry")
    # WHEN both click Retry at the same moment THEN exactly one sends
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    bodies = [a.json() for a in answers]
    assert sorted(b["sent"] for b in bodies) == [False, True]
    assert {b["attempt"] for b in bodies} == {2}
    assert [m.message_id for m in queued(nats_server.url, cmd.command_id)] == [
        f"integration:{cmd.command_id}:2"
    ]


def _at_once(clients: list[TestClient], path: str) -> list[Any]:
    """POST ``path`` from one thread per client, released together."""
    barrier = threading.Barrier(len(clients))
    answers: list[Any] = [None] * len(clients)

    def click(index: int, client: TestClient) -> None:
        barrier.wait()
        answers[index] = client.post(path, headers=AUTH)

    threads = [threading.Thread(target=click, args=(i, c)) for i, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return answers


def test_a_retry_that_failed_again_is_retried_as_attempt_three(
    client: TestClient, runtime: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a command retried once, which failed again (the consumer reopens its letter)
    cmd = command("agent.wake")
    letter_id = command_letter(runtime, cmd)
    assert client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH).json()["sent"]
    command_letter(runtime, cmd.model_copy(update={"attempt": 2}))
    # WHEN the operator clicks Retry again
    body = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH).json()
    # THEN attempt 3 goes out under its own message ID
    assert (body["sent"], body["attempt"]) == (True, 3)
    assert [m.message_id for m in queued(nats_server.url, cmd.command_id)] == [
        f"agent-wakeups:{cmd.command_id}:2",
        f"agent-wakeups:{cmd.command_id}:3",
    ]


def test_a_reservation_whose_sender_died_is_sent_by_a_later_retry_once(
    client: TestClient, runtime: Rhumbatron, clock: ManualClock, nats_server: NatsServerProcess
) -> None:
    # GIVEN a Retry reserved by a process that died before it sent anything
    cmd = command()
    letter_id = command_letter(runtime, cmd)
    with runtime.product().transaction() as db:
        claim_retry(db, letter_id, now_s=clock.now().timestamp())
    # WHEN another Retry comes once the reservation is older than any send could take
    clock.advance(runtime.settings.api_retry_resend_after_s + 1)
    first = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH).json()
    second = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH).json()
    # THEN the reserved attempt goes out once; a repeat is dropped by JetStream's window
    assert (first["sent"], first["attempt"], first["alreadyRetriedAs"]) == (True, 2, 2)
    assert (second["sent"], second["duplicate"]) == (False, True)
    assert [m.message_id for m in queued(nats_server.url, cmd.command_id)] == [
        f"integration:{cmd.command_id}:2"
    ]


def test_retry_with_nats_down_is_503_and_undoes_the_reservation(
    client: TestClient, runtime: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a dead-lettered command, and a connected API whose NATS server then stops
    cmd = command()
    letter_id = command_letter(runtime, cmd)
    assert client.get("/health").json()["nats"] is True
    nats_server.stop()
    try:
        # WHEN the operator clicks Retry
        response = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH)
        # THEN 503 with Retry-After, and the reservation is given back
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == str(runtime.settings.api_retry_after_s)
        error = error_of(response)
        assert error["code"] == "nats_unavailable"
        assert "retry again" in error["message"]
        assert reservation(runtime, letter_id) == (None, None)
        # AND a caller without a token learns nothing about NATS: still 401
        anonymous = client.post(f"/dead-letters/{letter_id}/retry")
        assert anonymous.status_code == 401
    finally:
        nats_server.start()
    # AND once NATS is back, the next click sends attempt 2, once
    wait_until(lambda: client.get("/health").status_code == 200)
    body = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH).json()
    assert (body["sent"], body["attempt"]) == (True, 2)
    assert [m.message_id for m in queued(nats_server.url, cmd.command_id)] == [
        f"integration:{cmd.command_id}:2"
    ]


def test_a_product_file_held_by_another_writer_is_503_with_retry_after(
    runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN an API whose product file another process holds past the busy timeout
    letter_id = command_letter(runtime, command())
    impatient = make_runtime(
        runtime.settings.model_copy(update={"sqlite_busy_timeout_ms": 50}), clock
    )
    holder = sqlite3.connect(runtime.product().path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with make_client(impatient) as client:
            # WHEN the operator dismisses a letter
            response = client.post(f"/dead-letters/{letter_id}/dismiss", headers=AUTH)
        # THEN 503 storage_busy with Retry-After; nothing changed
        assert response.status_code == 503, response.text
        assert error_of(response)["code"] == "storage_busy"
        assert "Retry-After" in response.headers
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    letter = get_dead_letter(runtime.product().connection, letter_id)
    assert (letter.status, letter.resolution) == ("open", None)


# --------------------------------------------------------------------------- Dismiss, 404, 409


def test_dismiss_closes_the_letter_and_a_second_action_is_409(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN an open letter
    letter_id = command_letter(runtime, command())
    # WHEN the operator dismisses it
    response = client.post(f"/dead-letters/{letter_id}/dismiss", headers=AUTH)
    # THEN it is closed as dismissed, and Retry or Dismiss again is 409
    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["resolution"]) == ("closed", "dismissed")
    for action in ("retry", "dismiss"):
        again = client.post(f"/dead-letters/{letter_id}/{action}", headers=AUTH)
        assert again.status_code == 409, again.text
        assert error_of(again)["code"] == "already_closed"


def test_retry_of_a_letter_that_closed_as_succeeded_is_409(
    client: TestClient, runtime: Rhumbatron
) -> None:
    cmd = command()
    letter_id = command_letter(runtime, cmd)
    with runtime.product().transaction() as db:
        close_command_dead_letter(db, cmd.command_id, Resolution.SUCCEEDED, now_s=0)
    response = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH)
    assert response.status_code == 409
    assert "succeeded" in error_of(response)["message"]


def test_another_tenants_letter_is_404_like_an_unknown_one(
    client: TestClient, runtime: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a letter of tenant A
    cmd = command()
    letter_id = command_letter(runtime, cmd, tenant=TENANT)
    other = bearer(OTHER_OPERATOR)
    # WHEN tenant B lists, inspects, retries or dismisses it
    listed = client.get("/dead-letters", headers=other).json()["items"]
    answers = [
        client.get(f"/dead-letters/{letter_id}", headers=other),
        client.post(f"/dead-letters/{letter_id}/retry", headers=other),
        client.post(f"/dead-letters/{letter_id}/dismiss", headers=other),
    ]
    unknown = client.get("/dead-letters/dl_unknown", headers=other)
    # THEN it does not exist for B: 404 with the words of an unknown ID, nothing sent
    assert listed == []
    assert [a.status_code for a in answers] == [404, 404, 404]
    assert {error_of(a)["message"] for a in answers} == {f"no dead letter {letter_id!r}"}
    assert error_of(unknown)["message"] == "no dead letter 'dl_unknown'"
    assert queued(nats_server.url, cmd.command_id) == []
    assert client.get(f"/dead-letters/{letter_id}", headers=AUTH).json()["status"] == "open"


def test_a_platform_operator_sees_every_tenant_and_letters_without_one(
    client: TestClient, runtime: Rhumbatron
) -> None:
    mine = command_letter(runtime, command(), tenant=TENANT)
    theirs = command_letter(runtime, command(), tenant=OTHER_TENANT)
    nobodys = command_letter(runtime, command("forks.sweep"), tenant=None)
    items = client.get("/dead-letters", headers=bearer(PLATFORM)).json()["items"]
    assert {item["id"] for item in items} == {mine, theirs, nobodys}
    assert client.get(f"/dead-letters/{nobodys}", headers=AUTH).status_code == 404


def test_a_poison_event_cannot_be_retried_only_dismissed(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # GIVEN a poison-event letter
    letter_id = poison_letter(runtime)
    # WHEN the operator clicks Retry THEN 409 says it can only be dismissed
    response = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH)
    assert response.status_code == 409
    error = error_of(response)
    assert (error["code"], "can only be dismissed" in error["message"]) == ("not_retryable", True)
    # AND Dismiss closes it
    dismissed = client.post(f"/dead-letters/{letter_id}/dismiss", headers=AUTH)
    assert dismissed.json()["resolution"] == "dismissed"


def test_a_letter_whose_body_is_no_command_is_409_and_keeps_no_reservation(
    client: TestClient, runtime: Rhumbatron
) -> None:
    letter_id = undecodable_letter(runtime)
    response = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH)
    assert response.status_code == 409
    assert "can only be dismissed" in error_of(response)["message"]
    assert reservation(runtime, letter_id) == (None, None)


# --------------------------------------------------------------------------- auth (B4)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/dead-letters"),
        ("GET", "/dead-letters/dl_x"),
        ("POST", "/dead-letters/dl_x/retry"),
        ("POST", "/dead-letters/dl_x/dismiss"),
        ("POST", "/commands"),
    ],
)
@pytest.mark.parametrize(
    ("headers", "code", "challenge"),
    [
        ({}, "missing_token", "Bearer"),
        ({"Authorization": "Basic b3A6cGFzcw=="}, "missing_token", "Bearer"),
        (bearer("not-a-token-we-know-at-all"), "invalid_token", 'Bearer error="invalid_token"'),
    ],
    ids=["no-token", "not-bearer", "unknown-token"],
)
def test_a_call_without_a_valid_token_is_401_with_a_bearer_challenge(
    client: TestClient,
    method: str,
    path: str,
    headers: dict[str, str],
    code: str,
    challenge: str,
) -> None:
    response = client.request(method, path, headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == challenge
    assert error_of(response)["code"] == code


@pytest.mark.parametrize(
    ("token", "method", "path", "scope"),
    [
        (SENDER, "GET", "/dead-letters", "dead-letters:read"),
        (SENDER, "GET", "/dead-letters/dl_x", "dead-letters:read"),
        (READER, "POST", "/dead-letters/dl_x/retry", "dead-letters:write"),
        (READER, "POST", "/dead-letters/dl_x/dismiss", "dead-letters:write"),
        (READER, "POST", "/commands", "commands:send"),
    ],
)
def test_a_token_without_the_scope_is_403_naming_it(
    client: TestClient, token: str, method: str, path: str, scope: str
) -> None:
    response = client.request(method, path, headers=bearer(token))
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "insufficient_scope"
    assert repr(scope) in error["message"]
    assert f'scope="{scope}"' in response.headers["WWW-Authenticate"]


def test_health_needs_no_token(client: TestClient) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "nats": True, "productDatabase": True}


def test_health_is_503_with_retry_after_while_nats_is_down(
    client: TestClient, nats_server: NatsServerProcess
) -> None:
    assert client.get("/health").status_code == 200
    nats_server.stop()
    try:
        response = client.get("/health")
        assert response.status_code == 503
        assert response.json() == {"status": "unavailable", "nats": False, "productDatabase": True}
        assert int(response.headers["Retry-After"]) >= 1
    finally:
        nats_server.start()
    wait_until(lambda: client.get("/health").status_code == 200)


# --------------------------------------------------------------------------- POST /commands


def test_send_command_queues_it_and_reports_a_repeat_as_duplicate(
    client: TestClient, nats_server: NatsServerProcess
) -> None:
    # GIVEN a command
    cmd = command("agent.wake")
    request = {"queue": "agent-wakeups", "command": cmd.to_wire()}
    # WHEN it is sent twice
    first = client.post("/commands", json=request, headers=bearer(SENDER))
    second = client.post("/commands", json=request, headers=bearer(SENDER))
    # THEN it is queued once; the repeat is reported as a duplicate
    assert first.status_code == second.status_code == 202
    assert first.json()["messageId"] == f"agent-wakeups:{cmd.command_id}"
    assert (first.json()["duplicate"], second.json()["duplicate"]) == (False, True)
    assert len(queued(nats_server.url, cmd.command_id)) == 1


def test_a_command_for_another_tenants_project_is_404(
    client: TestClient, runtime: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a project of tenant B
    caller = Caller(tenant_id=OTHER_TENANT, actor="user:bob", correlation_id="corr-1")
    runtime.project_root("acme-b").create_project(caller, name="B")
    assert ProjectRoot.ref_for("acme-b").path(runtime.settings.state_dir).exists()
    cmd = command(project="acme-b")
    # WHEN tenant A sends a command for it THEN it is not found and nothing is queued
    response = client.post(
        "/commands", json={"queue": "integration", "command": cmd.to_wire()}, headers=AUTH
    )
    assert response.status_code == 404
    assert queued(nats_server.url, cmd.command_id) == []
    # AND tenant B may
    allowed = client.post(
        "/commands",
        json={"queue": "integration", "command": cmd.to_wire()},
        headers=bearer(OTHER_OPERATOR),
    )
    assert allowed.status_code == 202


_WIRE = command("agent.wake").to_wire()


def _request(*, drop: str | None = None, queue: str = "integration", **changes: Any) -> Any:
    """A /commands body: the agent.wake above with ``changes``, without ``drop``."""
    wire = {k: v for k, v in {**_WIRE, **changes}.items() if k != drop}
    return {"queue": queue, "command": wire}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(_request(drop="commandId"), "command.commandId", id="missing-commandId"),
        pytest.param(_request(commandId="bad id"), "command.commandId", id="bad-commandId"),
        pytest.param(_request(payload={}), "command.payload", id="payload-of-another-type"),
        pytest.param(_request(attempt=0), "command.attempt", id="attempt-zero"),
        pytest.param(_request(commandType="x"), "command.commandType", id="unknown-type"),
        pytest.param(_request(extra=1), "command.extra", id="unknown-field"),
        pytest.param(_request(queue="dead-letter"), "queue", id="dead-letter-queue"),
        pytest.param({"command": _WIRE}, "queue", id="no-queue"),
        pytest.param([], "body", id="not-an-object"),
    ],
)
def test_a_malformed_command_is_422_naming_the_field(
    client: TestClient, nats_server: NatsServerProcess, body: Any, field: str
) -> None:
    response = client.post("/commands", json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert (error["code"], error["field"]) == ("invalid_request", field)
    assert field in error["message"]
    assert queued(nats_server.url) == []


def test_a_body_that_is_not_json_is_422_on_the_body(client: TestClient) -> None:
    response = client.post(
        "/commands",
        content=b"{not json",
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert error_of(response)["field"] == "body"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": 201}, "limit"),
        ({"limit": 0}, "limit"),
        ({"status": "pending"}, "status"),
        ({"kind": "event"}, "kind"),
        ({"projectId": "no spaces"}, "projectId"),
    ],
)
def test_a_bad_list_query_is_422_naming_the_parameter(
    client: TestClient, query: dict[str, Any], field: str
) -> None:
    response = client.get("/dead-letters", params=query, headers=AUTH)
    assert response.status_code == 422
    assert error_of(response)["field"] == field


def test_the_tenant_of_a_command_comes_from_its_project(
    client: TestClient, runtime: Rhumbatron
) -> None:
    # A project of this tenant: a command for it is accepted (the read finds the owner).
    caller = Caller(tenant_id=TENANT, actor="user:ann", correlation_id="corr-1")
    runtime.project_root(PROJECT).create_project(caller, name="Web")
    cmd = command(project=PROJECT)
    response = client.post(
        "/commands", json={"queue": "integration", "command": cmd.to_wire()}, headers=AUTH
    )
    assert response.status_code == 202, response.text


def test_a_command_for_a_project_nobody_owns_is_only_a_platform_operators(
    client: TestClient, nats_server: NatsServerProcess
) -> None:
    # GIVEN a project no tenant has provisioned
    cmd = command(project="nobodys-project")
    request = {"queue": "integration", "command": cmd.to_wire()}
    # WHEN a tenant's operator sends a command for it, it does not exist for them (fail closed)
    assert client.post("/commands", json=request, headers=AUTH).status_code == 404
    assert queued(nats_server.url, cmd.command_id) == []


def test_a_retry_runs_a_command_whose_deadline_passed_in_the_dead_letter_queue(
    client: TestClient, runtime: Rhumbatron, nats_server: NatsServerProcess, clock: ManualClock
) -> None:
    # GIVEN a dead-lettered command whose one-minute deadline passed while it waited
    original = command()
    expired = original.model_copy(update={"deadline": original.created_at + timedelta(minutes=1)})
    letter_id = command_letter(runtime, expired)
    clock.set(original.created_at + timedelta(minutes=10))
    # WHEN the operator retries it
    response = client.post(f"/dead-letters/{letter_id}/retry", headers=AUTH)
    # THEN it is re-sent without the deadline, so the runtime runs it instead of expiring it
    assert response.status_code == 200, response.text
    (sent,) = queued(nats_server.url, expired.command_id)
    assert sent.command["attempt"] == 2
    assert sent.command["deadline"] is None
