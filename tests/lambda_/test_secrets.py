"""The secrets the functions read from Secrets Manager: the NATS credentials and the NATS
servers' CA (at connect), and the Anthropic key (where Clef-flash is built).

Secrets Manager is moto's, through boto3; NATS is a real nats-server that demands the
credentials; the Anthropic API is an httpx2 transport that records what reached it.
"""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from moto import mock_aws

from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import ConfigurationError, NatsUnavailableError
from rhumbatron.messaging.connection import connect_nats, read_secret_string
from rhumbatron.messaging.secrets import SecretCache
from rhumbatron.protocol.envelopes import Event
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import FakeLambdaContext, TlsFiles, issue_certificates, load_app, sample_event

pytestmark = pytest.mark.integration

USER, PASSWORD, TOKEN = "functions", "s3cret-password-0123", "s3cret-token-0123456789"


@dataclass
class AuthNatsServer(NatsServerProcess):
    """A nats-server that admits only the clients presenting ``authorization``."""

    authorization: str = ""

    def config_text(self) -> str:
        return super().config_text() + f"authorization {{ {self.authorization} }}\n"


@dataclass
class TlsNatsServer(NatsServerProcess):
    """A nats-server that speaks only TLS, with a certificate for ``localhost``."""

    tls: TlsFiles | None = None

    def config_text(self) -> str:
        assert self.tls is not None
        directory = self.tls.directory
        return (
            super().config_text()
            + f'tls {{\n  cert_file: "{directory}/server.pem"\n'
            + f'  key_file: "{directory}/server-key.pem"\n}}\n'
        )

    @property
    def tls_url(self) -> str:
        return f"tls://localhost:{self.port}"


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[TlsNatsServer]:
    server = TlsNatsServer(store_dir=tmp_path / "nats", tls=issue_certificates(tmp_path / "tls"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A boto3 Secrets Manager client on moto, with fake credentials."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        import boto3

        yield boto3.client("secretsmanager", region_name="eu-west-1")


@pytest.fixture
def silent_secrets_manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Secrets Manager at an endpoint that accepts connections and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.listen(16)
        _secrets_manager_at(monkeypatch, silent.getsockname()[1])
        yield


def _secrets_manager_at(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    """Point boto3's Secrets Manager at a local endpoint on ``port``, with fake credentials."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", f"http://127.0.0.1:{port}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")


def _secret(client: Any, value: str | bytes) -> str:
    """A new secret holding ``value``; its ARN."""
    name = f"rhumbatron/{uuid.uuid4().hex}"
    if isinstance(value, bytes):
        answer = client.create_secret(Name=name, SecretBinary=value)
    else:
        answer = client.create_secret(Name=name, SecretString=value)
    return str(answer["ARN"])


def _server(tmp_path: Path, authorization: str) -> Iterator[AuthNatsServer]:
    server = AuthNatsServer(store_dir=tmp_path / "nats", authorization=authorization)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[AuthNatsServer]:
    yield from _server(tmp_path, f"user: {USER}, password: {PASSWORD}")


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[AuthNatsServer]:
    yield from _server(tmp_path, f"token: {TOKEN}")


def _settings(tmp_path: Path, url: str, **overrides: Any) -> Settings:
    return load_settings(
        state_dir=tmp_path / "state", nats_url=url, nats_connect_timeout_s=0.5, **overrides
    )


async def _round_trip(settings: Settings) -> None:
    nc = await connect_nats(settings)
    try:
        await nc.flush(timeout=2)
    finally:
        await nc.close()


# -- NATS ----------------------------------------------------------------------------------


def test_a_queue_function_authenticates_to_nats_with_the_secrets_user_and_password(
    tmp_path: Path,
    secrets: Any,
    password_server: AuthNatsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a cluster that demands a user and password, and the secret holding them
    arn = _secret(secrets, json.dumps({"user": USER, "password": PASSWORD}))
    for name, value in {
        "RHUMBATRON_STATE_DIR": str(tmp_path / "state"),
        "RHUMBATRON_JOURNAL_MODE": "DELETE",
        "RHUMBATRON_NETWORK_FILESYSTEM": "true",
        "RHUMBATRON_NATS_URL": password_server.url,
        "RHUMBATRON_NATS_CREDENTIALS_SECRET_ARN": arn,
    }.items():
        monkeypatch.setenv(name, value)
    process.reset_for_tests()
    try:
        # WHEN the dead-letter function's tick runs (a cold start: connect, ensure streams)
        summary = load_app("dead_letter").lambda_handler(
            sample_event("dead_letter_schedule.json"), FakeLambdaContext(remaining_ms=900_000)
        )
    finally:
        process.reset_for_tests()
    # THEN it connected and polled its queue
    report = summary["queues"]["dead-letter"]
    assert (report["fetches"], report["error"]) == (1, None)


def test_a_token_from_the_secret_is_presented_and_nothing_else_gets_in(
    tmp_path: Path, secrets: Any, token_server: AuthNatsServer
) -> None:
    # GIVEN a cluster that demands a token
    arn = _secret(secrets, json.dumps({"token": TOKEN}))
    # WHEN a client connects with the secret THEN it gets a round trip through
    asyncio.run(_round_trip(_settings(tmp_path, token_server.url, nats_credentials_secret_arn=arn)))
    # AND one without credentials is refused, within the connect bound
    with pytest.raises(NatsUnavailableError, match="RHUMBATRON_NATS_URL"):
        asyncio.run(_round_trip(_settings(tmp_path, token_server.url)))


def test_refused_credentials_fail_like_an_outage_naming_the_secret(
    tmp_path: Path, secrets: Any, token_server: AuthNatsServer
) -> None:
    arn = _secret(secrets, json.dumps({"token": "not-the-token-at-all"}))
    settings = _settings(tmp_path, token_server.url, nats_credentials_secret_arn=arn)
    with pytest.raises(NatsUnavailableError) as refused:
        asyncio.run(_round_trip(settings))
    assert arn in str(refused.value)
    assert "not-the-token-at-all" not in str(refused.value)


def test_a_function_trusts_exactly_the_ca_in_its_secret(
    tmp_path: Path, secrets: Any, tls_server: TlsNatsServer
) -> None:
    # GIVEN a cluster whose certificate a private CA signed, and that CA in a secret
    assert tls_server.tls is not None
    arn = _secret(secrets, tls_server.tls.ca.read_text())
    # WHEN a client connects with the secret THEN it gets a round trip through over TLS
    trusted = _settings(tmp_path, tls_server.tls_url, nats_tls_ca_secret_arn=arn)
    asyncio.run(_round_trip(trusted))
    # AND one trusting another CA, or only the system's, is refused like an unreachable server
    stranger = issue_certificates(tmp_path / "stranger")
    other_arn = _secret(secrets, stranger.ca.read_text())
    for settings in (
        _settings(tmp_path, tls_server.tls_url, nats_tls_ca_secret_arn=other_arn),
        _settings(tmp_path, tls_server.tls_url),
    ):
        with pytest.raises(NatsUnavailableError, match=re.escape(tls_server.tls_url)):
            asyncio.run(_round_trip(settings))


def test_a_ca_secret_without_a_certificate_is_named_by_its_arn(
    tmp_path: Path, secrets: Any
) -> None:
    arn = _secret(secrets, "-----BEGIN NOTHING-----\nhunter2\n-----END NOTHING-----\n")
    settings = _settings(tmp_path, "tls://localhost:1", nats_tls_ca_secret_arn=arn)
    with pytest.raises(ConfigurationError) as refused:
        asyncio.run(_round_trip(settings))
    assert str(refused.value) == (
        f"the secret {arn} (RHUMBATRON_NATS_TLS_CA_SECRET_ARN) holds no usable PEM certificate "
        "(SSLError); store the CA certificate's PEM text in it"
    )


@pytest.mark.parametrize(
    ("setting", "purpose"),
    [
        ("nats_tls_ca_secret_arn", "the NATS servers' CA (RHUMBATRON_NATS_TLS_CA_SECRET_ARN)"),
        (
            "nats_credentials_secret_arn",
            "the NATS credentials (RHUMBATRON_NATS_CREDENTIALS_SECRET_ARN)",
        ),
    ],
)
def test_a_nats_secret_that_cannot_be_read_says_what_it_was_for(
    tmp_path: Path, secrets: Any, setting: str, purpose: str
) -> None:
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rhumbatron/gone-AbCdEf"
    settings = _settings(tmp_path, "nats://127.0.0.1:1", **{setting: arn})
    with pytest.raises(ConfigurationError) as refused:
        asyncio.run(_round_trip(settings))
    assert str(refused.value).startswith(
        f"cannot read {purpose} from the Secrets Manager secret {arn}: "
    )


@pytest.mark.parametrize("setting", ["nats_tls_ca_secret_arn", "nats_credentials_secret_arn"])
def test_a_secrets_manager_that_never_answers_holds_a_connect_only_as_long_as_its_timeout(
    tmp_path: Path, silent_secrets_manager: None, setting: str
) -> None:
    # GIVEN a Secrets Manager endpoint that accepts connections and never answers
    arn = f"arn:aws:secretsmanager:eu-west-1:123456789012:secret:rhumbatron/{setting}-x"
    settings = _settings(tmp_path, "nats://127.0.0.1:1", **{setting: arn})
    # WHEN a function connects
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match="cannot read"):
        asyncio.run(_round_trip(settings))
    # THEN the read gave up on the connect timeout (0.5 s; three tries), not botocore's
    # 60 s default
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hunter2-plain-text", r"is not JSON; store one of"),
        (json.dumps(["hunter2-in-a-list"]), r"holds a JSON list, not an object"),
        (json.dumps({"username": "hunter2-user"}), r"has the keys username; store one of"),
        (json.dumps({"user": "u", "password": ""}), r"empty or non-text values for password"),
        (json.dumps({"token": 99887766}), r"empty or non-text values for token"),
    ],
)
def test_an_unusable_nats_secret_is_named_by_its_arn_and_never_shown(
    tmp_path: Path, secrets: Any, value: str, expected: str
) -> None:
    arn = _secret(secrets, value)
    settings = _settings(tmp_path, "nats://127.0.0.1:1", nats_credentials_secret_arn=arn)
    with pytest.raises(ConfigurationError, match=expected) as refused:
        asyncio.run(_round_trip(settings))
    assert arn in str(refused.value)
    assert "hunter2" not in str(refused.value)
    assert "99887766" not in str(refused.value)


def test_a_secret_that_cannot_be_read_names_its_arn_and_what_it_is_for(
    tmp_path: Path, secrets: Any
) -> None:
    # a secret that does not exist (a wrong ARN, or one the role may not read)
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rhumbatron/missing-AbCdEf"
    settings = _settings(tmp_path, "nats://127.0.0.1:1", nats_credentials_secret_arn=arn)
    with pytest.raises(ConfigurationError, match="secretsmanager:GetSecretValue") as refused:
        asyncio.run(_round_trip(settings))
    assert arn in str(refused.value)
    assert "RHUMBATRON_NATS_CREDENTIALS_SECRET_ARN" in str(refused.value)
    assert str(refused.value).endswith(
        "; check the ARN and that the function's role may call secretsmanager:GetSecretValue on it"
    )
    # a binary secret
    binary = _secret(secrets, b"\x00\x01")
    with pytest.raises(ConfigurationError) as no_text:
        read_secret_string(binary, what="a test secret", timeout_s=1.0)
    assert str(no_text.value) == (
        f"the Secrets Manager secret {binary} (a test secret) holds no text; store it as a "
        "SecretString, not binary"
    )


def test_a_secret_named_without_an_arn_is_read_in_the_default_region(secrets: Any) -> None:
    # GIVEN a secret in the default region (AWS_REGION in Lambda), known by its name
    name = f"rhumbatron/{uuid.uuid4().hex}"
    secrets.create_secret(Name=name, SecretString="by-name")
    # WHEN it is read by that name, THEN the name (no region in it) is read where the
    #   default chain points
    assert read_secret_string(name, what="a test secret", timeout_s=1.0) == "by-name"


def test_a_secret_is_kept_for_its_max_age_then_read_again(secrets: Any) -> None:
    # GIVEN a secret read through a cache that keeps it 300 s on a clock the test moves
    clock = ManualClock()
    cache = SecretCache(clock, max_age_s=300)
    arn = _secret(secrets, "first-value")
    assert cache.read(arn, what="a test secret", timeout_s=1.0) == "first-value"
    # WHEN it is rotated in Secrets Manager
    secrets.put_secret_value(SecretId=arn, SecretString="second-value")
    # THEN the value read stays in use until it is 300 s old
    clock.advance(299.9)
    assert cache.read(arn, what="a test secret", timeout_s=1.0) == "first-value"
    # AND the first use after that reads the rotated one, in the same process
    clock.advance(0.1)
    assert cache.read(arn, what="a test secret", timeout_s=1.0) == "second-value"


def test_a_secret_cache_refuses_a_max_age_that_is_not_positive_naming_it() -> None:
    for max_age_s in (0, -5):
        with pytest.raises(ValueError) as refused:
            SecretCache(ManualClock(), max_age_s=max_age_s)
        assert str(refused.value) == f"a secret's max age must be positive, got {max_age_s} s"
    # a second is a max age
    assert SecretCache(ManualClock(), max_age_s=1).fresh("arn:aws:secretsmanager:x") is None


async def _reconnected(nc: Any, within_s: float = 10.0, times: int = 1) -> None:
    """Wait until the client has reconnected by itself ``times`` times in all (or
    ``within_s`` is up: the flush after it then fails and says so)."""
    until = time.monotonic() + within_s
    while not (nc.is_connected and nc.stats["reconnects"] >= times) and (time.monotonic() < until):
        await asyncio.sleep(0.05)


def _authorization(credentials: dict[str, str]) -> str:
    """nats-server's ``authorization`` block admitting ``credentials``."""
    return ", ".join(f"{name}: {value}" for name, value in credentials.items())


@pytest.mark.parametrize(
    ("kept", "rotations"),
    [
        ({"token": TOKEN}, [{"token": f"{TOKEN}-rotated"}, {"token": f"{TOKEN}-again"}]),
        (
            {"user": USER, "password": PASSWORD},
            [
                {"user": USER, "password": f"{PASSWORD}-rotated"},
                {"user": USER, "password": f"{PASSWORD}-again"},
            ],
        ),
    ],
    ids=["token", "user-and-password"],
)
def test_rotated_credentials_are_presented_at_the_reconnect_after_the_max_age(
    tmp_path: Path, secrets: Any, kept: dict[str, str], rotations: list[dict[str, str]]
) -> None:
    # GIVEN a client connected with the credentials of the secret, kept 60 s
    clock = ManualClock()
    cache = SecretCache(clock, max_age_s=60)
    arn = _secret(secrets, json.dumps(kept))
    server = AuthNatsServer(store_dir=tmp_path / "nats", authorization=_authorization(kept))
    server.start()
    settings = _settings(tmp_path, server.url, nats_credentials_secret_arn=arn)

    async def rotate_and_reconnect() -> None:
        nc = await connect_nats(settings, secrets=cache)
        try:
            await nc.flush(timeout=2)
            for number, rotated in enumerate(rotations, start=1):
                # WHEN they are rotated (the secret, then the server, restarted on its port)
                # and the kept ones are older than the max age: twice
                secrets.put_secret_value(SecretId=arn, SecretString=json.dumps(rotated))
                clock.advance(61)
                server.stop()
                server.authorization = _authorization(rotated)
                server.start()
                # THEN the client reconnects by itself with the new ones, in the same
                #   process, each time
                await _reconnected(nc, times=number)
                assert nc.is_connected and nc.stats["reconnects"] >= number
                await nc.flush(timeout=2)
        finally:
            await nc.close()

    try:
        asyncio.run(rotate_and_reconnect())
    finally:
        server.stop()


def _reconnect_with_the_kept_token(
    tmp_path: Path, secrets: Any, token_server: AuthNatsServer, spoil: Callable[[str], object]
) -> str:
    """A client connected with the token of a secret kept 60 s; then ``spoil`` does to the
    secret (by its ARN) what the test says, the kept token passes its max age and the server
    restarts, still admitting the token. Asserts the client reconnected with the token it
    had; returns the secret's ARN."""
    clock = ManualClock()
    cache = SecretCache(clock, max_age_s=60)
    arn = _secret(secrets, json.dumps({"token": TOKEN}))
    settings = _settings(tmp_path, token_server.url, nats_credentials_secret_arn=arn)

    async def spoil_and_reconnect() -> None:
        nc = await connect_nats(settings, secrets=cache)
        try:
            await nc.flush(timeout=2)
            spoil(arn)
            clock.advance(61)
            token_server.stop()
            token_server.start()
            await _reconnected(nc)
            assert nc.is_connected and nc.stats["reconnects"] >= 1
            await nc.flush(timeout=2)
        finally:
            await nc.close()

    asyncio.run(spoil_and_reconnect())
    return arn


def test_a_credentials_secret_that_cannot_be_read_again_keeps_the_last_ones(
    tmp_path: Path, secrets: Any, token_server: AuthNatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a client connected with the token of the secret, kept 60 s
    # WHEN the secret can no longer be read, the kept token is past its max age, and the
    #   server restarts (still admitting the token)
    # THEN the client reconnects with the token it had, and says why
    arn = _reconnect_with_the_kept_token(
        tmp_path,
        secrets,
        token_server,
        lambda arn: secrets.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True),
    )
    assert (
        "cannot read the NATS credentials (RHUMBATRON_NATS_CREDENTIALS_SECRET_ARN) from the "
        f"Secrets Manager secret {arn}"
    ) in caplog.text
    assert TOKEN not in caplog.text


def test_a_credentials_secret_rotated_to_something_unusable_keeps_the_last_ones(
    tmp_path: Path, secrets: Any, token_server: AuthNatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a client connected with the token of the secret, kept 60 s
    # WHEN the secret is rotated to text that is not JSON, the kept token is past its max
    #   age, and the server restarts (still admitting the token)
    # THEN the client reconnects with the token it had
    with caplog.at_level(logging.WARNING, logger="rhumbatron.messaging.connection"):
        arn = _reconnect_with_the_kept_token(
            tmp_path,
            secrets,
            token_server,
            lambda arn: secrets.put_secret_value(SecretId=arn, SecretString="not json"),
        )
    # AND says why, naming the secret (never a value)
    (said,) = [r.getMessage() for r in caplog.records if "reconnecting with" in r.getMessage()]
    assert said.startswith(f"the NATS credentials secret {arn} is not JSON")
    assert said.endswith("; reconnecting with the credentials read before")
    assert TOKEN not in caplog.text


class _ScriptedSecretsManager:
    """A Secrets Manager endpoint on loopback that answers every ``GetSecretValue`` with
    ``value``, or, while :meth:`go_silent` holds, takes each request and never answers."""

    def __init__(self, value: str) -> None:
        self.value = value
        self._answering = threading.Event()
        self._answering.set()
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if not endpoint._answering.is_set():
                    endpoint._answering.wait()
                    return  # closes the connection unanswered
                body = json.dumps(
                    {"ARN": request["SecretId"], "Name": "nats", "SecretString": endpoint.value}
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/x-amz-json-1.1")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def go_silent(self) -> None:
        self._answering.clear()

    def answer(self, value: str) -> None:
        """Answer ``value`` from now on; a request left unanswered ends, unanswered."""
        self.value = value
        self._answering.set()

    def close(self) -> None:
        self._answering.set()
        self._server.shutdown()
        self._server.server_close()


async def _logged(caplog: pytest.LogCaptureFixture, text: str, within_s: float = 10.0) -> None:
    """Wait until ``text`` was logged (or ``within_s`` is up: the assertion after it fails)."""
    until = time.monotonic() + within_s
    while text not in caplog.text and time.monotonic() < until:
        await asyncio.sleep(0.05)


def test_a_credentials_re_read_from_a_silent_secrets_manager_gives_up_and_the_next_reads_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    token_server: AuthNatsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a client connected with the token of a secret kept 60 s, its connect timeout 0.5 s
    endpoint = _ScriptedSecretsManager(json.dumps({"token": TOKEN}))
    _secrets_manager_at(monkeypatch, endpoint.port)
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rhumbatron/nats-AbCdEf"
    clock = ManualClock()
    cache = SecretCache(clock, max_age_s=60)
    settings = _settings(tmp_path, token_server.url, nats_credentials_secret_arn=arn)
    rotated = f"{TOKEN}-rotated"
    gave_up = "; using the value read at "

    async def reconnect_twice() -> None:
        nc = await connect_nats(settings, secrets=cache)
        try:
            await nc.flush(timeout=2)
            # WHEN Secrets Manager stops answering, the kept token passes its max age, and
            #   the server restarts (still admitting the token)
            endpoint.go_silent()
            clock.advance(61)
            token_server.stop()
            token_server.start()
            # THEN the client reconnects with the token it kept
            await _reconnected(nc)
            assert nc.is_connected and nc.stats["reconnects"] >= 1
            # AND the re-read that reconnect started gives up on the connect timeout, saying so
            await _logged(caplog, gave_up)
            assert gave_up in caplog.text, "the re-read is still waiting on a silent endpoint"
            # AND once the secret answers again, rotated, and the server admits only the
            #   rotated token, the client reads it and reconnects with it
            endpoint.answer(json.dumps({"token": rotated}))
            token_server.stop()
            token_server.authorization = f"token: {rotated}"
            token_server.start()
            await _reconnected(nc, times=2)
            assert nc.is_connected and nc.stats["reconnects"] >= 2
            await nc.flush(timeout=2)
        finally:
            endpoint.answer(json.dumps({"token": rotated}))  # a read still waiting ends
            await nc.close()

    try:
        with caplog.at_level(logging.WARNING, logger="rhumbatron.messaging.secrets"):
            asyncio.run(reconnect_twice())
    finally:
        endpoint.close()
    assert TOKEN not in caplog.text


@pytest.mark.skipif(importlib.util.find_spec("nkeys") is not None, reason="nkeys is installed here")
@pytest.mark.parametrize("shape", ["nkey_seed", "creds"])
def test_an_nkey_secret_without_the_nkeys_package_says_what_to_install(
    tmp_path: Path, secrets: Any, shape: str
) -> None:
    arn = _secret(secrets, json.dumps({shape: "SUAM-not-a-real-seed"}))
    settings = _settings(tmp_path, "nats://127.0.0.1:1", nats_credentials_secret_arn=arn)
    with pytest.raises(ConfigurationError, match="needs the nkeys package") as refused:
        asyncio.run(_round_trip(settings))
    assert "SUAM" not in str(refused.value)


@pytest.mark.skipif(importlib.util.find_spec("nkeys") is None, reason="needs nkeys")
def test_an_nkey_seed_from_the_secret_signs_the_servers_nonce(tmp_path: Path, secrets: Any) -> None:
    import nkeys  # type: ignore[import-not-found,unused-ignore]

    # GIVEN a cluster whose only user is an nkey (as infra/nats configures the functions)
    seed = nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(seed).public_key.decode()
    servers = _server(tmp_path, f"users: [{{ nkey: {public} }}]")
    server = next(servers)
    try:
        arn = _secret(secrets, json.dumps({"nkey_seed": seed.decode()}))
        # WHEN a client connects with the secret THEN it gets a round trip through
        asyncio.run(_round_trip(_settings(tmp_path, server.url, nats_credentials_secret_arn=arn)))
    finally:
        next(servers, None)


# -- Anthropic -------------------------------------------------------------------------------


def _overlap_event() -> Event:
    """An intent.declared whose resource overlaps the agent's by prefix only."""
    return Event.parse(
        {
            "eventId": f"evt_{uuid.uuid4().hex}",
            "eventType": "intent.declared",
            "eventVersion": 1,
            "tenantId": "acme",
            "projectId": "acme-web",
            "changeId": "chg-1",
            "taskId": "tsk-2",
            "actor": "agent:other",
            "resource": "src/auth/",
            "correlationId": "corr-1",
            "timestamp": "2026-01-01T00:00:00Z",
            "payload": {"intentId": "i-1", "agentId": "other", "paths": ["src/auth/"]},
        }
    )


def _messages_api(seen: list[httpx2.Request]) -> httpx2.MockTransport:
    """Answers POST /v1/messages with the forced decide_wake tool call; keeps each request."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        body = {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": json.loads(request.content)["model"],
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "decide_wake",
                    "input": {"decision": "skip", "probability": 0.9, "reason": "unrelated"},
                }
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
        return httpx2.Response(200, json=body)

    return httpx2.MockTransport(answer)


def test_clef_flash_asks_the_model_with_the_key_from_the_secret(
    tmp_path: Path, secrets: Any
) -> None:
    # GIVEN the Anthropic key in a secret (a newline after it, as pasted in the console)
    arn = _secret(secrets, "sk-ant-test-key-0123\n")
    settings = _settings(tmp_path, "nats://127.0.0.1:1", clef_flash_api_key_secret_arn=arn)
    app = bootstrap(settings)
    seen: list[httpx2.Request] = []

    async def ask() -> str:
        lifecycle = app.lifecycle()
        lifecycle.clef_flash_http = httpx2.AsyncClient(transport=_messages_api(seen))
        try:
            decision = await lifecycle.clef_flash.decide(
                _overlap_event(), "builder-1", ("src/auth/login.py",)
            )
            return str(decision.verdict)
        finally:
            await app.close()

    # WHEN Clef-flash is asked about a prefix-only overlap
    verdict = asyncio.run(ask())
    # THEN the model was asked, with the secret's key
    assert verdict == "skip"
    assert len(seen) == 1
    assert _api_key_of(seen[0]) == "sk-ant-test-key-0123"


def _api_key_of(request: httpx2.Request) -> str:
    """The key a request to the Messages API carried (the SDK sends ``x-api-key``)."""
    return str(request.headers.get("x-api-key") or request.headers["authorization"]).removeprefix(
        "Bearer "
    )


def test_clef_flash_asks_with_the_rotated_key_once_the_kept_one_is_past_its_max_age(
    tmp_path: Path, secrets: Any
) -> None:
    # GIVEN the Anthropic key in a secret, kept 60 s by a runtime on a clock the test moves
    arn = _secret(secrets, "sk-ant-first-key")
    settings = _settings(
        tmp_path, "nats://127.0.0.1:1", clef_flash_api_key_secret_arn=arn, secret_max_age_s=60
    )
    clock = ManualClock()
    app = bootstrap(settings, clock=clock)
    seen: list[httpx2.Request] = []

    async def ask_three_times() -> None:
        lifecycle = app.lifecycle()
        lifecycle.clef_flash_http = httpx2.AsyncClient(transport=_messages_api(seen))
        try:
            await lifecycle.clef_flash.decide(_overlap_event(), "builder-1", ("src/auth/a.py",))
            # WHEN the key is rotated
            secrets.put_secret_value(SecretId=arn, SecretString="sk-ant-second-key")
            clock.advance(59)
            await lifecycle.clef_flash.decide(_overlap_event(), "builder-1", ("src/auth/a.py",))
            clock.advance(1)
            await lifecycle.clef_flash.decide(_overlap_event(), "builder-1", ("src/auth/a.py",))
        finally:
            await app.close()

    asyncio.run(ask_three_times())
    # THEN the kept key is used within its max age, and the rotated one after it
    keys = [_api_key_of(r) for r in seen]
    assert keys == ["sk-ant-first-key", "sk-ant-first-key", "sk-ant-second-key"]


def test_clef_flash_keeps_its_key_when_a_re_read_fails_and_abstains_when_it_never_had_one(
    tmp_path: Path, secrets: Any
) -> None:
    # GIVEN the Anthropic key in a secret, kept 60 s, and a second runtime whose secret is gone
    arn = _secret(secrets, "sk-ant-first-key")
    settings = _settings(
        tmp_path, "nats://127.0.0.1:1", clef_flash_api_key_secret_arn=arn, secret_max_age_s=60
    )
    clock = ManualClock()
    app = bootstrap(settings, clock=clock)
    seen: list[httpx2.Request] = []

    async def ask(runtime: Any) -> str:
        lifecycle = runtime.lifecycle()
        if lifecycle.clef_flash_http is None:
            lifecycle.clef_flash_http = httpx2.AsyncClient(transport=_messages_api(seen))
        decision = await lifecycle.clef_flash.decide(
            _overlap_event(), "builder-1", ("src/auth/a.py",)
        )
        return str(decision.verdict)

    async def scenario() -> tuple[str, str, str]:
        try:
            first = await ask(app)
            # WHEN the secret can no longer be read and the kept key is past its max age
            secrets.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
            clock.advance(61)
            kept = await ask(app)
        finally:
            await app.close()
        # AND a fresh runtime (a cold start) asks with the secret gone
        cold = bootstrap(settings, clock=clock)
        try:
            never = await ask(cold)
        finally:
            await cold.close()
        return first, kept, never

    first, kept, never = asyncio.run(scenario())
    # THEN the warm runtime decides with the key it had, raising nothing (five failures would
    #   dead-letter the event); the cold one abstains without asking, as with no key
    assert (first, kept, never) == ("skip", "skip", "abstain")
    keys = [_api_key_of(r) for r in seen]
    assert keys == ["sk-ant-first-key", "sk-ant-first-key"]


def test_without_a_key_or_a_secret_clef_flash_abstains_without_asking(tmp_path: Path) -> None:
    app = bootstrap(_settings(tmp_path, "nats://127.0.0.1:1"))
    seen: list[httpx2.Request] = []

    async def ask() -> str:
        lifecycle = app.lifecycle()
        lifecycle.clef_flash_http = httpx2.AsyncClient(transport=_messages_api(seen))
        try:
            decision = await lifecycle.clef_flash.decide(
                _overlap_event(), "builder-1", ("src/auth/login.py",)
            )
            return str(decision.verdict)
        finally:
            await app.close()

    assert asyncio.run(ask()) == "abstain"
    assert seen == []


_MISSING = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rhumbatron/missing-AbCdEf"


@pytest.mark.parametrize("cached", [False, True])
def test_a_secret_read_that_fails_names_the_arn_and_what_it_is_for(
    secrets: Any, cached: bool
) -> None:
    cache = SecretCache(ManualClock(), max_age_s=300) if cached else None
    with pytest.raises(ConfigurationError) as refused:
        read_secret_string(_MISSING, what="the webhook key", timeout_s=1.0, cache=cache)
    assert str(refused.value).startswith(
        f"cannot read the webhook key from the Secrets Manager secret {_MISSING}: "
    )


def test_a_failed_re_read_answers_the_last_value_and_says_when_it_was_read(
    secrets: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a secret read once through the cache, then deleted, and the value past its max age
    clock = ManualClock()
    cache = SecretCache(clock, max_age_s=300)
    arn = _secret(secrets, "the-value")
    read_at = clock.now()
    assert asyncio.run(cache.read_or_last_async(arn, what="a key", timeout_s=1.0)) == "the-value"
    secrets.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    # WHEN it is used within its max age, THEN the kept value answers without a read
    clock.advance(299)
    assert asyncio.run(cache.read_or_last_async(arn, what="a key", timeout_s=1.0)) == "the-value"
    assert not caplog.records
    # WHEN it is used after, THEN the read fails, the last value answers, and a warning says
    #   which secret failed, what for, and when the value in use was read
    clock.advance(1)
    caplog.set_level(logging.WARNING, logger="rhumbatron.messaging.secrets")
    assert asyncio.run(cache.read_or_last_async(arn, what="a key", timeout_s=1.0)) == "the-value"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"cannot read a key from the Secrets Manager secret {arn}: ")
    assert warning.endswith(f"; using the value read at {read_at}")
    # AND a secret never read answers None, saying so
    caplog.clear()
    assert asyncio.run(cache.read_or_last_async(_MISSING, what="a key", timeout_s=1.0)) is None
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.endswith("; using the value read at None")


@pytest.mark.parametrize("entry", ["read_secret_string", "cache.read", "read_or_last_async"])
def test_a_secret_read_from_an_endpoint_that_never_answers_gives_up_on_its_timeout(
    silent_secrets_manager: None, entry: str
) -> None:
    # GIVEN a Secrets Manager endpoint that accepts connections and never answers
    cache = SecretCache(ManualClock(), max_age_s=300)
    started = time.monotonic()
    # WHEN a secret is read with a 0.5 s timeout through each way in
    if entry == "read_or_last_async":
        assert asyncio.run(cache.read_or_last_async(_MISSING, what="a key", timeout_s=0.5)) is None
    else:
        with pytest.raises(ConfigurationError, match="cannot read a key"):
            read_secret_string(
                _MISSING,
                what="a key",
                timeout_s=0.5,
                cache=cache if entry == "cache.read" else None,
            )
    # THEN it gave up on that timeout (three tries), not botocore's 60 s default
    assert time.monotonic() - started < 10


def test_a_secret_read_that_fails_on_the_server_is_tried_three_times_in_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a Secrets Manager endpoint that answers every request with a 500
    requests: list[str] = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            requests.append(self.path)
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(500)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    _secrets_manager_at(monkeypatch, server.server_address[1])
    try:
        # WHEN a secret is read, THEN it fails naming the secret after the two retries its
        #   client is given: three requests in all, not botocore's default of five
        with pytest.raises(ConfigurationError, match="cannot read a key"):
            read_secret_string(_MISSING, what="a key", timeout_s=0.5)
        assert len(requests) == 3
    finally:
        server.shutdown()
        server.server_close()


def test_a_secret_read_from_an_endpoint_that_never_accepts_gives_up_on_its_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a Secrets Manager endpoint whose accept queue is full: a connect waits unanswered
    with socket.create_server(("127.0.0.1", 0), backlog=0) as full:
        address = full.getsockname()
        waiting = []
        for _ in range(4):  # fill the queue without waiting on it
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(address)
            waiting.append(client)
        _secrets_manager_at(monkeypatch, address[1])
        started = time.monotonic()
        try:
            # WHEN a secret is read with a 0.5 s timeout
            with pytest.raises(ConfigurationError, match="cannot read a key"):
                read_secret_string(_MISSING, what="a key", timeout_s=0.5)
        finally:
            for client in waiting:
                client.close()
    # THEN it gave up on that timeout (three tries), not botocore's 60 s connect default
    assert time.monotonic() - started < 10
