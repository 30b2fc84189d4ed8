"""The operator's ``rhumbatron dead-letters`` and ``rhumbatron api`` commands, against a real
nats-server and real SQLite files (issue #4 item 5; RELIABILITY F14).

Letters get into the product database the real way where it matters (a command failing
every delivery of the integration queue, then the dead-letter consumer), or through the
product functions the router and the consumer use. The CLI reads its settings from the
``RHUMBATRON_*`` environment, as an operator's shell would give them. What a Retry sent is read
back from the COMMANDS stream itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.errors import NotFoundError

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.cli import EXIT_CANNOT, EXIT_NOT_FOUND, EXIT_UNAVAILABLE, main
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.messaging.queue_consumer import Delivery, PollReport, Retry
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.product.dead_letters import (
    command_dead_letter_id,
    get_dead_letter,
    poison_dead_letter_id,
    record_command_dead_letter,
    record_poison_event,
)
from rhumbatron.protocol.envelopes import Command
from rhumbatron.queues import run_dead_letter_consumer
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration

PROJECT = "acme-web"
TENANT = "acme"
TOKEN = "cli-operator-token-aaaaaaaa"


@pytest.fixture
def settings(
    tmp_path: Path, nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """What the CLI reads from the environment, and the same settings for the test's own
    runtime (the integration queue redelivers at once)."""
    env = {
        "RHUMBATRON_STATE_DIR": str(tmp_path / "state"),
        "RHUMBATRON_NATS_URL": nats_server.url,
        # NATS down is found out in a second, not four.
        "RHUMBATRON_NATS_CONNECT_TIMEOUT_S": "0.5",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings(queue_retry_delay_s={"integration": 0.0})


@contextmanager
def runtime(settings: Settings) -> Iterator[Rhumbatron]:
    """A runtime of the test's own (the CLI builds its own from the environment)."""
    app = bootstrap(settings, clock=ManualClock(), alarms=RecordingAlarmSink())
    try:
        yield app
    finally:
        asyncio.run(app.close())


def provision(command_id: str | None = None, *, attempt: int = 1) -> Command:
    return Command.create(
        command_id=command_id or f"cmd_{uuid.uuid4().hex}",
        command_type="app.provision",
        project_id=PROJECT,
        attempt=attempt,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        payload={"appName": "storefront"},
    )


def written_letter(settings: Settings, *, queue: str = "integration", when_s: int = 0) -> str:
    """A command letter written by the product function the dead-letter consumer uses."""
    command = provision()
    with runtime(settings) as app, app.product().transaction() as db:
        record_command_dead_letter(
            db,
            command_id=command.command_id,
            command_type=command.command_type,
            queue=queue,
            attempt=1,
            reason=f"RuntimeError: boom on {queue}",
            body=command.to_json().decode(),
            now_s=1_767_225_600 + when_s,
            tenant_id=TENANT,
            project_id=PROJECT,
        )
    return command_dead_letter_id(command.command_id)


def poison_letter(settings: Settings, *, when_s: int = 0) -> str:
    """What the router writes for an event a subscription failed to apply 5 times."""
    event_key = f"evt_{uuid.uuid4().hex}"
    with runtime(settings) as app, app.product().transaction() as db:
        record_poison_event(
            db,
            consumer="projection-view",
            event_key=event_key,
            stream="EVENTS_00",
            stream_seq=7,
            reason="ValueError: cannot apply",
            body=json.dumps({"eventId": event_key, "eventType": "task.completed"}),
            now_s=1_767_225_600 + when_s,
            tenant_id=TENANT,
            project_id=PROJECT,
        )
    return poison_dead_letter_id("projection-view", event_key)


async def poll_until(
    poll: Callable[[], Awaitable[PollReport]], outcome: str, timeout_s: float = 10.0
) -> PollReport:
    """Poll until a poll reports ``outcome`` (a PollReport counter), bounded; that report.

    A nak without delay makes the message available again a moment later, not at once: the
    no-wait pull right behind it can come back empty, so one poll is not one delivery.
    """
    give_up_at = time.monotonic() + timeout_s
    while True:
        report = await poll()
        if getattr(report, outcome):
            return report
        assert time.monotonic() < give_up_at, f"no {outcome} within {timeout_s} s"


