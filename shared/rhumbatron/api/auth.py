"""Who is calling: the :class:`Authenticator` port and its two adapters.

The API checks the bearer token itself on every request, even behind API Gateway's JWT
authorizer: the authorizer may be misconfigured or bypassed (a function URL, a test
stage), and only the app knows which scope each operation needs and which tenant owns
each record.

* :class:`StaticTokenAuth` — local: opaque tokens from settings (``RHUMBATRON_API_TOKENS``),
  each mapped to a tenant and scopes.
* :class:`JwtAuth` — the cloud: a JWT signed with HS256 (a shared secret) or RS256 (a
  public key, or a JWKS URL), checked for ``exp``, ``iss`` and ``aud``. The tenant is the
  ``tenant`` claim (``api_jwt_tenant_claim``); scopes come from ``scope`` (space-separated)
  or ``scp`` (a list, or space-separated). ``iat`` may not be in the future, and a token may
  live at most ``api_jwt_max_lifetime_s``. Time is the runtime's clock, not the machine's,
  so tests move it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Literal

from rhumbatron.core.settings import ANY_TENANT, ApiTokenGrant
from rhumbatron.errors import (
    AuthenticationError,
    ConfigurationError,
    PlatformRequiredError,
    UnavailableError,
)

if TYPE_CHECKING:
    from jwt import PyJWKClient

    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings

__all__ = [
    "SCOPES",
    "SCOPE_AGENTS_READ",
    "SCOPE_AGENTS_WRITE",
    "SCOPE_AUDIT_READ",
    "SCOPE_CHANGES_READ",
    "SCOPE_CHANGES_WRITE",
    "SCOPE_COMMANDS_SEND",
    "SCOPE_CONSUMERS_READ",
    "SCOPE_CONSUMERS_WRITE",
    "SCOPE_DEAD_LETTERS_READ",
    "SCOPE_DEAD_LETTERS_WRITE",
    "SCOPE_PROJECTS_READ",
    "SCOPE_PROJECTS_WRITE",
    "SCOPE_REPLAY_WRITE",
    "Authenticator",
    "JwtAuth",
    "Principal",
    "StaticTokenAuth",
    "authenticator_from_settings",
    "platform_principal",
]

SCOPE_DEAD_LETTERS_READ: Final = "dead-letters:read"
SCOPE_DEAD_LETTERS_WRITE: Final = "dead-letters:write"
SCOPE_COMMANDS_SEND: Final = "commands:send"
#: Read a project, its view and its feed.
SCOPE_PROJECTS_READ: Final = "projects:read"
#: Provision, clean up and archive projects; provision and remove their apps.
SCOPE_PROJECTS_WRITE: Final = "projects:write"
#: Read Changes, their Tasks, Candidates and releases.
SCOPE_CHANGES_READ: Final = "changes:read"
#: Request Changes; approve, decline or cancel them.
SCOPE_CHANGES_WRITE: Final = "changes:write"
#: Read the subscriptions (what reacts to which facts).
SCOPE_AGENTS_READ: Final = "agents:read"
#: Register Agents, and report as an Agent on a Task (the agent callbacks); manage
#: subscriptions.
SCOPE_AGENTS_WRITE: Final = "agents:write"
#: Replay a subscription from a stream point or the archive (a platform operator's scope).
SCOPE_REPLAY_WRITE: Final = "replay:write"
#: Read every durable consumer's lag (a platform operator's scope: it spans every tenant).
SCOPE_CONSUMERS_READ: Final = "consumers:read"
#: Act on the log's consumers and replicas: repair a stream whose replica lost events (a
#: platform operator's scope).
SCOPE_CONSUMERS_WRITE: Final = "consumers:write"
#: Read the audit log (a tenant's rows; a platform token's: every tenant's).
SCOPE_AUDIT_READ: Final = "audit:read"
#: Every scope an operation can ask for (the settings' ApiScope literal holds the same).
SCOPES: Final = frozenset(
    {
        SCOPE_DEAD_LETTERS_READ,
        SCOPE_DEAD_LETTERS_WRITE,
        SCOPE_COMMANDS_SEND,
        SCOPE_PROJECTS_READ,
        SCOPE_PROJECTS_WRITE,
        SCOPE_CHANGES_READ,
        SCOPE_CHANGES_WRITE,
        SCOPE_AGENTS_READ,
        SCOPE_AGENTS_WRITE,
        SCOPE_REPLAY_WRITE,
        SCOPE_CONSUMERS_READ,
        SCOPE_CONSUMERS_WRITE,
        SCOPE_AUDIT_READ,
    }
)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: who (for the logs), for which tenant, allowed what."""

    subject: str
    tenant_id: str
    scopes: frozenset[str]

    @property
    def tenant_scope(self) -> str | None:
        """The tenant whose records the caller sees; None (every tenant's) for a platform
        token."""
        return None if self.tenant_id == ANY_TENANT else self.tenant_id


