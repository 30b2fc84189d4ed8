"""JWT bearer tokens (B4): signature, exp on the runtime's clock, iss, aud, tenant, scopes.

The API checks tokens itself, behind API Gateway's authorizer too; these tests send real
signed tokens (HS256 and RS256) through FastAPI's TestClient to a real runtime.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from rhumbatron.api import JwtAuth, StaticTokenAuth, authenticator_from_settings, create_api
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.errors import ConfigurationError
from rhumbatron.runtime.bootstrap import Rhumbatron

from .conftest import TestClient
from .support import OTHER_TENANT, TENANT, bearer, command, command_letter

pytestmark = pytest.mark.integration

SECRET = "a-shared-secret-of-32-characters!"
ISSUER = "https://login.example.test/"
AUDIENCE = "rhumbatron-api"


def _claims(clock: ManualClock, **changes: Any) -> dict[str, Any]:
    now = int(clock.now().timestamp())
    claims = {
        "sub": "user:ann",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 300,
        "tenant": TENANT,
        "scope": "dead-letters:read dead-letters:write",
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _hs256(claims: dict[str, Any], secret: str = SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


@pytest.fixture
def jwt_client(runtime: Rhumbatron, clock: ManualClock) -> Iterator[TestClient]:
    auth = JwtAuth(clock=clock, issuer=ISSUER, audience=AUDIENCE, secret=SECRET, leeway_s=30)
    with TestClient(create_api(runtime, auth)) as client:
        yield client


def test_a_valid_jwt_reads_its_tenants_letters(
    jwt_client: TestClient, runtime: Rhumbatron, clock: ManualClock
) -> None:
    mine = command_letter(runtime, command(), tenant=TENANT)
    command_letter(runtime, command(), tenant=OTHER_TENANT)
    response = jwt_client.get("/dead-letters", headers=bearer(_hs256(_claims(clock))))
    assert response.status_code == 200, response.text
    assert [item["id"] for item in response.json()["items"]] == [mine]


def test_an_expired_jwt_is_401_token_expired_by_the_runtimes_clock(
    jwt_client: TestClient, clock: ManualClock
) -> None:
    # GIVEN a token valid for 5 minutes
    token = _hs256(_claims(clock))
    assert jwt_client.get("/dead-letters", headers=bearer(token)).status_code == 200
    # WHEN the clock passes its exp by more than the leeway
    clock.advance(timedelta(minutes=5, seconds=31).total_seconds())
    response = jwt_client.get("/dead-letters", headers=bearer(token))
    # THEN 401 token_expired, with the Bearer challenge
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "token_expired"
    assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'


@pytest.mark.parametrize(
    ("changes", "secret", "words"),
    [
        ({"iss": "https://evil.example.test/"}, SECRET, "issuer"),
        ({"aud": "another-api"}, SECRET, "audience"),
        ({"exp": None}, SECRET, "exp"),
        ({"exp": "tomorrow"}, SECRET, "exp"),
        ({"tenant": None}, SECRET, "tenant"),
        ({}, "another-secret-of-32-characters!!", "signature"),
    ],
    ids=["wrong-issuer", "wrong-audience", "no-exp", "exp-not-a-time", "no-tenant", "bad-sig"],
)
def test_a_jwt_that_does_not_verify_is_401(
    jwt_client: TestClient,
    clock: ManualClock,
    changes: dict[str, Any],
    secret: str,
    words: str,
) -> None:
    token = _hs256(_claims(clock, **changes), secret)
    response = jwt_client.get("/dead-letters", headers=bearer(token))
    assert response.status_code == 401, response.text
    assert words in response.json()["error"]["message"].lower()


def test_a_jwt_signed_with_none_is_401(jwt_client: TestClient, clock: ManualClock) -> None:
    token = jwt.encode(_claims(clock), None, algorithm="none")
    assert jwt_client.get("/dead-letters", headers=bearer(token)).status_code == 401


def test_scopes_come_from_scp_too_and_a_missing_one_is_403(
    jwt_client: TestClient, runtime: Rhumbatron, clock: ManualClock
) -> None:
    letter_id = command_letter(runtime, command())
    reader = _hs256(_claims(clock, scope=None, scp=["dead-letters:read"]))
    assert jwt_client.get(f"/dead-letters/{letter_id}", headers=bearer(reader)).status_code == 200
    response = jwt_client.post(f"/dead-letters/{letter_id}/dismiss", headers=bearer(reader))
    assert response.status_code == 403
    assert "'dead-letters:write'" in response.json()["error"]["message"]


def test_an_rs256_jwt_verifies_with_the_public_key_and_not_with_another(
    runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN an API that trusts one RSA public key
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    settings = load_settings(
        state_dir=runtime.settings.state_dir,
        nats_url=runtime.settings.nats_url,
        api_auth_mode="jwt",
        api_jwt_public_key=public_pem,
        api_jwt_issuer=ISSUER,
        api_jwt_audience=AUDIENCE,
    )
    auth = authenticator_from_settings(settings, clock)
    with TestClient(create_api(runtime, auth)) as client:
        # WHEN tokens signed by that key, by another key, and HS256 with the PEM come in
        good = jwt.encode(_claims(clock), key, algorithm="RS256")
        forged = jwt.encode(_claims(clock), stranger, algorithm="RS256")
        # THEN only the first is accepted
        assert client.get("/dead-letters", headers=bearer(good)).status_code == 200
        assert client.get("/dead-letters", headers=bearer(forged)).status_code == 401


def test_static_tokens_map_to_their_tenant_and_scopes() -> None:
    auth = StaticTokenAuth(
        load_settings(
            api_tokens={"x" * 20: {"tenant": "t1", "scopes": ["commands:send"]}}
        ).api_tokens
    )
    principal = auth.authenticate("x" * 20)
    assert (principal.tenant_id, principal.scopes) == ("t1", frozenset({"commands:send"}))
    assert principal.subject.startswith("token:")
    assert "x" * 20 not in principal.subject


def test_jwt_mode_without_a_key_issuer_or_audience_does_not_start() -> None:
    with pytest.raises(ConfigurationError, match="exactly one of"):
        load_settings(api_auth_mode="jwt", api_jwt_issuer=ISSUER, api_jwt_audience=AUDIENCE)
    with pytest.raises(ConfigurationError, match="RHUMBATRON_API_JWT_AUDIENCE"):
        load_settings(api_auth_mode="jwt", api_jwt_secret=SECRET, api_jwt_issuer=ISSUER)


def test_a_bad_static_token_grant_is_refused_without_echoing_the_token() -> None:
    token = "short-secret"
    with pytest.raises(ConfigurationError) as refused:
        load_settings(api_tokens={token: {"tenant": "t1", "scopes": ["everything"]}})
    assert token not in str(refused.value)
    assert "shorter than 16" in str(refused.value)
    assert "scopes" in str(refused.value)


def test_a_jwt_cannot_claim_every_tenant(
    jwt_client: TestClient, runtime: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a letter of another tenant, and a well-signed token whose tenant claim is "*"
    command_letter(runtime, command(), tenant=OTHER_TENANT)
    token = _hs256(_claims(clock, tenant="*"))
    # WHEN it lists dead letters, THEN it is refused: "every tenant" is no claim to mint
    response = jwt_client.get("/dead-letters", headers=bearer(token))
    assert response.status_code == 401
