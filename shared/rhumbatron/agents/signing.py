"""Standard Webhooks signatures (https://www.standardwebhooks.com) for agent wakes.

A signed request carries three headers:

* ``webhook-id`` — the message ID, stable across retries so a receiver can dedupe;
* ``webhook-timestamp`` — Unix seconds when it was signed;
* ``webhook-signature`` — space-separated ``v1,<base64 HMAC-SHA256>`` entries over the bytes
  ``{id}.{timestamp}.{body}``.

A secret is ``whsec_`` + base64 of the key bytes. During a rotation an agent has two
secrets: the sender signs with both (one entry each), so a receiver that holds either one
verifies, and :func:`verify` accepts any listed signature that matches any current secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as _random
from collections.abc import Mapping, Sequence
from datetime import datetime

from rhumbatron.errors import WebhookSecretError, WebhookSignatureError

__all__ = [
    "ID_HEADER",
    "SECRET_PREFIX",
    "SIGNATURE_HEADER",
    "SIGNATURE_VERSION",
    "TIMESTAMP_HEADER",
    "generate_secret",
    "parse_secret",
    "sign",
    "signed_headers",
    "verify",
]

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
#: 32 key bytes: the HMAC-SHA256 block of security; Standard Webhooks allows 24 to 64.
_SECRET_BYTES = 32


def generate_secret() -> str:
    """A new random secret: ``whsec_`` + base64 of 32 random key bytes."""
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(_SECRET_BYTES)).decode("ascii")


def parse_secret(secret: str) -> bytes:
    """The key bytes of ``secret``; raises :class:`WebhookSecretError` if it is malformed."""
    if not secret.startswith(SECRET_PREFIX):
        raise WebhookSecretError(
            f"a webhook secret must start with {SECRET_PREFIX!r} followed by base64 key bytes; "
            f"got one of {len(secret)} characters without that prefix (use generate_secret())"
        )
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise WebhookSecretError(
            f"the webhook secret after {SECRET_PREFIX!r} is not valid base64 "
            f"({len(encoded)} characters); use generate_secret()"
        ) from None
    if not key:
        raise WebhookSecretError(f"the webhook secret {SECRET_PREFIX!r} has no key bytes")
    return key


def _signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{msg_id}.{timestamp}.{body}">`` under ``secret``."""
    return f"{SIGNATURE_VERSION},{_signature(parse_secret(secret), msg_id, timestamp, body)}"


def signed_headers(
    secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three Standard Webhooks headers, with one signature per secret (newest first)."""
    if not secrets:
        raise WebhookSecretError(
            f"cannot sign webhook {msg_id!r} without a secret: register the agent with one"
        )
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: " ".join(sign(secret, msg_id, timestamp, body) for secret in secrets),
    }


def verify(
    secrets: Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: datetime,
    tolerance_s: int,
) -> None:
    """Check a received webhook; return quietly or raise :class:`WebhookSignatureError`.

    Header names are case-insensitive. The timestamp may be at most ``tolerance_s`` seconds
    before or after ``now`` (a replay window, and room for clock skew). Any ``v1`` signature
    matching any of ``secrets`` passes; other versions are ignored, as the standard says.
    """
    if not secrets:
        raise WebhookSecretError("cannot verify a webhook without a secret")
    keys = [parse_secret(secret) for secret in secrets]
    lowered = {name.lower(): value for name, value in headers.items()}
    missing = [
        name for name in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER) if not lowered.get(name)
    ]
    if missing:
        raise WebhookSignatureError(f"the webhook request has no {', '.join(missing)} header")
    msg_id = lowered[ID_HEADER]
    raw_timestamp = lowered[TIMESTAMP_HEADER].strip()
    if not (raw_timestamp.isascii() and raw_timestamp.isdigit()):
        raise WebhookSignatureError(
            f"{TIMESTAMP_HEADER}={raw_timestamp[:40]!r} of webhook {msg_id!r} is not Unix seconds"
        )
    timestamp = int(raw_timestamp)
    now_s = int(now.timestamp())
    if now_s - timestamp > tolerance_s:
        raise WebhookSignatureError(
            f"webhook {msg_id!r} is too old: {TIMESTAMP_HEADER}={timestamp} is "
            f"{now_s - timestamp} s before now ({now_s}); the tolerance is {tolerance_s} s"
        )
    if timestamp - now_s > tolerance_s:
        raise WebhookSignatureError(
            f"webhook {msg_id!r} is too new: {TIMESTAMP_HEADER}={timestamp} is "
            f"{timestamp - now_s} s after now ({now_s}); the tolerance is {tolerance_s} s "
            "(is a clock wrong?)"
        )
    offered = [
        value.encode("ascii", "replace")
        for version, _, value in (
            entry.partition(",") for entry in lowered[SIGNATURE_HEADER].split()
        )
        if version == SIGNATURE_VERSION
    ]
    expected = [_signature(key, msg_id, timestamp, body).encode("ascii") for key in keys]
    # compare_digest over every pair: the time taken says nothing about how close a guess was.
    if any(hmac.compare_digest(want, got) for want in expected for got in offered):
        return
    raise WebhookSignatureError(
        f"no signature of webhook {msg_id!r} matched: {len(offered)} {SIGNATURE_VERSION} "
        f"signature(s) offered, {len(keys)} current secret(s) tried; the body or a header was "
        "changed, or the receiver holds a secret the sender does not"
    )
