"""The API's edge (issue #21): what a refusal may quote, who may use the platform routes, what
a request may carry, and what a process logs or prints on its way.

Each test holds one finding of the security review, on the real app (FastAPI's TestClient
over :func:`~rhumbatron.api.create_api`, a real nats-server, static tokens, a manual clock),
the real Lambda handler, the real CLI in a child process, and real httpx requests:

* a 422 never quotes a secret, nor a whole request body;
* ``POST /replays`` and ``GET /consumers`` need a platform token, whatever the scopes;
* a replay time with no UTC equivalent, or a sequence no store holds, is a 422;
* a JWT issued in the future, or living longer than ``api_jwt_max_lifetime_s``, is a 401;
* a body over ``api_max_body_bytes`` is a 413, declared or streamed, on uvicorn and Lambda;
* a bad ``RHUMBATRON_API_TOKENS`` is one line and exit status 1, no traceback;
* httpx's request lines show no user info and no query;
* the local dashboard says that it hands its token to any local client.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from api.support import OPERATOR, PLATFORM, PROJECT, TENANT, bearer
from rhumbatron.api import authenticator_from_settings, create_api
from rhumbatron.api.lambda_handler import handler as lambda_api
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import Rhumbatron
from rhumbatron_dev.dashboard import dashboard_router
from rhumbatron_dev.local.nats_server import NatsServerProcess

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration

#: A webhook secret in the registry's form; no answer may ever contain it.
SECRET = "whsec_" + "S3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3"
ONE_MIB = 1_048_576


def _refusal(response: httpx.Response) -> dict[str, Any]:
    """The error of an answer in the API's model (it fails the test otherwise)."""
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "field"}, error
    return error


# -- 1. a 422 quotes no secret ---------------------------------------------------------------


_WEBHOOK = {"kind": "webhook", "url": "http://127.0.0.1:9/hook"}
_SELECTOR = {"kinds": ["task.failed"]}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        pytest.param(
            "/agents",
            {"agentId": "r1", "kind": "webhook", "secrets": [SECRET]},
            "body",
            id="webhook-agent-without-url",
        ),
        pytest.param(
            "/subscriptions",
            {
                "name": "hook",
                "selector": _SELECTOR,
                "reaction": {**_WEBHOOK, "kind": "webhok", "secrets": [SECRET]},
            },
            "reaction",
            id="unknown-reaction-kind",
        ),
        pytest.param(
            "/subscriptions",
            {
                "name": "hook",
                "selector": _SELECTOR,
                "reaction": {**_WEBHOOK, "secrets": [SECRET], "secret": SECRET},
            },
            "reaction.webhook.secret",
            id="extra-secret-field",
        ),
        pytest.param(
            "/agents",
            {"agentId": "r1", **_WEBHOOK, "secrets": SECRET},
            "secrets",
            id="secrets-as-a-string",
        ),
    ],
)
def test_a_refused_request_is_a_422_that_names_the_field_and_never_quotes_the_secret(
    client: TestClient, path: str, body: dict[str, Any], field: str
) -> None:
    # GIVEN a request carrying a webhook secret that the models refuse
    # WHEN a tenant's operator sends it
    response = client.post(path, json=body, headers=bearer(OPERATOR))
    # THEN 422, naming the field, and no part of the secret appears in the answer (not
    # even the start of it that a shortened quote would keep)
    assert response.status_code == 422, response.text
    assert _refusal(response)["field"] == field
    assert "whsec_" not in response.text and "S3cr3" not in response.text


def test_a_refused_command_payload_never_quotes_a_secret_field(client: TestClient) -> None:
    # GIVEN a command whose payload carries an unknown field named like a credential
    command = {
        "commandId": f"cmd_{uuid.uuid4().hex}",
        "commandType": "agent.wake",
        "projectId": PROJECT,
        "createdAt": "2026-01-01T00:00:00Z",
        "payload": {"agentId": "agent-1", "reason": "task.ready", "apiToken": SECRET},
    }
    # WHEN it is sent (the envelope's own message describes the payload's problems)
    response = client.post(
        "/commands", json={"queue": "agent-wakeups", "command": command}, headers=bearer(OPERATOR)
    )
    # THEN 422 on the payload, naming the bad field, without its value
    assert response.status_code == 422, response.text
    error = _refusal(response)
    assert error["field"] == "command.payload"
    assert "apiToken" in error["message"]
    assert "S3cr3t" not in response.text