async def _fail_into_a_letter(settings: Settings, command: Command) -> None:
    app = bootstrap(settings, clock=ManualClock(), alarms=RecordingAlarmSink())

    async def always_fails(command: Command, delivery: Delivery) -> Retry | None:
        raise RuntimeError(f"no registry credentials (delivery {delivery.delivered})")

    try:
        await app.ensure_streams()
        app.project_root(PROJECT).create_project(Caller(TENANT, "system:test", "c"), name="Web")
        await (await app.command_bus()).send("integration", command)
        queues = await app.queue_runtime()
        await poll_until(lambda: queues.poll("integration", always_fails), "dead_lettered")
        await poll_until(lambda: run_dead_letter_consumer(app), "done")
    finally:
        await app.close()


def dead_lettered(settings: Settings) -> tuple[str, Command]:
    """A command that failed all 4 deliveries on integration, and the letter it left."""
    command = provision()
    asyncio.run(_fail_into_a_letter(settings, command))
    return command_dead_letter_id(command.command_id), command


def run_integration_once(settings: Settings) -> tuple[PollReport, list[int]]:
    """Poll integration with a handler that succeeds; the attempts it ran."""
    attempts: list[int] = []

    async def succeeds(command: Command, delivery: Delivery) -> Retry | None:
        attempts.append(command.attempt)
        return None

    async def poll() -> PollReport:
        app = bootstrap(settings, clock=ManualClock(), alarms=RecordingAlarmSink())
        try:
            queues = await app.queue_runtime()
            return await poll_until(lambda: queues.poll("integration", succeeds), "done")
        finally:
            await app.close()

    return asyncio.run(poll()), attempts


def queued_message_ids(url: str) -> list[str]:
    """The ``Nats-Msg-Id`` of every message the COMMANDS stream holds, read over its own
    connection."""

    async def read() -> list[str]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            state = (await js.stream_info(COMMAND_STREAM)).state
            ids = []
            for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
                try:
                    msg = await js.get_msg(COMMAND_STREAM, seq)
                except NotFoundError:
                    continue  # acked and removed (work-queue retention)
                ids.append((msg.headers or {})["Nats-Msg-Id"])
            return ids
        finally:
            await nc.close()

    return asyncio.run(read())


def letter_row(settings: Settings, dead_letter_id: str) -> tuple[str, str | None, int | None]:
    """``(status, resolution, retried_attempt)`` of a letter, read from the product file."""
    with runtime(settings) as app:
        letter = get_dead_letter(app.product().connection, dead_letter_id)
    return letter.status.value, letter.resolution, letter.retried_attempt


# --------------------------------------------------------------------------- list and show


