"""Schema fuzzing of every operation of the published OpenAPI document (B6).

uvicorn serves the API on a loopback port, as ``rhumbatron api`` does locally, over a real
runtime and nats-server with real dead letters in it. Schemathesis generates valid and
invalid requests for every operation from ``/openapi.json`` and checks each answer: no 5xx
at all (the infrastructure is up, so not even the documented 503), a documented status,
and a body (for every 4xx, the error model) and headers that match the document. Bounded:
a fixed number of examples, derandomized, no example database.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import OPERATOR, TOKENS, bearer, command, command_letter, poison_letter

pytestmark = pytest.mark.integration

EXAMPLES_PER_MODE = 150
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture
def served_api(tmp_path: Path, nats_server: NatsServerProcess) -> Iterator[str]:
    """The API under uvicorn on a free loopback port, with a few letters in it; its URL."""
    runtime = bootstrap(
        load_settings(state_dir=tmp_path / "state", nats_url=nats_server.url, api_tokens=TOKENS),
        clock=ManualClock(),
        alarms=RecordingAlarmSink(),
    )
    for _ in range(3):
        command_letter(runtime, command())
    poison_letter(runtime)
    api = create_api(runtime, StaticTokenAuth(runtime.settings.api_tokens))
    # The socket listens before uvicorn runs: a request that comes first waits in the
    # backlog until uvicorn accepts it, so nothing has to wait for the server to start.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(api, log_level="warning", lifespan="on"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [listener]}, name="uvicorn", daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        listener.close()


def test_every_operation_answers_fuzzed_requests_as_documented(served_api: str) -> None:
    # GIVEN the document the API publishes
    schema = schemathesis.openapi.from_url(f"{served_api}/openapi.json")
    operations = {
        f"{op.method.upper()} {op.path}" for op in (r.ok() for r in schema.get_all_operations())
    }
    assert operations == {
        "GET /health",
        "GET /dead-letters",
        "GET /dead-letters/{id}",
        "POST /dead-letters/{id}/retry",
        "POST /dead-letters/{id}/dismiss",
        "POST /commands",
        "POST /projects",
        "GET /projects/{projectId}",
        "POST /projects/{projectId}/cleanup",
        "POST /projects/{projectId}/archive",
        "POST /projects/{projectId}/apps",
        "DELETE /projects/{projectId}/apps/{appName}",
        "GET /projects/{projectId}/view",
        "GET /projects/{projectId}/events/{eventId}",
        "GET /projects/{projectId}/feed",
        "POST /projects/{projectId}/changes",
        "GET /projects/{projectId}/changes",
        "GET /projects/{projectId}/changes/{changeId}",
        "GET /projects/{projectId}/changes/{changeId}/tasks",
        "POST /projects/{projectId}/changes/{changeId}/approve",
        "POST /projects/{projectId}/changes/{changeId}/decline",
        "POST /projects/{projectId}/changes/{changeId}/cancel",
        "GET /projects/{projectId}/candidates",
        "POST /projects/{projectId}/changes/{changeId}/tasks/{taskId}/start",
        "POST /projects/{projectId}/changes/{changeId}/tasks/{taskId}/intents",
        "POST /projects/{projectId}/changes/{changeId}/tasks/{taskId}/claims",
        "DELETE /projects/{projectId}/changes/{changeId}/tasks/{taskId}/claims",
        "POST /projects/{projectId}/changes/{changeId}/tasks/{taskId}/challenges",
        "POST /projects/{projectId}/changes/{changeId}/tasks/{taskId}/changesets",
        "POST /projects/{projectId}/changes/{changeId}/tasks/{taskId}/complete",
        "POST /projects/{projectId}/changes/{changeId}/tasks/{taskId}/fail",
        "POST /agents",
        "POST /replays",
        "POST /subscriptions",
        "GET /subscriptions",
        "GET /subscriptions/{subscriptionId}",
        "PATCH /subscriptions/{subscriptionId}",
        "DELETE /subscriptions/{subscriptionId}",
        "GET /subscriptions/{subscriptionId}/deliveries",
        "POST /subscriptions/{subscriptionId}/deliveries/replay",
        "POST /schedules",
        "GET /schedules",
        "GET /schedules/{scheduleId}",
        "PATCH /schedules/{scheduleId}",
        "DELETE /schedules/{scheduleId}",
        "GET /consumers",
        "GET /capacity",
        "GET /reconciliation",
        "POST /reconciliation/repair",
        "GET /workflows/{workflow}",
        "GET /workflows/{workflow}/{instanceId}",
        "POST /workflows/{workflow}/{instanceId}/cancel",
        "POST /workflows/{workflow}/{instanceId}/terminate",
        "POST /workflows/{workflow}/{instanceId}/redrive",
        "GET /audit",
        "GET /dead-letters/groups",
        "POST /dead-letters/groups/{groupId}/retry",
        "POST /dead-letters/groups/{groupId}/dismiss",
        "GET /outbox",
        "POST /outbox/requeue",
        "POST /consumers/{stream}/{consumer}/pause",
        "POST /consumers/{stream}/{consumer}/resume",
        "POST /schedules/{scheduleId}/fire",
    }
    strategy = schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(
        GenerationMode.NEGATIVE
    )

    # WHEN valid and invalid requests of every operation come, with a token of every scope
    @given(case=strategy)
    @settings(
        max_examples=2 * EXAMPLES_PER_MODE,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def answers_as_documented(case: schemathesis.Case) -> None:
        # THEN every answer is documented, no 5xx, and bodies and headers match the document
        case.call_and_validate(base_url=served_api, headers=bearer(OPERATOR), checks=CHECKS)

    answers_as_documented()


def test_the_published_document_uses_the_error_model_for_every_4xx_and_503(
    served_api: str,
) -> None:
    import httpx

    document = httpx.get(f"{served_api}/openapi.json").json()
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            for status, answer in operation["responses"].items():
                if status.startswith("4") or (status == "503" and path != "/health"):
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (
                        method,
                        path,
                        status,
                    )
    assert "HTTPValidationError" not in document["components"]["schemas"]
