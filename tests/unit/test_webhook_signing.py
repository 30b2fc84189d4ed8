"""Standard Webhooks signing: sign() against vectors computed by hand, verify() refusing a
tampered body, a stale or future timestamp, missing headers and malformed secrets."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest

from rhumbatron.agents.signing import generate_secret, sign, signed_headers, verify
from rhumbatron.errors import (
    ConfigurationError,
    RhumbatronError,
    WebhookSecretError,
    WebhookSignatureError,
)

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
STAMP = int(NOW.timestamp())
BODY = b'{"type":"agent.wake"}'


def by_hand(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def test_sign_matches_an_hmac_computed_by_hand() -> None:
    # GIVEN a key and a message
    # WHEN it is signed
    signature = sign(SECRET, "cmd_t1_ready", STAMP, BODY)
    # THEN the signature is v1 + base64(HMAC-SHA256(key, "id.timestamp.body"))
    assert signature == by_hand(KEY, "cmd_t1_ready", STAMP, BODY)


def test_sign_matches_the_standard_webhooks_reference_vector() -> None:
    # GIVEN the example of the Standard Webhooks reference libraries
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    # WHEN it is signed
    signature = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    # THEN it is the published signature
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_generated_secrets_are_whsec_base64_of_32_random_bytes() -> None:
    first, second = generate_secret(), generate_secret()
    assert first.startswith("whsec_") and second.startswith("whsec_")
    assert len(base64.b64decode(first.removeprefix("whsec_"), validate=True)) == 32
    assert first != second


def test_signed_headers_carry_one_signature_per_secret() -> None:
    # GIVEN two secrets (a rotation)
    other_key = b"k" * 32
    other = "whsec_" + base64.b64encode(other_key).decode()
    # WHEN headers are made
    headers = signed_headers([other, SECRET], "cmd_1", STAMP, BODY)
    # THEN both signatures are listed, newest first, with the ID and timestamp
    assert headers == {
        "webhook-id": "cmd_1",
        "webhook-timestamp": str(STAMP),
        "webhook-signature": (
            f"{by_hand(other_key, 'cmd_1', STAMP, BODY)} {by_hand(KEY, 'cmd_1', STAMP, BODY)}"
        ),
    }


def test_a_fresh_signature_verifies_whatever_the_header_case() -> None:
    # GIVEN signed headers, spelt in title case as some servers pass them on
    headers = {k.title(): v for k, v in signed_headers([SECRET], "cmd_1", STAMP, BODY).items()}
    # WHEN / THEN verification passes
    verify([SECRET], headers, BODY, now=NOW, tolerance_s=300)


def test_any_listed_signature_matching_any_current_secret_verifies() -> None:
    # GIVEN a sender signing with new and old secrets
    new = generate_secret()
    headers = signed_headers([new, SECRET], "cmd_1", STAMP, BODY)
    # WHEN receivers hold only the old, only the new, or both
    # THEN each verifies
    for held in ([SECRET], [new], [SECRET, new]):
        verify(held, headers, BODY, now=NOW, tolerance_s=300)


def test_a_tampered_body_is_refused() -> None:
    headers = signed_headers([SECRET], "cmd_1", STAMP, BODY)
    with pytest.raises(WebhookSignatureError, match="no signature of webhook 'cmd_1' matched"):
        verify([SECRET], headers, BODY + b" ", now=NOW, tolerance_s=300)


def test_a_changed_id_or_timestamp_is_refused() -> None:
    headers = signed_headers([SECRET], "cmd_1", STAMP, BODY)
    for changed in ({"webhook-id": "cmd_2"}, {"webhook-timestamp": str(STAMP - 1)}):
        with pytest.raises(WebhookSignatureError, match="matched"):
            verify([SECRET], headers | changed, BODY, now=NOW, tolerance_s=300)


def test_a_signature_under_another_secret_is_refused() -> None:
    headers = signed_headers([generate_secret()], "cmd_1", STAMP, BODY)
    with pytest.raises(WebhookSignatureError, match="1 v1 signature"):
        verify([SECRET], headers, BODY, now=NOW, tolerance_s=300)


def test_signatures_of_other_versions_are_ignored() -> None:
    # GIVEN only a "v1a" entry carrying what would be a valid v1 signature
    good = sign(SECRET, "cmd_1", STAMP, BODY).removeprefix("v1,")
    headers = signed_headers([SECRET], "cmd_1", STAMP, BODY) | {"webhook-signature": f"v1a,{good}"}
    # THEN it does not count
    with pytest.raises(WebhookSignatureError, match="0 v1 signature"):
        verify([SECRET], headers, BODY, now=NOW, tolerance_s=300)


def test_a_timestamp_older_than_the_tolerance_is_refused_with_the_numbers() -> None:
    # GIVEN a request signed 301 s ago
    old = STAMP - 301
    headers = signed_headers([SECRET], "cmd_1", old, BODY)
    # WHEN it is verified with a 300 s tolerance
    with pytest.raises(WebhookSignatureError) as caught:
        verify([SECRET], headers, BODY, now=NOW, tolerance_s=300)
    # THEN the message says too old, by how much, and the tolerance
    message = str(caught.value)
    assert "too old" in message and "301 s" in message and "300 s" in message
    assert str(old) in message


def test_a_timestamp_newer_than_the_tolerance_is_refused() -> None:
    headers = signed_headers([SECRET], "cmd_1", STAMP + 301, BODY)
    with pytest.raises(WebhookSignatureError, match=r"too new.*301 s after"):
        verify([SECRET], headers, BODY, now=NOW, tolerance_s=300)


def test_a_timestamp_exactly_at_the_tolerance_verifies_in_both_directions() -> None:
    for stamp in (STAMP - 300, STAMP + 300):
        headers = signed_headers([SECRET], "cmd_1", stamp, BODY)
        verify([SECRET], headers, BODY, now=NOW, tolerance_s=300)
    # and a second later it does not
    late = signed_headers([SECRET], "cmd_1", STAMP - 300, BODY)
    with pytest.raises(WebhookSignatureError, match="too old"):
        verify([SECRET], late, BODY, now=NOW + timedelta(seconds=1), tolerance_s=300)


@pytest.mark.parametrize("header", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_header_is_named(header: str) -> None:
    headers = signed_headers([SECRET], "cmd_1", STAMP, BODY)
    del headers[header]
    with pytest.raises(WebhookSignatureError, match=f"has no {header} header"):
        verify([SECRET], headers, BODY, now=NOW, tolerance_s=300)


@pytest.mark.parametrize("stamp", ["soon", "1.5", "-3", "١٢٣"])
def test_a_timestamp_that_is_not_unix_seconds_is_refused(stamp: str) -> None:
    headers = signed_headers([SECRET], "cmd_1", STAMP, BODY) | {"webhook-timestamp": stamp}
    with pytest.raises(WebhookSignatureError, match="is not Unix seconds"):
        verify([SECRET], headers, BODY, now=NOW, tolerance_s=300)


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        (base64.b64encode(KEY).decode(), "must start with 'whsec_'"),
        ("whsec_not*base64!", "not valid base64"),
        ("whsec_", "no key bytes"),
    ],
)
def test_a_malformed_secret_is_refused_without_showing_it(secret: str, problem: str) -> None:
    # WHEN a malformed secret signs or verifies
    for use in (
        lambda: sign(secret, "cmd_1", STAMP, BODY),
        lambda: verify([secret], {}, BODY, now=NOW, tolerance_s=300),
    ):
        with pytest.raises(WebhookSecretError, match=problem) as caught:
            use()
        # THEN the error is a configuration error and does not leak the secret
        assert isinstance(caught.value, ConfigurationError)
        assert secret.removeprefix("whsec_") not in str(caught.value) or secret == "whsec_"


def test_signature_errors_are_rhumbatron_errors() -> None:
    assert issubclass(WebhookSignatureError, RhumbatronError)


def test_signing_without_any_secret_is_refused() -> None:
    with pytest.raises(WebhookSecretError, match="without a secret"):
        signed_headers([], "cmd_1", STAMP, BODY)