def test_list_shows_open_letters_oldest_first_and_filters_them(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN two open letters on different queues, and a poison event
    first = written_letter(settings, queue="integration", when_s=0)
    second = written_letter(settings, queue="agent-wakeups", when_s=1)
    poison = poison_letter(settings, when_s=2)
    # WHEN the operator lists the open letters
    assert main(["dead-letters", "list"]) == 0
    printed = capsys.readouterr().out
    # THEN each is one row, oldest first, with its queue and reason, and a count
    lines = printed.splitlines()
    assert lines[0].split()[:5] == ["ID", "STATUS", "RESOLUTION", "KIND", "QUEUE"]
    assert [line.split()[0] for line in lines[1:-1]] == [first, second, poison]
    assert "RuntimeError: boom on integration" in lines[1]
    assert lines[-1] == "3 dead letter(s) (status open)"
    # WHEN the operator narrows by queue THEN only that queue's letter is listed
    assert main(["dead-letters", "list", "--queue", "agent-wakeups", "--json"]) == 0
    assert [item["id"] for item in json.loads(capsys.readouterr().out)] == [second]
    # AND nothing is closed yet
    assert main(["dead-letters", "list", "--status", "closed"]) == 0
    assert capsys.readouterr().out == "no dead letters (status closed)\n"


def test_list_json_is_the_http_apis_wire_form(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an open letter
    letter_id = written_letter(settings)
    # WHEN listed as JSON
    assert main(["dead-letters", "list", "--json"]) == 0
    (item,) = json.loads(capsys.readouterr().out)
    # THEN it has the fields GET /dead-letters answers, camelCase
    assert item["id"] == letter_id
    assert item["status"] == "open"
    assert item["commandType"] == "app.provision"
    assert item["lastError"] == "RuntimeError: boom on integration"
    assert item["tenantId"] == TENANT
    assert item["createdAt"] == "2026-01-01T00:00:00Z"


def test_show_prints_the_full_command_and_the_last_error(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a command dead-lettered the real way
    letter_id, command = dead_lettered(settings)
    # WHEN the operator shows it
    assert main(["dead-letters", "show", letter_id]) == 0
    printed = capsys.readouterr().out
    # THEN the letter, its last error, its full payload and what to do next are printed
    assert f"id:         {letter_id}" in printed
    assert f"command:    app.provision {command.command_id}" in printed
    assert "tenant:     acme" in printed
    assert "after 4 deliveries: RuntimeError: no registry credentials (delivery 4)" in printed
    assert '"appName": "storefront"' in printed
    assert f"next: rhumbatron dead-letters retry {letter_id} | " in printed
    # AND as JSON it is what GET /dead-letters/{id} answers, the Command included
    assert main(["dead-letters", "show", letter_id, "--json"]) == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["command"] == command.to_wire()
    assert detail["attempt"] == 1


@pytest.mark.parametrize("action", ["show", "retry", "dismiss"])
def test_an_unknown_id_exits_2_and_says_so(
    settings: Settings, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    # WHEN the operator names a letter that does not exist
    status = main(["dead-letters", action, "dl_000000000000000000000000"])
    # THEN the command exits 2 with the ID in its message, and prints nothing on stdout
    captured = capsys.readouterr()
    assert status == EXIT_NOT_FOUND == 2
    assert captured.out == ""
    assert "no dead letter 'dl_000000000000000000000000'" in captured.err


# --------------------------------------------------------------------------- retry


def test_retry_sends_attempt_2_once_and_the_letter_closes_when_it_succeeds(
    settings: Settings, nats_server: NatsServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a command that failed every delivery on integration, and its open letter
    letter_id, command = dead_lettered(settings)
    assert queued_message_ids(nats_server.url) == []
    # WHEN the operator retries it
    assert main(["dead-letters", "retry", letter_id]) == 0
    # THEN attempt 2 waits on integration under a new message ID, and the letter stays open
    first = capsys.readouterr().out
    assert f"sent app.provision {command.command_id} again as attempt 2 on integration" in first
    assert queued_message_ids(nats_server.url) == [f"integration:{command.command_id}:2"]
    assert letter_row(settings, letter_id) == ("open", None, 2)
    # WHEN the operator retries again (a double click)
    assert main(["dead-letters", "retry", letter_id]) == 0
    # THEN nothing more is sent (F14)
    assert "already retried as attempt 2" in capsys.readouterr().out
    assert queued_message_ids(nats_server.url) == [f"integration:{command.command_id}:2"]
    # WHEN the integration queue runs the retried command, and it succeeds
    report, attempts = run_integration_once(settings)
    # THEN attempt 2 ran once, and the letter closed as succeeded
    assert (report.done, attempts) == (1, [2])
    assert letter_row(settings, letter_id) == ("closed", "succeeded", 2)
    # AND a Retry of the closed letter exits 3
    assert main(["dead-letters", "retry", letter_id]) == EXIT_CANNOT == 3
    assert "already closed (succeeded)" in capsys.readouterr().err


def test_the_same_first_attempt_sent_again_later_closes_the_letter_when_it_succeeds(
    settings: Settings,
) -> None:
    # GIVEN a command that failed every delivery on integration, and its open letter
    letter_id, command = dead_lettered(settings)

    # WHEN its producer sends the same command (attempt 1) again after the duplicate window
    #   (another message ID), and the integration queue runs it successfully
    async def send_again() -> None:
        app = bootstrap(settings, clock=ManualClock(), alarms=RecordingAlarmSink())
        try:
            bus = await app.command_bus()
            await bus.send_raw(
                "integration", command.to_json(), message_id=f"integration:{command.command_id}:x"
            )
        finally:
            await app.close()

    asyncio.run(send_again())
    report, attempts = run_integration_once(settings)

    # THEN it ran once, and the letter closed as succeeded
    assert (report.done, attempts) == (1, [1])
    assert letter_row(settings, letter_id) == ("closed", "succeeded", None)


def test_retry_json_is_the_http_apis_answer(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an open letter
    letter_id, command = dead_lettered(settings)
    # WHEN retried with --json
    assert main(["dead-letters", "retry", letter_id, "--json"]) == 0
    # THEN the answer is POST /dead-letters/{id}/retry's body
    body = json.loads(capsys.readouterr().out)
    assert body["sent"] is True
    assert body["attempt"] == 2
    assert body["queue"] == "integration"
    assert body["messageId"] == f"integration:{command.command_id}:2"
    assert body["deadLetter"]["retriedAttempt"] == 2


def test_a_poison_event_cannot_be_retried_only_dismissed(
    settings: Settings, nats_server: NatsServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a poison-event letter
    letter_id = poison_letter(settings)
    # WHEN the operator retries it THEN the command exits 3, naming what can be done
    assert main(["dead-letters", "retry", letter_id]) == EXIT_CANNOT
    assert "can only be dismissed" in capsys.readouterr().err
    # AND nothing was reserved
    assert letter_row(settings, letter_id) == ("open", None, None)
    # WHEN the operator dismisses it THEN it closes as dismissed
    assert main(["dead-letters", "dismiss", letter_id]) == 0
    assert f"dead letter {letter_id} dismissed" in capsys.readouterr().out
    assert letter_row(settings, letter_id) == ("closed", "dismissed", None)


def test_retry_while_nats_is_down_exits_4_and_reserves_nothing(
    settings: Settings, nats_server: NatsServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an open letter, and NATS gone
    letter_id, _ = dead_lettered(settings)
    nats_server.stop()
    # WHEN the operator retries it
    status = main(["dead-letters", "retry", letter_id])
    # THEN the command exits 4 with one line naming the server, and nothing is reserved
    captured = capsys.readouterr()
    assert status == EXIT_UNAVAILABLE == 4
    assert f"no NATS server answered at {nats_server.url}" in captured.err
    assert "Traceback" not in captured.err
    assert letter_row(settings, letter_id) == ("open", None, None)


# --------------------------------------------------------------------------- dismiss


def test_dismiss_closes_an_open_letter_and_a_second_dismiss_exits_3(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an open command letter
    letter_id = written_letter(settings)
    # WHEN the operator dismisses it, as JSON
    assert main(["dead-letters", "dismiss", letter_id, "--json"]) == 0
    # THEN it is closed as dismissed
    body = json.loads(capsys.readouterr().out)
    assert (body["status"], body["resolution"]) == ("closed", "dismissed")
    assert letter_row(settings, letter_id) == ("closed", "dismissed", None)
    # AND it is listed as closed, and no longer as open
    assert main(["dead-letters", "list", "--status", "closed", "--json"]) == 0
    assert [item["id"] for item in json.loads(capsys.readouterr().out)] == [letter_id]
    # WHEN dismissed again THEN the command exits 3: it is already closed
    assert main(["dead-letters", "dismiss", letter_id]) == EXIT_CANNOT
    assert f"dead letter {letter_id} is already closed (dismissed)" in capsys.readouterr().err


# --------------------------------------------------------------------------- rhumbatron api


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port: int = probe.getsockname()[1]
        return port


def test_the_api_command_serves_the_operator_api_with_a_static_token(
    settings: Settings, tmp_path: Path
) -> None:
    # GIVEN an open letter, and a static token of the letter's tenant in the environment
    letter_id = written_letter(settings)
    port = _free_port()
    env = {
        **os.environ,
        "RHUMBATRON_API_TOKENS": json.dumps(
            {TOKEN: {"tenant": TENANT, "scopes": ["dead-letters:read"]}}
        ),
    }
    # WHEN `rhumbatron api` starts
    server = subprocess.Popen(
        [sys.executable, "-m", "rhumbatron.cli", "api", "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        # uvicorn says when it listens: read its log instead of sleeping.
        seen = []
        for line in server.stderr:
            seen.append(line)
            if "Uvicorn running on" in line:
                break
        assert any(f"http://127.0.0.1:{port}" in line for line in seen), seen
        base = f"http://127.0.0.1:{port}"
        # THEN /health needs no token, and the letter is listed for the token's tenant
        assert httpx.get(f"{base}/health").json()["status"] == "ok"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        page = httpx.get(f"{base}/dead-letters", headers=auth).json()
        assert [item["id"] for item in page["items"]] == [letter_id]
        # AND without the token the answer is 401
        assert httpx.get(f"{base}/dead-letters").status_code == 401
    finally:
        server.send_signal(signal.SIGINT)
        _, rest = server.communicate(timeout=15)
    # AND Ctrl-C stops it cleanly: the runtime closed, exit 0, no traceback
    assert server.returncode == 0, rest
    assert "Traceback" not in rest
