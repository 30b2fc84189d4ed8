"""The cloud's router nudge: an asynchronous invoke of the router-nudge function, sent by the
publisher after a publish, against a loopback server that answers like the Lambda API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.protocol.ids import stream_index
from rhumbatron.router.nudge import LambdaNudge
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess, free_port

pytestmark = pytest.mark.integration

CALLER = Caller("acme", "system:test", correlation_id="corr-lambda-nudge")


class LambdaApi(ThreadingHTTPServer):
    """Answers ``POST /2015-03-31/functions/<name>/invocations`` as Lambda does for an
    asynchronous invoke (202, empty body), and remembers each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, object]]] = []
        super().__init__(("127.0.0.1", free_port()), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: LambdaApi

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        function = self.path.split("/functions/")[1].split("/")[0]
        invocation = self.headers.get("X-Amz-Invocation-Type", "")
        self.server.calls.append((function, invocation, json.loads(body)))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def lambda_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[LambdaApi]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    api = LambdaApi()
    thread = threading.Thread(target=api.serve_forever, daemon=True)
    thread.start()
    yield api
    api.shutdown()
    api.server_close()


async def test_a_publish_that_sent_rows_invokes_the_router_nudge_function_asynchronously(
    tmp_path: Path, nats_server: NatsServerProcess, lambda_api: LambdaApi
) -> None:
    # GIVEN a runtime configured as the cloud's publisher is
    settings = load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        router_nudge_function="rhumbatron-RouterNudgeFunction",
        lambda_endpoint_url=lambda_api.url,
    )
    app = bootstrap(settings, alarms=RecordingAlarmSink())
    assert isinstance(app.nudge, LambdaNudge)
    await app.ensure_streams()
    try:
        # WHEN an actor writes and its alarm publishes
        app.project_root("acme-web").create_project(CALLER, name="Storefront")
        await app.drain_alarms()
    finally:
        await app.close()

    # THEN the router-nudge function was invoked once, asynchronously, with the stream
    assert lambda_api.calls == [
        ("rhumbatron-RouterNudgeFunction", "Event", {"streamIndex": stream_index("acme-web")})
    ]


async def test_a_nudge_the_lambda_api_refuses_is_logged_and_does_not_fail_the_publish(
    lambda_api: LambdaApi, caplog: pytest.LogCaptureFixture
) -> None:
    import boto3
    from botocore.config import Config

    # GIVEN a Lambda endpoint that is not listening
    client = boto3.client(
        "lambda",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=1),
    )
    nudge = LambdaNudge(client, "rhumbatron-RouterNudgeFunction")
    # WHEN two nudges are sent
    await nudge.nudge(3)
    await nudge.nudge(5)
    # THEN each is counted as failed and logged with the function, its stream and why, and
    # nothing was raised (the sweep is the correctness path)
    assert (nudge.sent, nudge.failed) == (0, 2)
    said = [r.getMessage() for r in caplog.records if r.name == "rhumbatron.router.nudge"]
    assert [m.split(": ", 1)[0] for m in said] == [
        "nudging rhumbatron-RouterNudgeFunction for stream 3 failed",
        "nudging rhumbatron-RouterNudgeFunction for stream 5 failed",
    ]
    assert all("Could not connect to the endpoint URL" in m for m in said)


async def test_each_nudge_the_lambda_api_takes_is_counted_as_sent(lambda_api: LambdaApi) -> None:
    import boto3

    client = boto3.client("lambda", endpoint_url=lambda_api.url)
    nudge = LambdaNudge(client, "rhumbatron-RouterNudgeFunction")
    for stream in (1, 2, 3):
        await nudge.nudge(stream)
    assert (nudge.sent, nudge.failed) == (3, 0)
    assert [call[2] for call in lambda_api.calls] == [{"streamIndex": s} for s in (1, 2, 3)]