class Authenticator(ABC):
    """Turns a bearer token into a :class:`Principal`."""

    @abstractmethod
    def authenticate(self, token: str) -> Principal:
        """The caller the token names; raises :class:`AuthenticationError` (401)."""


def _fingerprint(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class StaticTokenAuth(Authenticator):
    """Opaque tokens, each granted a tenant and scopes (``RHUMBATRON_API_TOKENS``)."""

    def __init__(self, tokens: Mapping[str, ApiTokenGrant]) -> None:
        # Only digests are kept: a heap dump or a repr shows no token.
        self._grants = [(_fingerprint(token), grant) for token, grant in tokens.items()]

    def authenticate(self, token: str) -> Principal:
        presented = _fingerprint(token)
        found: tuple[bytes, ApiTokenGrant] | None = None
        # Compare with every grant, in constant time each: how long this takes does not
        # depend on which token (or how much of one) matched.
        for digest, grant in self._grants:
            if hmac.compare_digest(digest, presented):
                found = (digest, grant)
        if found is None:
            raise AuthenticationError("the bearer token is not one this API knows")
        digest, grant = found
        return Principal(f"token:{digest.hex()[:8]}", grant.tenant, frozenset(grant.scopes))


class JwtAuth(Authenticator):
    """Signed JWTs: HS256 with ``secret``, or RS256 with ``public_key`` or ``jwks_url``."""

    def __init__(
        self,
        *,
        clock: Clock,
        issuer: str,
        audience: str,
        secret: str | None = None,
        public_key: str | None = None,
        jwks_url: str | None = None,
        tenant_claim: str = "tenant",
        leeway_s: float = 30.0,
        max_lifetime_s: float = 86_400.0,
    ) -> None:
        sources = [s for s in (secret, public_key, jwks_url) if s is not None]
        if len(sources) != 1:
            raise ConfigurationError(
                "JwtAuth needs exactly one of secret (HS256), public_key or jwks_url (RS256)"
            )
        self._clock = clock
        self._issuer = issuer
        self._audience = audience
        self._tenant_claim = tenant_claim
        self._leeway_s = leeway_s
        self._max_lifetime_s = max_lifetime_s
        # One algorithm per key, pinned: a token cannot pick "none", or HS256 with the
        # public key as its secret (the algorithm-confusion attack).
        self._algorithm: Literal["HS256", "RS256"] = "HS256" if secret is not None else "RS256"
        self._key: Any = secret if secret is not None else public_key
        self._jwks: PyJWKClient | None = None
        if jwks_url is not None:
            from jwt import PyJWKClient

            # Keys are cached by kid: only a cold start or a rotated key fetches the URL.
            self._jwks = PyJWKClient(jwks_url, cache_keys=True, timeout=5)

    @classmethod
    def from_settings(cls, settings: Settings, clock: Clock) -> JwtAuth:
        if not settings.api_jwt_issuer or not settings.api_jwt_audience:
            raise ConfigurationError(
                "JWT auth needs RHUMBATRON_API_JWT_ISSUER and RHUMBATRON_API_JWT_AUDIENCE"
            )
        secret = settings.api_jwt_secret
        return cls(
            clock=clock,
            issuer=settings.api_jwt_issuer,
            audience=settings.api_jwt_audience,
            secret=secret.get_secret_value() if secret is not None else None,
            public_key=settings.api_jwt_public_key,
            jwks_url=settings.api_jwt_jwks_url,
            tenant_claim=settings.api_jwt_tenant_claim,
            leeway_s=settings.api_jwt_leeway_s,
            max_lifetime_s=settings.api_jwt_max_lifetime_s,
        )

    def authenticate(self, token: str) -> Principal:
        import jwt

        try:
            key = self._key
            if self._jwks is not None:
                key = self._jwks.get_signing_key_from_jwt(token).key
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[self._algorithm],
                audience=self._audience,
                issuer=self._issuer,
                # Times are checked below against the injected clock.
                options={
                    "require": ["exp", "iss", "aud"],
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.PyJWKClientConnectionError as exc:
            raise UnavailableError(f"cannot fetch the JWT signing keys: {exc}") from None
        except (jwt.InvalidTokenError, jwt.PyJWKClientError) as exc:
            raise AuthenticationError(f"the bearer token is not valid: {exc}") from None
        self._check_times(claims)
        return Principal(
            subject=str(claims.get("sub") or "?"),
            tenant_id=self._tenant(claims),
            scopes=_scopes(claims),
        )

    def _check_times(self, claims: Mapping[str, Any]) -> None:
        now = self._clock.now().timestamp()
        exp = _epoch(claims.get("exp"))
        if exp is None:
            raise AuthenticationError(
                f"the bearer token's exp={claims.get('exp')!r:.40} is not a time"
            )
        if now > exp + self._leeway_s:
            raise AuthenticationError(
                f"the bearer token expired at {_iso(exp)}; get a new one", code="token_expired"
            )
        nbf = _time_claim(claims, "nbf")
        if nbf is not None and now + self._leeway_s < nbf:
            raise AuthenticationError(f"the bearer token is not valid before {_iso(nbf)}")
        iat = _time_claim(claims, "iat")
        if iat is not None and now + self._leeway_s < iat:
            raise AuthenticationError(
                f"the bearer token was issued at {_iso(iat)}, in the future; check the "
                "issuer's clock"
            )
        # A token minted to live for ever is a stolen token that never dies: the lifetime is
        # bounded from now, and from its issue when it says when that was.
        start = now if iat is None else min(now, iat)
        if exp - start > self._max_lifetime_s + self._leeway_s:
            raise AuthenticationError(
                f"the bearer token's lifetime ({_iso(start)} to {_iso(exp)}) is longer than the "
                f"{self._max_lifetime_s:.0f} s this API accepts "
                "(RHUMBATRON_API_JWT_MAX_LIFETIME_S); get a shorter-lived token"
            )

    def _tenant(self, claims: Mapping[str, Any]) -> str:
        tenant = claims.get(self._tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise AuthenticationError(
                f"the bearer token has no {self._tenant_claim!r} claim naming its tenant"
            )
        if tenant == ANY_TENANT:
            # "every tenant" is granted only by a static token the platform configured,
            # never by a claim an identity provider (or a tenant's admin) can mint.
            raise AuthenticationError(
                f"the bearer token's {self._tenant_claim!r} claim {tenant!r} names no tenant"
            )
        return tenant


def _time_claim(claims: Mapping[str, Any], name: str) -> float | None:
    """An optional time claim (``nbf``, ``iat``) as epoch seconds; 401 when it is not a time."""
    if name not in claims:
        return None
    seconds = _epoch(claims[name])
    if seconds is None:
        raise AuthenticationError(f"the bearer token's {name}={claims[name]!r:.40} is not a time")
    return seconds


def _epoch(value: object) -> float | None:
    """A claim as seconds since the epoch, or None: JSON allows NaN and numbers no float
    holds, and neither may pass for a time."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


def _iso(epoch_s: float) -> str:
    try:
        return datetime.fromtimestamp(epoch_s, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return repr(epoch_s)


def _scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    """``scope`` is a space-separated string (RFC 8693); ``scp`` is a list or one string
    (Azure AD, Okta). Scopes the API does not know are kept out."""
    raw = claims.get("scope", claims.get("scp"))
    if isinstance(raw, str):
        names = raw.split()
    elif isinstance(raw, list):
        names = [name for name in raw if isinstance(name, str)]
    else:
        names = []
    return frozenset(names) & SCOPES


def platform_principal(
    principal: Callable[..., Awaitable[Principal]], *, scope: str, doing: str
) -> Callable[..., Awaitable[Principal]]:
    """A FastAPI dependency for a platform route: the caller that ``principal`` (the API's
    authenticating dependency) admits with ``scope``, when it is a platform principal
    (tenant ``*``). A tenant-bound token gets 403 ``platform_required`` whatever its scopes:
    a scope says what a caller may do, not over whose records, and ``doing`` (what the
    route reads) spans every tenant. It runs before the body is read, so a tenant's request
    is refused before any part of it is looked at."""
    from fastapi import Security

    # A default, not Annotated[...]: the annotations of this module are strings (postponed),
    # and FastAPI resolves them against the module's globals, where `principal` is not.
    async def platform(
        caller: Principal = Security(principal, scopes=[scope]),  # noqa: B008
    ) -> Principal:
        if caller.tenant_scope is not None:
            raise PlatformRequiredError(doing, tenant=caller.tenant_id)
        return caller

    return platform


def authenticator_from_settings(settings: Settings, clock: Clock) -> Authenticator:
    """The adapter ``api_auth_mode`` names."""
    if settings.api_auth_mode == "jwt":
        return JwtAuth.from_settings(settings, clock)
    return StaticTokenAuth(settings.api_tokens)