def test_a_refused_ordinary_scalar_is_still_quoted(client: TestClient) -> None:
    # GIVEN a limit out of range (no secret in it)
    # WHEN the dead letters are listed with it
    response = client.get("/dead-letters", params={"limit": 100000}, headers=bearer(OPERATOR))
    # THEN the 422 still says which value was wrong
    assert response.status_code == 422
    error = _refusal(response)
    assert error["field"] == "limit" and "100000" in error["message"]


# -- 2. the platform routes need a platform token ---------------------------------------------


_DRY_RUN = {
    "source": "stream",
    "subscription": "project-view-projector",
    "dryRun": True,
    "stream": 0,
    "toSeq": 1,
}


def test_a_tenant_token_with_replay_write_cannot_replay_a_shared_stream(
    client: TestClient,
) -> None:
    # GIVEN a token bound to one tenant that holds every scope, replay:write included
    # WHEN it asks for a replay of a stream (every tenant's events)
    response = client.post("/replays", json=_DRY_RUN, headers=bearer(OPERATOR))
    # THEN 403 platform_required, saying which principal is needed
    assert response.status_code == 403, response.text
    error = _refusal(response)
    assert error["code"] == "platform_required"
    assert "platform" in error["message"] and TENANT in error["message"]


def test_a_tenant_token_is_refused_a_replay_before_its_body_is_looked_at(
    client: TestClient,
) -> None:
    # GIVEN a tenant-bound token with replay:write and a replay body that is not valid
    body = {**_DRY_RUN, "toSeq": 0, "subscription": "no-such-subscription"}
    # WHEN it is sent
    response = client.post("/replays", json=body, headers=bearer(OPERATOR))
    # THEN 403 platform_required, not a 422 that would describe the body to a tenant
    assert response.status_code == 403, response.text
    assert _refusal(response)["code"] == "platform_required"


def test_a_platform_token_may_replay(client: TestClient) -> None:
    # GIVEN a platform token (tenant "*") with replay:write
    # WHEN it asks for the same dry run
    response = client.post("/replays", json=_DRY_RUN, headers=bearer(PLATFORM))
    # THEN the replay runs
    assert response.status_code == 200, response.text
    assert response.json()["dryRun"] is True


def test_a_tenant_token_with_consumers_read_cannot_list_every_consumers_lag(
    client: TestClient,
) -> None:
    # GIVEN a token bound to one tenant that holds consumers:read
    # WHEN it lists the consumers (their counts span every tenant)
    refused = client.get("/consumers", headers=bearer(OPERATOR))
    # THEN 403 platform_required; a platform token lists them
    assert refused.status_code == 403, refused.text
    assert _refusal(refused)["code"] == "platform_required"
    assert "consumers" not in refused.json()
    allowed = client.get("/consumers", headers=bearer(PLATFORM))
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["consumers"]


def test_the_openapi_document_says_the_platform_routes_need_a_platform_token(
    client: TestClient,
) -> None:
    # WHEN the OpenAPI document is read
    paths = client.get("/openapi.json").json()["paths"]
    # THEN the 403 of both platform routes speaks of the platform token
    for path, method in (("/replays", "post"), ("/consumers", "get")):
        assert "platform token" in paths[path][method]["responses"]["403"]["description"]


