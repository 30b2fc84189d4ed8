"""Secrets Manager secrets, each kept a while, then read again: rotation without a cold start.

In the cloud a role reads its secrets (the NATS credentials, the NATS servers' CA, the Anthropic
key) from Secrets Manager. :class:`SecretCache` keeps each secret's text for
``secret_max_age_s`` (``RHUMBATRON_SECRET_MAX_AGE_S``, 300 s by default) on the runtime's
clock, then reads it again at its next use: a rotated secret reaches a warm container within
that age, and a busy one still pays one ``GetSecretValue`` per secret per age, not per use.

Why not Powertools' ``parameters.get_secret(max_age=...)``: its cache measures the age with
``datetime.now()``, which a test cannot move, and its errors carry botocore's text but not what
the secret was for. The cache here ages on the injected :class:`~rhumbatron.core.clock.Clock`
(tests move it; habit 9), and every error names the ARN and the purpose — never the value.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from rhumbatron.errors import ConfigurationError

if TYPE_CHECKING:
    from rhumbatron.core.clock import Clock

__all__ = ["SecretCache", "read_secret_string"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Kept:
    value: str
    read_at: datetime


class SecretCache:
    """Secret texts by ARN, each kept ``max_age_s`` seconds on ``clock``, then read again.

    One per runtime (one warm Lambda container). A value read is trusted until it is
    ``max_age_s`` old; the first use after that reads Secrets Manager again.
    """

    def __init__(self, clock: Clock, max_age_s: float) -> None:
        if max_age_s <= 0:
            raise ValueError(f"a secret's max age must be positive, got {max_age_s!r} s")
        self._clock = clock
        self._max_age = timedelta(seconds=max_age_s)
        self._kept: dict[str, _Kept] = {}

    def fresh(self, arn: str) -> str | None:
        """The kept text of ``arn`` while it is younger than the max age, else None."""
        kept = self._kept.get(arn)
        if kept is None or self._clock.now() - kept.read_at >= self._max_age:
            return None
        return kept.value

    def read(self, arn: str, *, what: str, timeout_s: float) -> str:
        """The text (``SecretString``) of ``arn``: the kept one while fresh, else read now.

        ``what`` names the secret's purpose in errors. Raises :class:`ConfigurationError`
        naming the ARN (never the value) when the secret cannot be read or holds no text.
        """
        value = self.fresh(arn)
        if value is None:
            value = _get_secret_value(arn, what=what, timeout_s=timeout_s)
            self._kept[arn] = _Kept(value, self._clock.now())
        return value

    async def read_async(self, arn: str, *, what: str, timeout_s: float) -> str:
        """:meth:`read` from a coroutine: a kept value at once, a read off the event loop
        (boto3 is synchronous; the loop keeps serving the others meanwhile)."""
        value = self.fresh(arn)
        if value is not None:
            return value
        return await asyncio.to_thread(self.read, arn, what=what, timeout_s=timeout_s)

    async def read_or_last_async(self, arn: str, *, what: str, timeout_s: float) -> str | None:
        """:meth:`read_or_last` from a coroutine, the read off the event loop."""
        value = self.fresh(arn)
        if value is not None:
            return value
        return await asyncio.to_thread(self.read_or_last, arn, what=what, timeout_s=timeout_s)

    def read_or_last(self, arn: str, *, what: str, timeout_s: float) -> str | None:
        """:meth:`read`, but a failed read answers the last value kept (logged), or None.

        For callers that cannot raise, such as the NATS client asking for credentials in the
        middle of a reconnect: the old credentials may still be admitted, and the next use
        reads again.
        """
        try:
            return self.read(arn, what=what, timeout_s=timeout_s)
        except ConfigurationError as exc:
            kept = self._kept.get(arn)
            _log.warning("%s; using the value read at %s", exc, kept and kept.read_at)
            return None if kept is None else kept.value


def read_secret_string(
    arn: str, *, what: str, timeout_s: float, cache: SecretCache | None = None
) -> str:
    """The text of the secret ``arn`` — through ``cache`` when given, else read now.

    Raises :class:`ConfigurationError` naming the ARN (never the value), as
    :meth:`SecretCache.read`.
    """
    if cache is not None:
        return cache.read(arn, what=what, timeout_s=timeout_s)
    return _get_secret_value(arn, what=what, timeout_s=timeout_s)


def _get_secret_value(arn: str, *, what: str, timeout_s: float) -> str:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client(
        "secretsmanager",
        region_name=_region_of(arn),
        config=Config(
            retries={"max_attempts": 2, "mode": "standard"},
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
        ),
    )
    try:
        answer = client.get_secret_value(SecretId=arn)
    except (ClientError, BotoCoreError) as exc:
        # Neither error carries the secret's value: only its ARN and what went wrong.
        raise ConfigurationError(
            f"cannot read {what} from the Secrets Manager secret {arn}: {exc}; check the ARN "
            "and that the function's role may call secretsmanager:GetSecretValue on it"
        ) from exc
    value = answer.get("SecretString")
    if not isinstance(value, str) or not value:
        raise ConfigurationError(
            f"the Secrets Manager secret {arn} ({what}) holds no text; store it as a "
            "SecretString, not binary"
        )
    return value


def _region_of(arn: str) -> str | None:
    """The region of an ARN (``arn:aws:secretsmanager:<region>:...``), else None (the
    default chain: ``AWS_REGION`` in Lambda)."""
    parts = arn.split(":")
    return parts[3] or None if len(parts) > 3 and parts[0] == "arn" else None
