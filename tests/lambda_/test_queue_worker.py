"""The queue consumers' four Lambda functions, run the way Lambda runs them.

``functions/<queue function>/app.py`` is loaded from its path, its settings come from
``RHUMBATRON_*`` environment variables as template.yaml sets them, its events from
``events/``, and a real nats-server holds the COMMANDS stream. Commands reach the queues the
way they do in the cloud: sent by another role through the command bus.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import EnvelopeError
from rhumbatron.messaging.commands import LAST_ERROR_HEADER, ORIGIN_QUEUE_HEADER
from rhumbatron.messaging.queue_consumer import PollReport
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.queue_consumers import DEAD_LETTER_QUEUE, QUEUE_CONSUMERS
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import FakeLambdaContext, load_app, sample_event

pytestmark = pytest.mark.integration

#: A queue function's whole time: Timeout 900 in template.yaml.
FULL_TIME_MS = 900_000
POLL_FIELDS = {f.name for f in fields(PollReport)} | {"error"}


@dataclass
class Functions:
    """The four queue functions' ``app`` modules, as one warm container per test loads them."""

    agent_wakeups: ModuleType
    integration: ModuleType
    indexing: ModuleType
    dead_letter: ModuleType


@pytest.fixture
def lambda_env(
    tmp_path: Path, nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The queue functions' environment as template.yaml sets it, pointed at this test's
    nats-server (the workflows run in process here: no Step Functions)."""
    for name, value in {
        "RHUMBATRON_STATE_DIR": str(tmp_path / "state"),
        "RHUMBATRON_JOURNAL_MODE": "DELETE",
        "RHUMBATRON_NETWORK_FILESYSTEM": "true",
        "RHUMBATRON_NATS_URL": nats_server.url,
        "RHUMBATRON_METRICS_EMF": "true",
        "POWERTOOLS_SERVICE_NAME": "queue-worker",
    }.items():
        monkeypatch.setenv(name, value)
    return load_settings()


@pytest.fixture
def functions(lambda_env: Settings) -> Iterator[Functions]:
    """A fresh container: the handler modules loaded, no runtime cached yet."""
    process.reset_for_tests()
    yield Functions(
        load_app("agent_wakeups"),
        load_app("integration"),
        load_app("indexing"),
        load_app("dead_letter"),
    )
    process.reset_for_tests()


def _command(command_type: str, payload: dict[str, Any], **ids: Any) -> Command:
    return Command.create(
        command_id=f"cmd_{uuid.uuid4().hex}",
        command_type=command_type,
        project_id=ids.pop("project_id", f"proj-{uuid.uuid4().hex[:8]}"),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        payload=payload,
        **ids,
    )


def _provision(tenant: str = "acme") -> Command:
    return _command("project.provision", {"name": "Acme web", "tenantId": tenant})


def _send(settings: Settings, queue: str, *commands: Command, raw: bytes | None = None) -> None:
    """Another role sends ``commands`` (and a ``raw`` body) on ``queue`` through the bus."""

    async def send() -> None:
        app = bootstrap(settings)
        try:
            await app.ensure_streams()
            bus = await app.command_bus()
            headers = {ORIGIN_QUEUE_HEADER: "integration", LAST_ERROR_HEADER: "boom"}
            for command in commands:
                await bus.send(queue, command, headers=headers if queue == "dead-letter" else None)
            if raw is not None:
                await bus.send_raw(queue, raw, message_id=f"raw-{uuid.uuid4().hex}")
        finally:
            await app.close()

    asyncio.run(send())


def _project_tenant(settings: Settings, project_id: str) -> str | None:
    app = bootstrap(settings)
    try:
        return app.project_tenant(project_id)
    finally:
        asyncio.run(app.close())


def _letters(settings: Settings) -> list[dict[str, Any]]:
    app = bootstrap(settings)
    try:
        rows = app.product().connection.execute(
            "SELECT command_id, queue, reason FROM dead_letters ORDER BY created_at_s, queue"
        )
        return [dict(row) for row in rows]
    finally:
        asyncio.run(app.close())


# -- the schedule ------------------------------------------------------------------------------


def test_integration_schedule_handles_a_provision_and_polls_all_three_queues(
    functions: Functions, lambda_env: Settings
) -> None:
    # GIVEN a project.provision waiting on the integration queue
    command = _provision()
    _send(lambda_env, "integration", command)

    # WHEN the every-minute schedule invokes the integration function
    summary = functions.integration.lambda_handler(
        sample_event("integration_schedule.json"), FakeLambdaContext(remaining_ms=FULL_TIME_MS)
    )

    # THEN it handled the command and polled verification and release too, each reported
    assert summary["job"] == "queues"
    assert list(summary["queues"]) == ["integration", "verification", "release"]
    for report in summary["queues"].values():
        assert set(report) == POLL_FIELDS
        assert report["error"] is None
    integration = summary["queues"]["integration"]
    assert (integration["fetched"], integration["done"]) == (1, 1)
    assert summary["queues"]["verification"]["fetched"] == 0
    assert summary["out_of_time"] is False
    json.dumps(summary)  # what Lambda returns must be JSON
    # AND the project exists, owned by the tenant the command named
    assert _project_tenant(lambda_env, command.project_id) == "acme"


def test_a_commands_log_lines_are_the_functions_json_with_its_id_and_the_lambda_context(
    capsys: pytest.CaptureFixture[str], lambda_env: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a command past its deadline on the integration queue, and the integration
    # function in Lambda (its own service name: a fresh Powertools logger on this stdout)
    command = _command(
        "project.provision",
        {"name": "Acme web", "tenantId": "acme"},
        deadline=datetime(2026, 1, 1, 0, 1, tzinfo=UTC),
    )
    _send(lambda_env, "integration", command)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "IntegrationFunction")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", f"integration-{uuid.uuid4().hex[:8]}")
    package = logging.getLogger("rhumbatron")
    saved = (list(package.handlers), package.propagate, package.level)
    process.reset_for_tests()
    try:
        app = load_app("integration")
        context = FakeLambdaContext(remaining_ms=FULL_TIME_MS, function_name="IntegrationFunction")
        capsys.readouterr()
        # WHEN the schedule invokes it and the queue consumer, deep in the package, logs that
        # it acked the expired command without running it
        summary = app.lambda_handler(sample_event("integration_schedule.json"), context)
    finally:
        process.reset_for_tests()
        package.handlers[:], package.propagate = saved[0], saved[1]
        package.setLevel(saved[2])
    assert summary["queues"]["integration"]["expired"] == 1
    # THEN that line is JSON on stdout, as the function's own, with the command's ID as its
    # correlation ID and the invocation's Lambda context
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "{" in line[:1]]
    (expired,) = [line for line in lines if "expired" in str(line.get("message"))]
    assert expired["name"] == "rhumbatron.messaging.queue_consumer"
    assert expired["level"] == "INFO"
    assert expired["correlation_id"] == command.command_id
    assert expired["function_name"] == "IntegrationFunction"
    assert expired["function_request_id"] == context.aws_request_id


def test_a_warm_invocation_finds_only_what_is_new(
    functions: Functions, lambda_env: Settings
) -> None:
    # GIVEN one provision handled by a first invocation
    _send(lambda_env, "integration", _provision())
    event, context = sample_event("integration_schedule.json"), FakeLambdaContext(FULL_TIME_MS)
    functions.integration.lambda_handler(event, context)

    # WHEN two more arrive and the next tick comes to the same (warm) container
    later = [_provision("acme"), _provision("globex")]
    _send(lambda_env, "integration", *later)
    summary = functions.integration.lambda_handler(event, context)

    # THEN it handles exactly the two new ones
    assert summary["queues"]["integration"]["done"] == 2
    assert [_project_tenant(lambda_env, c.project_id) for c in later] == ["acme", "globex"]


def test_agent_wakeups_acks_a_wake_with_no_task_to_wake(
    functions: Functions, lambda_env: Settings
) -> None:
    # GIVEN an agent.wake naming no Task (stale: nothing to wake for)
    _send(
        lambda_env,
        "agent-wakeups",
        _command("agent.wake", {"agentId": "builder-1", "reason": "task.ready"}),
    )
    # WHEN the agent-wakeups schedule fires
    summary = functions.agent_wakeups.lambda_handler(
        sample_event("agent_wakeups_schedule.json"), FakeLambdaContext(FULL_TIME_MS)
    )
    # THEN the wake was handled (and acked) without a retry or a dead letter
    report = summary["queues"]["agent-wakeups"]
    assert (report["fetched"], report["done"], report["retried"]) == (1, 1, 0)


def test_indexing_leaves_a_project_with_nothing_canonical_alone(
    functions: Functions, lambda_env: Settings
) -> None:
    # GIVEN an index.build for a project with nothing promoted yet
    _send(lambda_env, "indexing", _command("index.build", {"generation": 1}))
    # WHEN the indexing schedule fires
    summary = functions.indexing.lambda_handler(
        sample_event("indexing_schedule.json"), FakeLambdaContext(FULL_TIME_MS)
    )
    # THEN the command was handled (nothing to index is not a failure)
    report = summary["queues"]["indexing"]
    assert (report["fetched"], report["done"], report["failed"]) == (1, 1, 0)


def test_dead_letter_function_records_commands_and_undecodable_bodies(
    functions: Functions, lambda_env: Settings
) -> None:
    # GIVEN a command that failed on integration, and a body that is no Command at all,
    # both on the dead-letter queue
    failed = _command("change.settle", {"reason": "task_failed"})
    _send(lambda_env, DEAD_LETTER_QUEUE, failed, raw=b"\xffnot a command")

    # WHEN the dead-letter schedule fires
    summary = functions.dead_letter.lambda_handler(
        sample_event("dead_letter_schedule.json"), FakeLambdaContext(FULL_TIME_MS)
    )

    # THEN both letters are recorded: the command's under its ID, the body's without one
    report = summary["queues"][DEAD_LETTER_QUEUE]
    assert (report["fetched"], report["done"]) == (2, 2)
    letters = _letters(lambda_env)
    assert sorted(str(letter["command_id"]) for letter in letters) == sorted(
        [failed.command_id, "None"]
    )
    command_letter = next(letter for letter in letters if letter["command_id"])
    assert command_letter["queue"] == "integration"
    assert "boom" in command_letter["reason"]


# -- the nudge ---------------------------------------------------------------------------------


def test_a_nudge_polls_only_its_queue(functions: Functions, lambda_env: Settings) -> None:
    # GIVEN a provision on integration
    command = _provision()
    _send(lambda_env, "integration", command)
    # WHEN the async nudge after the send arrives
    summary = functions.integration.lambda_handler(
        sample_event("integration_nudge.json"), FakeLambdaContext(FULL_TIME_MS)
    )
    # THEN only integration was polled, and the command handled
    assert summary["job"] == "nudge"
    assert list(summary["queues"]) == ["integration"]
    assert summary["queues"]["integration"]["done"] == 1
    assert _project_tenant(lambda_env, command.project_id) == "acme"


# -- the time ----------------------------------------------------------------------------------


def test_with_less_than_an_ack_wait_left_nothing_is_fetched_and_the_next_tick_gets_it(
    functions: Functions, lambda_env: Settings
) -> None:
    # GIVEN a command waiting, and an invocation with 30 s left (less than the 60 s ack wait)
    command = _provision()
    _send(lambda_env, "integration", command)
    event = sample_event("integration_nudge.json")

    # WHEN it runs
    late = functions.integration.lambda_handler(event, FakeLambdaContext(remaining_ms=30_000))

    # THEN it fetched nothing and says it ran out of time
    assert late["out_of_time"] is True
    assert late["queues"]["integration"]["fetches"] == 0
    assert _project_tenant(lambda_env, command.project_id) is None
    # AND the next invocation, with its full time, handles the command
    again = functions.integration.lambda_handler(event, FakeLambdaContext(FULL_TIME_MS))
    assert again["queues"]["integration"]["done"] == 1
    assert again["out_of_time"] is False


# -- the edge ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            {"source": "schedule", "job": "queues", "queues": ["integraton"]},
            r"field 'queues'=\['integraton'\]: unknown queue 'integraton'; queues are "
            + ", ".join(QUEUE_CONSUMERS),
        ),
        (
            {"source": "nudge", "queue": "indexing"},
            r"field 'queue' names 'indexing', which this function does not poll; it polls "
            r"integration, verification, release",
        ),
        (
            {"source": "schedule", "job": "sweep", "queues": ["integration"]},
            r"field 'job'='sweep'",
        ),
        ({"source": "schedule", "job": "queues"}, r"field 'queues' is missing"),
        ({"source": "schedule", "job": "queues", "queues": []}, r"field 'queues'=\[\]"),
        ({"source": "nudge"}, r"field 'queue' is missing"),
        ([1, 2], r"must be a JSON object, got list"),
    ],
)
def test_a_bad_event_is_refused_naming_the_field(
    functions: Functions, event: Any, expected: str
) -> None:
    with pytest.raises(EnvelopeError, match=expected):
        functions.integration.lambda_handler(event, FakeLambdaContext(FULL_TIME_MS))