# -- 3. replay bounds --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param({"toSeq": None, "toTime": "9999-12-31T23:59:59-05:00"}, "toTime", id="late"),
        pytest.param({"toSeq": None, "toTime": "0001-01-01T00:00:00+05:00"}, "toTime", id="early"),
        pytest.param({"toSeq": 2**63}, "toSeq", id="seq-over-int64"),
        pytest.param(
            {
                "source": "archive",
                "stream": None,
                "toSeq": None,
                "start": "9999-12-31T20:00:00-05:00",
                "end": "9999-12-31T23:59:59-05:00",
            },
            "start",
            id="archive-range",
        ),
    ],
)
def test_a_replay_point_no_store_can_hold_is_a_422_naming_the_field(
    client: TestClient, change: dict[str, Any], field: str
) -> None:
    # GIVEN a replay whose time has no UTC equivalent in range, or whose sequence no
    # signed 64-bit store holds
    body = {k: v for k, v in {**_DRY_RUN, **change}.items() if v is not None}
    # WHEN a platform operator asks for it
    response = client.post("/replays", json=body, headers=bearer(PLATFORM))
    # THEN 422 on that field, not a 500
    assert response.status_code == 422, response.text
    assert _refusal(response)["field"] == field


# -- 4. JWT lifetimes ---------------------------------------------------------------------------


JWT_SECRET = "a-shared-secret-of-32-characters!"
ISSUER = "https://login.example.test/"
AUDIENCE = "rhumbatron-api"


def _jwt_client(runtime: Rhumbatron, clock: ManualClock, **settings: Any) -> TestClient:
    jwt_settings = load_settings(
        state_dir=runtime.settings.state_dir,
        api_auth_mode="jwt",
        api_jwt_secret=JWT_SECRET,
        api_jwt_issuer=ISSUER,
        api_jwt_audience=AUDIENCE,
        **settings,
    )
    return TestClient(create_api(runtime, authenticator_from_settings(jwt_settings, clock)))


def _token(clock: ManualClock, **changes: Any) -> str:
    now = int(clock.now().timestamp())
    claims = {
        "sub": "user:ann",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 300,
        "tenant": TENANT,
        "scope": "dead-letters:read",
    }
    claims.update(changes)
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, JWT_SECRET, "HS256")


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        pytest.param({"iat": "yesterday"}, "iat", id="iat-not-a-time"),
        pytest.param({"iat": True}, "iat", id="iat-a-boolean"),
        pytest.param({"iat": "@now+3600", "exp": "@now+3900"}, "issued", id="iat-in-the-future"),
        pytest.param({"iat": None, "exp": 1e300}, "lifetime", id="exp-far-away"),
        pytest.param({"exp": "@now+172800"}, "lifetime", id="exp-two-days-away"),
        pytest.param({"iat": "@now-172800", "exp": "@now+60"}, "lifetime", id="issued-for-long"),
    ],
)
def test_a_jwt_issued_in_the_future_or_living_too_long_is_refused_401(
    runtime: Rhumbatron, clock: ManualClock, changes: dict[str, Any], says: str
) -> None:
    # GIVEN the API on JWTs with the default maximum lifetime (24 h) and a 30 s leeway
    now = int(clock.now().timestamp())
    claims = {
        k: now + int(v.removeprefix("@now")) if isinstance(v, str) and v.startswith("@now") else v
        for k, v in changes.items()
    }
    with _jwt_client(runtime, clock) as api:
        # WHEN a token with those times is presented
        response = api.get("/dead-letters", headers=bearer(_token(clock, **claims)))
    # THEN 401, saying what is wrong with it
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    assert says in _refusal(response)["message"]


