"""The API function (``functions/api/app.py``), invoked with the sample HTTP API events.

The function runs as template.yaml configures it — JWT mode, the app checking every token
itself — except that the key is the HS256 secret the sample events were signed with, not
the issuer's JWKS. A real nats-server holds what the API sends; the other roles' functions
(integration, dead-letter) run beside it in the same state directory, as in the cloud.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import jwt
import pytest

from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.messaging.commands import LAST_ERROR_HEADER, ORIGIN_QUEUE_HEADER
from rhumbatron.protocol.envelopes import Command
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import FakeLambdaContext, load_app, sample_event

pytestmark = pytest.mark.integration

#: The secret, issuer and audience of the token in the sample events (template.yaml header).
SAMPLE_SECRET = "rhumbatron-sample-jwt-secret-for-local-invokes-only"
ISSUER = "https://auth.rhumbatron.example/"
AUDIENCE = "rhumbatron-api"
QUEUE_TIME_MS = 900_000


@pytest.fixture
def lambda_env(
    tmp_path: Path, nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """The API function's environment as template.yaml sets it, with the samples' key."""
    for name, value in {
        "RHUMBATRON_STATE_DIR": str(tmp_path / "state"),
        "RHUMBATRON_JOURNAL_MODE": "DELETE",
        "RHUMBATRON_NETWORK_FILESYSTEM": "true",
        "RHUMBATRON_NATS_URL": nats_server.url,
        "RHUMBATRON_API_AUTH_MODE": "jwt",
        "RHUMBATRON_API_JWT_SECRET": SAMPLE_SECRET,
        "RHUMBATRON_API_JWT_ISSUER": ISSUER,
        "RHUMBATRON_API_JWT_AUDIENCE": AUDIENCE,
        "RHUMBATRON_API_JWT_TENANT_CLAIM": "tenant",
        # The sample events' tokens live until 2100, so that a local invoke works any day.
        "RHUMBATRON_API_JWT_MAX_LIFETIME_S": "3000000000",
        "RHUMBATRON_NATS_CONNECT_TIMEOUT_S": "0.5",
        "POWERTOOLS_SERVICE_NAME": "api",
    }.items():
        monkeypatch.setenv(name, value)
    process.reset_for_tests()
    yield load_settings()
    process.reset_for_tests()


@pytest.fixture
def api(lambda_env: Settings) -> ModuleType:
    return load_app("api")


def _body(answer: dict[str, Any]) -> Any:
    return json.loads(answer["body"])


def _with_token(event: dict[str, Any], **claims: Any) -> dict[str, Any]:
    """The event with another token: the sample's claims, changed as given."""
    # API Gateway passes the claims on as strings; the token holds the times as numbers.
    base: dict[str, Any] = dict(event["requestContext"]["authorizer"]["jwt"]["claims"])
    base.update(iat=int(base["iat"]), exp=int(base["exp"]))
    base.update(claims)
    token = jwt.encode(base, SAMPLE_SECRET, algorithm="HS256")
    return {**event, "headers": {**event["headers"], "authorization": f"Bearer {token}"}}


def _fail_on_integration(settings: Settings, project_id: str) -> Command:
    """A command of ``project_id`` that failed its last delivery on integration, moved to the
    dead-letter queue the way the queue runtime moves it."""
    command = Command.create(
        command_id=f"cmd_{uuid.uuid4().hex}",
        command_type="change.settle",
        project_id=project_id,
        change_id="chg_0123456789abcdef0123",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        payload={"reason": "task_failed"},
    )

    async def send() -> None:
        app = bootstrap(settings)
        try:
            bus = await app.command_bus()
            headers = {ORIGIN_QUEUE_HEADER: "integration", LAST_ERROR_HEADER: "boom"}
            await bus.send("dead-letter", command, headers=headers)
        finally:
            await app.close()

    asyncio.run(send())
    return command


def test_health_answers_without_a_token(api: ModuleType) -> None:
    # WHEN API Gateway forwards the unauthenticated /health route
    answer = api.lambda_handler(sample_event("api_get_health.json"), FakeLambdaContext())
    # THEN the app reports NATS and the product database up
    assert answer["statusCode"] == 200, answer
    assert _body(answer) == {"status": "ok", "nats": True, "productDatabase": True}


def test_a_command_sent_through_the_api_is_handled_and_its_failure_listed(
    api: ModuleType, lambda_env: Settings
) -> None:
    # GIVEN the operator's project.provision, sent through the API (the sample POST)
    sent = api.lambda_handler(sample_event("api_send_command.json"), FakeLambdaContext())
    assert sent["statusCode"] == 202, sent
    assert _body(sent)["messageId"] == "integration:cmd_provision_acme-web"

    # WHEN the integration function's tick handles it, a later command of the project fails
    # on integration, and the dead-letter function's tick records the letter
    integration, dead_letter = load_app("integration"), load_app("dead_letter")
    context = FakeLambdaContext(remaining_ms=QUEUE_TIME_MS)
    handled = integration.lambda_handler(sample_event("integration_schedule.json"), context)
    assert handled["queues"]["integration"]["done"] == 1
    failed = _fail_on_integration(lambda_env, "acme-web")
    recorded = dead_letter.lambda_handler(sample_event("dead_letter_schedule.json"), context)
    assert recorded["queues"]["dead-letter"]["done"] == 1

    # THEN the tenant's operator lists the letter through the API (the sample GET)
    listed = api.lambda_handler(sample_event("api_list_dead_letters.json"), FakeLambdaContext())
    assert listed["statusCode"] == 200, listed
    items = _body(listed)["items"]
    assert [(item["commandId"], item["queue"]) for item in items] == [
        (failed.command_id, "integration")
    ]


def test_the_app_checks_the_token_itself_behind_the_authorizer(api: ModuleType) -> None:
    event = sample_event("api_list_dead_letters.json")
    # a token without the route's scope (as if the authorizer's scopes drifted): 403
    narrow = api.lambda_handler(_with_token(event, scope="commands:send"), FakeLambdaContext())
    assert narrow["statusCode"] == 403
    assert "dead-letters:read" in json.dumps(_body(narrow))
    # an expired token (as if the authorizer were bypassed): 401
    expired = api.lambda_handler(
        _with_token(event, exp=int(time.time()) - 3600), FakeLambdaContext()
    )
    assert expired["statusCode"] == 401
    # another audience's token: 401
    foreign = api.lambda_handler(_with_token(event, aud="another-api"), FakeLambdaContext())
    assert foreign["statusCode"] == 401
    # no token at all: 401
    bare = {**event, "headers": {k: v for k, v in event["headers"].items() if k != "authorization"}}
    assert api.lambda_handler(bare, FakeLambdaContext())["statusCode"] == 401
