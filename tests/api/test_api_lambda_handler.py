"""The API's Lambda handler, run the way Lambda runs it behind an API Gateway HTTP API.

Settings come from ``RHUMBATRON_*`` environment variables; the handler builds the runtime,
the API and Mangum on the first invocation and keeps them (and the NATS connection, on the
process's one event loop) for the next. A real nats-server stores what a Retry sends.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.api import lambda_handler
from rhumbatron.core.settings import load_settings
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import OPERATOR, TOKENS, command, command_letter, queued

pytestmark = pytest.mark.integration


def _http_api_event(
    method: str, path: str, *, query: str = "", token: str | None = OPERATOR
) -> dict[str, Any]:
    """An API Gateway HTTP API (payload format 2.0) request event."""
    headers = {"host": "abc123.execute-api.eu-west-1.amazonaws.com", "user-agent": "test"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc123",
            "domainName": "abc123.execute-api.eu-west-1.amazonaws.com",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "192.0.2.1",
                "userAgent": "test",
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": "01/Jan/2026:00:00:00 +0000",
            "timeEpoch": 1767225600000,
        },
        "isBase64Encoded": False,
    }


@pytest.fixture
def lambda_env(
    tmp_path: Path, nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The function's environment, pointed at this test's server; a fresh container."""
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RHUMBATRON_JOURNAL_MODE", "DELETE")
    monkeypatch.setenv("RHUMBATRON_NETWORK_FILESYSTEM", "true")
    monkeypatch.setenv("RHUMBATRON_NATS_URL", nats_server.url)
    monkeypatch.setenv("RHUMBATRON_API_TOKENS", json.dumps(TOKENS))
    # An outage is found out in a second: each cold request pays the connect bound.
    monkeypatch.setenv("RHUMBATRON_NATS_CONNECT_TIMEOUT_S", "0.25")
    process.reset_for_tests()
    yield
    process.reset_for_tests()


@pytest.fixture
def writer(lambda_env: None) -> Iterator[Rhumbatron]:
    """Another role writing dead letters into the same state directory."""
    app = bootstrap(load_settings())
    yield app
    app.product().close()


def test_the_handler_serves_the_api_and_keeps_one_connection_across_invocations(
    writer: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a dead-lettered command written by another role
    cmd = command()
    letter_id = command_letter(writer, cmd)
    # WHEN API Gateway invokes the function: a list, then a Retry, then a call with no token
    listed = lambda_handler.handler(
        _http_api_event("GET", "/dead-letters", query="limit=5"),
        None,
        runtime=process.process_runtime,
    )
    connection = process.process_runtime()._nc
    retried = lambda_handler.handler(
        _http_api_event("POST", f"/dead-letters/{letter_id}/retry"),
        None,
        runtime=process.process_runtime,
    )
    refused = lambda_handler.handler(
        _http_api_event("GET", "/dead-letters", token=None), None, runtime=process.process_runtime
    )
    # THEN each answer is the API's, over one runtime and one NATS connection
    assert listed["statusCode"] == 200, listed
    assert [item["id"] for item in json.loads(listed["body"])["items"]] == [letter_id]
    assert retried["statusCode"] == 200, retried
    assert json.loads(retried["body"])["messageId"] == f"integration:{cmd.command_id}:2"
    assert [m.message_id for m in queued(nats_server.url, cmd.command_id)] == [
        f"integration:{cmd.command_id}:2"
    ]
    assert refused["statusCode"] == 401
    assert refused["headers"]["www-authenticate"] == "Bearer"
    assert process.process_runtime()._nc is connection is not None


def test_the_handler_answers_health_503_while_nats_is_down(
    lambda_env: None, nats_server: NatsServerProcess
) -> None:
    nats_server.stop()
    answer = lambda_handler.handler(
        _http_api_event("GET", "/health", token=None), None, runtime=process.process_runtime
    )
    assert answer["statusCode"] == 503
    assert json.loads(answer["body"])["nats"] is False


def test_the_handler_serves_the_docs_page_its_assets_and_the_document_without_a_token(
    lambda_env: None,
) -> None:
    # WHEN API Gateway passes the public routes to the function, with no Authorization header
    answers = {
        path: lambda_handler.handler(
            _http_api_event("GET", path, token=None), None, runtime=process.process_runtime
        )
        for path in (
            "/docs",
            "/docs/static/swagger-ui-bundle.js",
            "/docs/static/swagger-ui.css",
            "/docs/static/favicon.png",
            "/openapi.json",
        )
    }
    # THEN each is served, and fits in a Lambda response (6 MB, base64 included)
    for path, answer in answers.items():
        assert answer["statusCode"] == 200, (path, answer["statusCode"])
        assert 0 < len(answer["body"]) < 6_000_000, path
    assert "swagger-ui-bundle.js" in answers["/docs"]["body"]
    assert "/dead-letters" in json.loads(answers["/openapi.json"]["body"])["paths"]