def test_a_jwt_within_the_maximum_lifetime_and_the_leeway_is_accepted(
    runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a maximum lifetime of 10 minutes
    now = int(clock.now().timestamp())
    with _jwt_client(runtime, clock, api_jwt_max_lifetime_s=600) as api:
        # WHEN tokens of 10 minutes (issued 20 s ahead: within the leeway) and of 11 are shown
        fits = api.get("/dead-letters", headers=bearer(_token(clock, iat=now + 20, exp=now + 620)))
        long = api.get("/dead-letters", headers=bearer(_token(clock, exp=now + 660)))
    # THEN the first is served, the second refused
    assert fits.status_code == 200, fits.text
    assert long.status_code == 401 and "600" in _refusal(long)["message"]


def test_the_maximum_jwt_lifetime_is_a_setting_of_positive_seconds() -> None:
    # GIVEN the settings' defaults and a zero maximum lifetime
    # WHEN they are loaded
    # THEN the default is 24 h, and zero is refused naming the setting
    assert load_settings().api_jwt_max_lifetime_s == 86_400
    with pytest.raises(Exception, match="RHUMBATRON_API_JWT_MAX_LIFETIME_S"):
        load_settings(api_jwt_max_lifetime_s=0)


# -- 5. the body limit --------------------------------------------------------------------------


def _assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text[:300]
    error = _refusal(response)
    assert error["code"] == "payload_too_large" and error["field"] == "body"
    assert str(ONE_MIB) in error["message"]


def test_a_body_declared_over_the_limit_is_refused_413(client: TestClient) -> None:
    # GIVEN a body one byte over the default limit (1 MiB), with its Content-Length
    body = b" " * (ONE_MIB + 1)
    # WHEN it is posted
    response = client.post(
        "/commands",
        content=body,
        headers={**bearer(OPERATOR), "Content-Type": "application/json"},
    )
    # THEN 413 payload_too_large in the API's error model
    _assert_too_large(response)


def test_a_streamed_body_over_the_limit_is_refused_413(client: TestClient) -> None:
    # GIVEN a chunked body with no Content-Length that grows past the limit
    def chunks() -> Iterator[bytes]:
        for _ in range(17):
            yield b" " * 65_536

    # WHEN it is posted
    response = client.post(
        "/commands",
        content=chunks(),
        headers={**bearer(OPERATOR), "Content-Type": "application/json"},
    )
    # THEN 413, counted while it was received
    assert "content-length" not in {k.lower() for k in response.request.headers}
    _assert_too_large(response)


def test_a_body_within_the_limit_is_read_as_usual(client: TestClient) -> None:
    # GIVEN a body just under the limit that is not a valid request
    body = b" " * (ONE_MIB - 10) + b"{}"
    # WHEN it is posted
    response = client.post(
        "/commands", content=body, headers={**bearer(OPERATOR), "Content-Type": "application/json"}
    )
    # THEN it was read and validated: a 422, not a 413
    assert response.status_code == 422, response.text[:300]


@pytest.fixture
def lambda_env(
    tmp_path: Path, nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The API function's environment, pointed at this test's server; a fresh container."""
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "lambda-state"))
    monkeypatch.setenv("RHUMBATRON_NATS_URL", nats_server.url)
    monkeypatch.setenv("RHUMBATRON_NATS_CONNECT_TIMEOUT_S", "0.25")
    monkeypatch.setenv("RHUMBATRON_API_TOKENS", json.dumps({OPERATOR: {"tenant": TENANT}}))
    process.reset_for_tests()
    yield
    process.reset_for_tests()


def test_the_lambda_handler_refuses_a_body_over_the_limit_413(lambda_env: None) -> None:
    # GIVEN an API Gateway (HTTP API) event whose body is over the limit, with no
    # Content-Length header (API Gateway need not pass one on)
    event = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/commands",
        "rawQueryString": "",
        "headers": {
            "host": "abc123.execute-api.eu-west-1.amazonaws.com",
            "authorization": f"Bearer {OPERATOR}",
            "content-type": "application/json",
        },
        "requestContext": {
            "http": {
                "method": "POST",
                "path": "/commands",
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
            },
            "requestId": str(uuid.uuid4()),
            "stage": "$default",
        },
        "body": " " * (ONE_MIB + 1),
        "isBase64Encoded": False,
    }
    # WHEN the function is invoked with it
    answer = lambda_api(event, None, runtime=process.process_runtime)
    # THEN 413 in the API's error model
    assert answer["statusCode"] == 413, answer
    assert json.loads(answer["body"])["error"]["code"] == "payload_too_large"


def test_the_body_limit_is_a_setting_of_bytes() -> None:
    # GIVEN the settings' defaults
    # WHEN they are loaded
    # THEN the limit is 1 MiB, and a limit below one byte is refused
    assert load_settings().api_max_body_bytes == ONE_MIB
    with pytest.raises(Exception, match="RHUMBATRON_API_MAX_BODY_BYTES"):
        load_settings(api_max_body_bytes=0)


# -- 6. a bad token setting is one line ------------------------------------------------------


def _cli(tmp_path: Path, *args: str, tokens: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env.update(RHUMBATRON_STATE_DIR=str(tmp_path / "cli-state"), RHUMBATRON_API_TOKENS=tokens)
    return subprocess.run(
        [sys.executable, "-m", "rhumbatron.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "tokens",
    [
        pytest.param("not json", id="not-json"),
        pytest.param('{"tok-aaaaaaaaaaaaaaaa": ', id="cut-short"),
        pytest.param('["tok-aaaaaaaaaaaaaaaa"]', id="a-list"),
    ],
)
def test_rhumbatron_api_with_a_bad_token_setting_exits_1_with_one_line(
    tmp_path: Path, tokens: str
) -> None:
    # GIVEN RHUMBATRON_API_TOKENS that is not a JSON object of grants
    # WHEN `rhumbatron api` starts
    done = _cli(tmp_path, "api", "--port", "1", tokens=tokens)
    # THEN exit status 1 (bad settings), one line naming the variable, no traceback, the
    # token not quoted, and no server announced
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rhumbatron api: "), done.stderr
    assert "RHUMBATRON_API_TOKENS" in lines[0]
    assert "tok-aaaa" not in done.stderr
    assert "http://" not in done.stderr


def test_rhumbatron_up_with_a_bad_token_setting_exits_1_before_starting_anything(
    tmp_path: Path,
) -> None:
    # GIVEN RHUMBATRON_API_TOKENS that is not JSON
    root = tmp_path / "up-root"
    # WHEN `rhumbatron up` starts
    done = _cli(tmp_path, "up", "--root", str(root), "--duration", "1", tokens="not json")
    # THEN exit status 1, one line naming the variable, no traceback, and no stack started
    # (its root was never made) nor port taken
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "RHUMBATRON_API_TOKENS" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not root.exists()
    assert "dashboard" not in done.stdout


# -- 7. httpx's request lines ------------------------------------------------------------------


class _Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_httpx_request_lines_show_no_user_info_and_no_query(
    http_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN httpx logging at INFO, as a Lambda's root logger does
    caplog.set_level(logging.INFO, logger="httpx")
    # WHEN a webhook-like URL with credentials in it is called, async and sync
    url = f"http://hook-user:hook-pass@{http_server}/wake?token=tok-query-secret&x=1"
    async with httpx.AsyncClient() as client:
        assert (await client.get(url)).status_code == 204
    assert httpx.get(url).status_code == 204
    # THEN httpx still logs each request line, with the host and path but no credentials
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert len(lines) == 2, lines
    for line in lines:
        assert f"http://{http_server}/wake" in line
        assert "hook-pass" not in line and "hook-user" not in line
        assert "tok-query-secret" not in line


# -- 8. the local dashboard says what it hands out ------------------------------------------------


def test_the_local_dashboard_page_says_it_hands_its_token_to_any_local_client(
    runtime: Rhumbatron,
) -> None:
    # GIVEN the API with the dashboard mounted, as `rhumbatron up` serves it
    auth = authenticator_from_settings(runtime.settings, runtime.clock)
    api = create_api(runtime, auth)
    api.include_router(
        dashboard_router(runtime, token=PLATFORM, auth=auth, allowed_hosts=("127.0.0.1:8080",))
    )
    # WHEN the page is read
    with TestClient(api, base_url="http://127.0.0.1:8080") as client:
        page = client.get("/dashboard")
    # THEN it shows a note: the token is every tenant's, and any local client can read it
    assert page.status_code == 200, page.text
    assert 'id="local-token-note"' in page.text
    note = page.text.split('id="local-token-note"', 1)[1].split("</p>", 1)[0]
    assert "every tenant" in note and "this machine" in note
