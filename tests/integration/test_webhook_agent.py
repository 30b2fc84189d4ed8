"""The webhook agent runtime against a real HTTP receiver on loopback: a wake arrives signed
and verifies, a secret rotation keeps receivers on either secret working, and every way of
not taking a wake (non-2xx, redirect, timeout, refused connection, unsafe URL, unknown or
scripted agent, another tenant's agent) raises, so the agent-wakeups queue retries it and
dead-letters it at last."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import pytest_asyncio

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.agents.registry import AGENTS_SCHEMA, AgentRegistry
from rhumbatron.agents.signing import verify
from rhumbatron.agents.webhook import WebhookAgentRuntime
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.tasks import TaskState, TaskStatus
from rhumbatron.errors import (
    AgentNotFoundError,
    AgentRegistryError,
    MessagingError,
    UnsafeWebhookUrlError,
    WebhookDeliveryError,
    WebhookSignatureError,
)
from rhumbatron.protocol.envelopes import Command

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
AGENT = "reviewer-1"
EVENT_ID = "evt_" + "ab" * 16
TASK = TaskState(task_id="t1", change_id="c1", status=TaskStatus.ASSIGNED, agent_id=AGENT)
#: The tenant owning each project: the wake's agent is looked up in its tenant.
TENANT_OF = {"acme-web": "acme"}


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    refused: str | None  # why verification failed; None when the signature verified


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 that verifies each request with the secrets it holds.

    It answers 401 to a request that fails verification, else ``status`` (with
    ``location`` for a redirect).
    """

    clock: ManualClock
    tolerance_s: int
    secrets: list[str] = field(default_factory=list)
    status: int = 204
    answer: bytes = b""
    location: str | None = None
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = dict(self.headers.items())
                try:
                    verify(
                        receiver.secrets,
                        headers,
                        body,
                        now=receiver.clock.now(),
                        tolerance_s=receiver.tolerance_s,
                    )
                    refused = None
                except WebhookSignatureError as exc:
                    refused = str(exc)
                receiver.requests.append(Request(self.path, headers, body, refused))
                self.send_response(401 if refused else receiver.status)
                if receiver.location:
                    self.send_header("location", receiver.location)
                self.send_header("content-length", str(len(receiver.answer)))
                self.end_headers()
                self.wfile.write(receiver.answer)

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep pytest's output to the test's own

        # Port 0: the kernel picks a free port; listening starts here, before any request.
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll interval only makes shutdown() at teardown return quickly.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/wake"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", **overrides)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, webhook_allowed_hosts=("127.0.0.1",), webhook_timeout_s=0.5)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def registry(tmp_path: Path, settings: Settings, clock: ManualClock) -> Iterator[AgentRegistry]:
    store = SqliteStore(tmp_path / "product.sqlite", settings, AGENTS_SCHEMA)
    yield AgentRegistry(store, settings, clock)
    store.close()


@pytest.fixture
def receiver(clock: ManualClock, settings: Settings) -> Iterator[Receiver]:
    server = Receiver(clock, settings.webhook_tolerance_s)
    yield server
    server.stop()


@pytest_asyncio.fixture
async def runtime(
    registry: AgentRegistry, settings: Settings, clock: ManualClock
) -> AsyncIterator[WebhookAgentRuntime]:
    agents = WebhookAgentRuntime(registry, settings, clock, tenant_of=TENANT_OF.get)
    yield agents
    await agents.aclose()


def wake(attempt: int = 1, agent: str = AGENT) -> Command:
    return Command.create(
        command_id=f"cmd_{EVENT_ID}_t1",
        command_type="agent.wake",
        project_id="acme-web",
        change_id="c1",
        task_id="t1",
        attempt=attempt,
        created_at=NOW,
        payload={"agentId": agent, "reason": "task.blocked", "eventId": EVENT_ID},
    )


