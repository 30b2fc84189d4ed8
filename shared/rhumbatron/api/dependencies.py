"""What a route takes from its request through FastAPI's ``Depends``: the runtime and the
authenticator :func:`~rhumbatron.api.app.create_api` keeps on ``app.state``, the caller with
the scopes the operation needs, and the gate that creates the streams before a first send.

A route declares them by the aliases below (``runtime: Runtime``, ``principal:
ProjectsReader``), so every route authenticates, and answers 401 / 403, alike.
"""

# No ``from __future__ import annotations`` here, on purpose: the aliases below are read by
# FastAPI at import time as the objects they are, and the route modules that use them do
# the same.

from typing import TYPE_CHECKING, Annotated, Any, cast

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer, SecurityScopes

from rhumbatron.api.audit_trail import PRINCIPAL_STATE_KEY
from rhumbatron.api.auth import (
    SCOPE_AGENTS_READ,
    SCOPE_AGENTS_WRITE,
    SCOPE_AUDIT_READ,
    SCOPE_CHANGES_READ,
    SCOPE_CHANGES_WRITE,
    SCOPE_COMMANDS_SEND,
    SCOPE_CONSUMERS_READ,
    SCOPE_CONSUMERS_WRITE,
    SCOPE_DEAD_LETTERS_READ,
    SCOPE_DEAD_LETTERS_WRITE,
    SCOPE_PROJECTS_READ,
    SCOPE_PROJECTS_WRITE,
    SCOPE_REPLAY_WRITE,
    Authenticator,
    Principal,
    platform_principal,
)
from rhumbatron.errors import AuthenticationError, NatsUnavailableError, PermissionDeniedError

if TYPE_CHECKING:
    from rhumbatron.api.ports import ApiRuntime

__all__ = [
    "AgentsReader",
    "AgentsWriter",
    "AuditReader",
    "ChangesReader",
    "ChangesWriter",
    "CommandSender",
    "ConsumersReader",
    "DeadLettersReader",
    "DeadLettersWriter",
    "LogRepairer",
    "ProjectsReader",
    "ProjectsWriter",
    "Replayer",
    "Runtime",
    "Streams",
    "StreamsGate",
    "get_principal",
    "get_runtime",
    "get_streams",
]

_bearer = HTTPBearer(
    auto_error=False,
    description="A static API token (local) or a JWT (the cloud); the scopes each operation "
    "needs are listed on it.",
)


async def get_runtime(request: Request) -> "ApiRuntime":
    """The runtime the API serves (``app.state.rhumbatron``)."""
    # async: FastAPI would run a plain function in its thread pool, for a dictionary read.
    return cast("ApiRuntime", request.app.state.rhumbatron)


async def get_principal(
    request: Request,
    security_scopes: SecurityScopes,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller, with every scope the operation asked for; 401 or 403 otherwise."""
    if credentials is None:
        raise AuthenticationError(
            "this operation needs an Authorization: Bearer <token> header", code="missing_token"
        )
    authenticator = request.app.state.authenticator
    assert isinstance(authenticator, Authenticator)
    principal = authenticator.authenticate(credentials.credentials)
    # The audit trail names who asked, whatever the answer (a 403 included).
    setattr(request.state, PRINCIPAL_STATE_KEY, principal)
    for scope in security_scopes.scopes:
        if scope not in principal.scopes:
            raise PermissionDeniedError(scope, tenant=principal.tenant_id, has=principal.scopes)
    return principal


class StreamsGate:
    """Creates the streams once per process before the first send (a no-op once done).

    A route opens the gate itself (:meth:`ready`), once the request is authenticated and
    valid: an anonymous or invalid request must not make the API talk to JetStream, nor
    learn that NATS is down. A dependency would run before the body is validated."""

    def __init__(self, request: Request) -> None:
        self._request = request

    async def ready(self) -> None:
        """Ensure the streams, unless this process did already; 503 when NATS is down."""
        state = self._request.app.state
        if state.streams_ready:
            return
        from nats.errors import Error as NatsError

        try:
            await cast("ApiRuntime", state.rhumbatron).ensure_streams()
        except (NatsError, TimeoutError) as exc:
            # ensure_streams reports a refused stream itself; a dropped connection surfaces
            # as the client's own error, which is NATS being unavailable to this request.
            raise NatsUnavailableError(
                f"cannot reach JetStream to create the streams: {type(exc).__name__}: {exc}"
            ) from exc
        state.streams_ready = True


async def get_streams(request: Request) -> StreamsGate:
    """The request's :class:`StreamsGate` (it does nothing until a route opens it)."""
    return StreamsGate(request)


def _scoped(scope: str) -> Any:
    return Security(get_principal, scopes=[scope])


Runtime = Annotated["ApiRuntime", Depends(get_runtime)]
Streams = Annotated[StreamsGate, Depends(get_streams)]

DeadLettersReader = Annotated[Principal, _scoped(SCOPE_DEAD_LETTERS_READ)]
DeadLettersWriter = Annotated[Principal, _scoped(SCOPE_DEAD_LETTERS_WRITE)]
CommandSender = Annotated[Principal, _scoped(SCOPE_COMMANDS_SEND)]
ProjectsReader = Annotated[Principal, _scoped(SCOPE_PROJECTS_READ)]
ProjectsWriter = Annotated[Principal, _scoped(SCOPE_PROJECTS_WRITE)]
ChangesReader = Annotated[Principal, _scoped(SCOPE_CHANGES_READ)]
ChangesWriter = Annotated[Principal, _scoped(SCOPE_CHANGES_WRITE)]
# Subscriptions and schedules reuse the agents' scopes.
AgentsReader = Annotated[Principal, _scoped(SCOPE_AGENTS_READ)]
AgentsWriter = Annotated[Principal, _scoped(SCOPE_AGENTS_WRITE)]
AuditReader = Annotated[Principal, _scoped(SCOPE_AUDIT_READ)]

# Platform tokens only: a stream holds every tenant's events, and the consumers' counts
# span every tenant's records.
Replayer = Annotated[
    Principal,
    Depends(
        platform_principal(get_principal, scope=SCOPE_REPLAY_WRITE, doing="a replay of a stream")
    ),
]
ConsumersReader = Annotated[
    Principal,
    Depends(
        platform_principal(get_principal, scope=SCOPE_CONSUMERS_READ, doing="the consumers' lag")
    ),
]
LogRepairer = Annotated[
    Principal,
    Depends(
        platform_principal(
            get_principal, scope=SCOPE_CONSUMERS_WRITE, doing="a repair of the log's replicas"
        )
    ),
]
