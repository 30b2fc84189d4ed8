"""Opening a NATS connection, with "unreachable" as its own error, and its credentials.

A publisher must tell "no server answered" (no attempt counts: rows stay pending) from
"a server refused" (an attempt counts). :class:`NatsUnavailableError` is the first.

In the cloud the client authenticates with credentials kept in Secrets Manager
(``nats_credentials_secret_arn``), read through the runtime's
:class:`~rhumbatron.messaging.secrets.SecretCache`: kept ``secret_max_age_s``, then read again,
so a rotated secret applies without a cold start (see :func:`connect_nats` for when).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rhumbatron.errors import ConfigurationError, NatsUnavailableError
from rhumbatron.messaging.secrets import SecretCache, read_secret_string

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.core.settings import Settings

__all__ = ["NATS_CREDENTIAL_SHAPES", "connect_nats", "nats_auth_options", "read_secret_string"]

#: What the NATS credentials secret may hold (one shape, as a JSON object).
NATS_CREDENTIAL_SHAPES = (
    '{"user": ..., "password": ...}',
    '{"token": ...}',
    '{"nkey_seed": "SU..."}',
    '{"creds": "<the .creds file>"}',
)


def nats_auth_options(secret: str, *, arn: str) -> dict[str, Any]:
    """The ``Client.connect`` options for the credentials in ``secret`` (the text of the
    secret ``arn``): user and password, a token, an nkey seed, or a ``.creds`` file's content.

    Raises :class:`ConfigurationError` naming the ARN and the keys found (never a value).
    """
    expected = "; store one of " + ", ".join(NATS_CREDENTIAL_SHAPES)
    try:
        data = json.loads(secret)
    except ValueError:
        # `from None`: a JSON error keeps the whole document, which here is the secret.
        raise ConfigurationError(
            f"the NATS credentials secret {arn} is not JSON{expected}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"the NATS credentials secret {arn} holds a JSON {type(data).__name__}, not an "
            f"object{expected}"
        )
    keys = frozenset(data)
    empty = sorted(k for k, v in data.items() if not isinstance(v, str) or not v)
    if empty:
        raise ConfigurationError(
            f"the NATS credentials secret {arn} has empty or non-text values for "
            f"{', '.join(empty)}{expected}"
        )
    if keys == {"user", "password"}:
        return {"user": data["user"], "password": data["password"]}
    if keys == {"token"}:
        return {"token": data["token"]}
    if keys in ({"nkey_seed"}, {"creds"}):
        # nats-py signs the server's nonce with the `nkeys` package, imported only then: a
        # missing package would surface as an import error in the middle of a connect.
        if importlib.util.find_spec("nkeys") is None:
            raise ConfigurationError(
                f"the NATS credentials secret {arn} holds {next(iter(keys))!r}, which needs "
                "the nkeys package: add nkeys to the dependencies (layers/requirements.txt)"
            )
        if keys == {"nkey_seed"}:
            return {"nkeys_seed_str": data["nkey_seed"]}
        from nats.aio.client import RawCredentials

        return {"user_credentials": RawCredentials(data["creds"])}
    raise ConfigurationError(
        f"the NATS credentials secret {arn} has the keys {', '.join(sorted(keys)) or 'none'}"
        f"{expected}"
    )


_CREDENTIALS = "the NATS credentials (RHUMBATRON_NATS_CREDENTIALS_SECRET_ARN)"
_CA = "the NATS servers' CA (RHUMBATRON_NATS_TLS_CA_SECRET_ARN)"


async def _auth_options(settings: Settings, secrets: SecretCache) -> dict[str, Any]:
    arn = settings.nats_credentials_secret_arn
    if not arn:  # the template passes no variable, or an empty one, when there is no secret
        return {}
    timeout_s = settings.nats_connect_timeout_s
    secret = await secrets.read_async(arn, what=_CREDENTIALS, timeout_s=timeout_s)
    options = nats_auth_options(secret, arn=arn)
    if not options.keys() <= {"user", "password", "token"}:
        return options  # an nkey seed or a .creds file: fixed for the connection's life
    last = dict(options)
    refreshing: set[asyncio.Future[str | None]] = set()

    def take(reading: asyncio.Future[str | None]) -> None:
        # On the event loop, between two CONNECTs: never between nats-py's asking for the
        # user and for the password, which would pair an old user with a new password.
        refreshing.discard(reading)
        if reading.cancelled():
            return
        if (failure := reading.exception()) is not None:
            _log.warning(
                "cannot read %s again: %s; keeping the credentials read before",
                _CREDENTIALS,
                failure,
            )
            return
        text = reading.result()
        try:
            fresh = {} if text is None else nats_auth_options(text, arn=arn)
        except ConfigurationError as exc:
            _log.warning("%s; reconnecting with the credentials read before", exc)
            return
        if fresh.keys() == last.keys():
            last.update(fresh)

    def current(key: str) -> Callable[[], str]:
        # nats-py asks again each time it sends CONNECT (every reconnect), synchronously, in
        # the middle of the handshake: this answers at once with the credentials kept, and
        # once they are secret_max_age_s old it starts a read off the event loop (a blocking
        # read here would stall every task and could outlast the server's auth timeout). A
        # secret rotated since reaches the next reconnect after that read; one that fails
        # keeps the credentials last read.
        def get() -> str:
            if secrets.fresh(arn) is None and not refreshing:
                reading = asyncio.get_running_loop().run_in_executor(
                    None, lambda: secrets.read_or_last(arn, what=_CREDENTIALS, timeout_s=timeout_s)
                )
                refreshing.add(reading)
                reading.add_done_callback(take)
            return str(last[key])

        return get

    return {key: current(key) for key in options}


async def _tls_options(settings: Settings, secrets: SecretCache) -> dict[str, Any]:
    """A TLS context trusting the cluster's private CA, when a secret names one (read at each
    new connection; a reconnect keeps the context of its connection)."""
    arn = settings.nats_tls_ca_secret_arn
    if not arn:
        return {}
    pem = await secrets.read_async(arn, what=_CA, timeout_s=settings.nats_connect_timeout_s)
    import ssl

    try:
        context = ssl.create_default_context(cadata=pem)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigurationError(
            f"the secret {arn} (RHUMBATRON_NATS_TLS_CA_SECRET_ARN) holds no usable PEM "
            f"certificate ({type(exc).__name__}); store the CA certificate's PEM text in it"
        ) from None
    return {"tls": context}


async def connect_nats(
    settings: Settings, *, name: str = "rhumbatron", secrets: SecretCache | None = None
) -> NATS:
    """Connect to ``settings.nats_url``; raise :class:`NatsUnavailableError` if nobody answers.

    Once connected, the client reconnects by itself after a server restart (RELIABILITY F15)
    and buffers nothing while disconnected: a publish during an outage fails fast instead of
    piling up. The *first* connect is bounded: nats-py retries it for as long as it may
    reconnect later (for ever), so without a bound an unreachable server would hang the caller.

    With ``nats_tls_ca_secret_arn`` set, the servers' certificates are checked against that
    CA (a PEM in a secret). With ``nats_credentials_secret_arn`` set, the credentials come
    from that secret. Both are read through ``secrets`` (the runtime's cache; None: a cache of
    this connection's own on the system clock), kept ``secret_max_age_s``: a user and
    password or a token are asked for again at every reconnect, so a rotated secret applies
    once the kept one is that old; the CA, an nkey seed and a ``.creds`` file at the next new
    connection. A secret that cannot be read or used raises
    :class:`ConfigurationError` before any connect; credentials the server refuses end like
    an unreachable server (:class:`NatsUnavailableError`, naming the secret too).
    """
    from nats.aio.client import Client
    from nats.errors import NoServersError

    if secrets is None:
        from rhumbatron.core.clock import SystemClock

        secrets = SecretCache(SystemClock(), settings.secret_max_age_s)
    auth = await _auth_options(settings, secrets)
    tls = await _tls_options(settings, secrets)
    nc = Client()
    bound_s = 2 * settings.nats_connect_timeout_s
    errors = _ConnectionErrors(name)

    try:
        options = {**_client_options(settings, name, errors), **auth, **tls}
        await asyncio.wait_for(nc.connect(**options), timeout=bound_s)
    except (TimeoutError, NoServersError, OSError) as exc:
        await nc.close()
        # nats-py retries a refused authorization like an unreachable server, until the
        # bound: wrong credentials look like a timeout, so the message names them too.
        also = (
            f", and that it admits the credentials in {settings.nats_credentials_secret_arn}"
            if auth
            else ""
        )
        raise NatsUnavailableError(
            f"no NATS server answered at {settings.nats_url} within {bound_s:g} s "
            f"({type(exc).__name__}); check RHUMBATRON_NATS_URL and that nats-server is "
            f"running{also}"
        ) from exc
    errors.connected = True
    return nc


def _client_options(settings: Settings, name: str, errors: _ConnectionErrors) -> dict[str, Any]:
    """nats-py's connect options: reconnect for ever, buffer nothing while disconnected, and
    leave a server that stalls."""
    return {
        # Several seeds, comma-separated, for a cluster; the client also learns the other
        # members from the server it reaches.
        "servers": [url.strip() for url in settings.nats_url.split(",") if url.strip()],
        "name": name,
        # nats-py annotates these as int, but uses them as asyncio timeouts (floats).
        "connect_timeout": settings.nats_connect_timeout_s,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        # A server that stalls holds its connection open: found by its pings.
        "ping_interval": settings.nats_ping_interval_s,
        "max_outstanding_pings": 2,
        "pending_size": 0,
        "error_cb": errors.on_error,
        "reconnected_cb": errors.on_reconnected,
    }


class _ConnectionErrors:
    """nats-py's error and reconnect callbacks, in one line each and few of them.

    nats-py's own error callback logs every failed connect with its traceback: some 500
    lines for one unreachable server. The first connect's failures end in one
    :class:`NatsUnavailableError` instead, so they are only debug lines; once connected, the
    first error of an outage is a warning, and the retries after it are debug lines until
    the client is back.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.connected = False
        self._warned = False

    async def on_error(self, exc: Exception) -> None:
        level = logging.WARNING if self.connected and not self._warned else logging.DEBUG
        self._warned = self._warned or self.connected
        _log.log(level, "nats connection %s: %s: %s", self.name, type(exc).__name__, exc)

    async def on_reconnected(self) -> None:
        self._warned = False
        _log.info("nats connection %s: reconnected", self.name)