async def test_a_wake_arrives_signed_and_verifies_with_the_registered_secret(
    registry: AgentRegistry, runtime: WebhookAgentRuntime, receiver: Receiver
) -> None:
    # GIVEN a webhook agent whose receiver holds the registered secret
    record = registry.register_webhook("acme", AGENT, receiver.url)
    receiver.secrets = list(record.secrets)
    command = wake()

    # WHEN the agent is woken
    await runtime.wake(AGENT, TASK, command)

    # THEN one POST arrived, its signature verified, its ID is the command ID
    [request] = receiver.requests
    assert request.refused is None
    assert request.path == "/wake"
    headers = {name.lower(): value for name, value in request.headers.items()}
    assert headers["webhook-id"] == command.command_id
    assert headers["webhook-timestamp"] == str(int(NOW.timestamp()))
    assert headers["content-type"] == "application/json"
    # AND the body points at the work: compact JSON with sorted keys
    expected = {
        "type": "agent.wake",
        "commandId": command.command_id,
        "attempt": 1,
        "projectId": "acme-web",
        "changeId": "c1",
        "taskId": "t1",
        "agentId": AGENT,
        "reason": "task.blocked",
        "eventId": EVENT_ID,
        "taskStatus": "assigned",
    }
    assert request.body == json.dumps(expected, sort_keys=True, separators=(",", ":")).encode()


async def test_a_retry_keeps_the_webhook_id_so_the_receiver_can_dedupe(
    registry: AgentRegistry, runtime: WebhookAgentRuntime, receiver: Receiver, clock: ManualClock
) -> None:
    receiver.secrets = list(registry.register_webhook("acme", AGENT, receiver.url).secrets)
    # WHEN the same wake is delivered again as attempt 2, 30 s later
    await runtime.wake(AGENT, TASK, wake(attempt=1))
    clock.advance(30)
    await runtime.wake(AGENT, TASK, wake(attempt=2))
    # THEN both carry the same webhook-id, and each verified with its own timestamp
    first, second = receiver.requests
    assert first.refused is None and second.refused is None
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert int(second.headers["webhook-timestamp"]) - int(first.headers["webhook-timestamp"]) == 30
    assert json.loads(second.body)["attempt"] == 2


async def test_during_a_rotation_receivers_on_the_old_or_the_new_secret_both_verify(
    registry: AgentRegistry, runtime: WebhookAgentRuntime, receiver: Receiver
) -> None:
    # GIVEN an agent whose secret is being rotated
    (old,) = registry.register_webhook("acme", AGENT, receiver.url).secrets
    new = registry.rotate_secret("acme", AGENT)

    # WHEN a receiver still holding only the OLD secret is woken
    receiver.secrets = [old]
    await runtime.wake(AGENT, TASK, wake())
    # AND then the receiver switches to only the NEW secret
    receiver.secrets = [new]
    await runtime.wake(AGENT, TASK, wake(attempt=2))

    # THEN both wakes verified
    assert [r.refused for r in receiver.requests] == [None, None]

    # AND once the old secret is dropped, a receiver still on it refuses: the wake fails
    registry.drop_old_secret("acme", AGENT)
    receiver.secrets = [old]
    with pytest.raises(WebhookDeliveryError, match="answered 401"):
        await runtime.wake(AGENT, TASK, wake(attempt=3))
    assert receiver.requests[-1].refused is not None
    assert "no signature" in receiver.requests[-1].refused


async def test_a_500_answer_raises_a_delivery_error_quoting_the_answer(
    registry: AgentRegistry, runtime: WebhookAgentRuntime, receiver: Receiver
) -> None:
    # GIVEN a receiver that answers 500 with a long body
    receiver.secrets = list(registry.register_webhook("acme", AGENT, receiver.url).secrets)
    receiver.status = 500
    receiver.answer = b"database down " + b"x" * 1000
    # WHEN the agent is woken
    with pytest.raises(WebhookDeliveryError) as caught:
        await runtime.wake(AGENT, TASK, wake())
    # THEN the error is a messaging error naming the status, the wake and the first 200 chars
    message = str(caught.value)
    assert isinstance(caught.value, MessagingError)
    assert "answered 500" in message and wake().command_id in message and AGENT in message
    assert "database down " + "x" * 186 + "'" in message
    assert "x" * 187 not in message


async def test_a_redirect_is_not_followed(
    registry: AgentRegistry, runtime: WebhookAgentRuntime, receiver: Receiver
) -> None:
    # GIVEN a receiver that redirects elsewhere
    receiver.secrets = list(registry.register_webhook("acme", AGENT, receiver.url).secrets)
    receiver.status = 307
    receiver.location = receiver.url.replace("/wake", "/elsewhere")
    # WHEN the agent is woken
    with pytest.raises(WebhookDeliveryError, match="answered 307"):
        await runtime.wake(AGENT, TASK, wake())
    # THEN the redirect target was never called
    assert [r.path for r in receiver.requests] == ["/wake"]


async def test_a_receiver_that_never_answers_raises_a_delivery_error_after_the_timeout(
    registry: AgentRegistry, runtime: WebhookAgentRuntime
) -> None:
    # GIVEN a socket that listens but never accepts: the connection opens, no answer comes
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        registry.register_webhook("acme", AGENT, f"http://127.0.0.1:{port}/wake")
        # WHEN the agent is woken
        with pytest.raises(WebhookDeliveryError, match=r"no answer within 0\.5 s"):
            await runtime.wake(AGENT, TASK, wake())


async def test_a_refused_connection_raises_a_delivery_error(
    registry: AgentRegistry, runtime: WebhookAgentRuntime
) -> None:
    # GIVEN a URL at a port nobody listens on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    registry.register_webhook("acme", AGENT, f"http://127.0.0.1:{port}/wake")
    # WHEN / THEN the wake raises a delivery error naming the failure
    with pytest.raises(WebhookDeliveryError, match="ConnectError"):
        await runtime.wake(AGENT, TASK, wake())


async def test_an_unregistered_or_scripted_agent_raises(
    registry: AgentRegistry, runtime: WebhookAgentRuntime, receiver: Receiver
) -> None:
    # GIVEN another tenant's webhook agent "ghost"
    registry.register_webhook("globex", "ghost", receiver.url)
    # WHEN an agent the project's tenant never registered is woken
    with pytest.raises(AgentNotFoundError, match="'ghost', which the tenant \\('acme'\\)"):
        await runtime.wake("ghost", TASK, wake(agent="ghost"))
    # AND a scripted agent is woken through the webhook runtime
    registry.register_scripted("acme", "script-1")
    with pytest.raises(AgentRegistryError, match="registered as scripted"):
        await runtime.wake("script-1", TASK, wake(agent="script-1"))
    # THEN nothing was sent
    assert receiver.requests == []


async def test_a_loopback_url_is_refused_at_registration_and_at_send_without_the_allow_list(
    registry: AgentRegistry, receiver: Receiver, tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN settings without an allow-list
    strict = make_settings(tmp_path)
    # WHEN a loopback URL registers under them, THEN it is refused
    strict_store = SqliteStore(tmp_path / "strict.sqlite", strict, AGENTS_SCHEMA)
    try:
        with pytest.raises(UnsafeWebhookUrlError, match="loopback"):
            AgentRegistry(strict_store, strict, clock).register_webhook("acme", AGENT, receiver.url)
    finally:
        strict_store.close()

    # GIVEN the agent registered while 127.0.0.1 was allowed
    receiver.secrets = list(registry.register_webhook("acme", AGENT, receiver.url).secrets)
    # WHEN a runtime whose settings no longer allow it sends the wake
    agents = WebhookAgentRuntime(registry, strict, clock, tenant_of=TENANT_OF.get)
    try:
        with pytest.raises(UnsafeWebhookUrlError, match="RHUMBATRON_WEBHOOK_ALLOWED_HOSTS"):
            await agents.wake(AGENT, TASK, wake())
    finally:
        await agents.aclose()
    # THEN nothing reached the receiver
    assert receiver.requests == []


async def test_a_metadata_url_is_refused_even_with_the_allow_list(registry: AgentRegistry) -> None:
    with pytest.raises(UnsafeWebhookUrlError, match="cloud metadata"):
        registry.register_webhook("acme", AGENT, "http://169.254.169.254/latest/meta-data/")
    assert registry.get("acme", AGENT) is None


async def test_credentials_in_the_url_stay_out_of_the_delivery_error(
    registry: AgentRegistry, runtime: WebhookAgentRuntime, receiver: Receiver
) -> None:
    # GIVEN a URL carrying a password and a token (the error ends up in a dead letter)
    url = receiver.url.replace("http://", "http://bot:hunter2@") + "?token=s3cr3t"
    receiver.secrets = list(registry.register_webhook("acme", AGENT, url).secrets)
    receiver.status = 503
    # WHEN the wake is refused
    with pytest.raises(WebhookDeliveryError) as caught:
        await runtime.wake(AGENT, TASK, wake())
    # THEN the error names the URL without them
    assert "hunter2" not in str(caught.value) and "s3cr3t" not in str(caught.value)
    assert receiver.url in str(caught.value)
