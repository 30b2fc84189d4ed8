"""The operator API: :func:`create_api` composes the FastAPI app from a runtime and an
:class:`~rhumbatron.api.auth.Authenticator`.

Served by uvicorn locally and by Mangum behind API Gateway
(:mod:`rhumbatron.api.lambda_handler`). Routes only translate HTTP to the operator
functions of :mod:`rhumbatron.operator` and back.

Routes are ``async def`` on purpose, and call the product database on the event loop:
the process has one SQLite connection, and a transaction must not interleave with
another on it. Run on the loop, with no ``await`` inside, each transaction is whole;
FastAPI's thread pool (``def`` routes) would run two at once on the same connection.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request, Response, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer, SecurityScopes

from rhumbatron import operator
from rhumbatron.api.auth import (
    SCOPE_COMMANDS_SEND,
    SCOPE_DEAD_LETTERS_READ,
    SCOPE_DEAD_LETTERS_WRITE,
    Authenticator,
    Principal,
)
from rhumbatron.api.body_limit import BodyLimit
from rhumbatron.api.consumers_routes import consumers_router
from rhumbatron.api.errors import (
    AuthenticationError,
    InvalidRequestError,
    PermissionDeniedError,
    error_responses,
    install_error_handlers,
)
from rhumbatron.api.lifecycle_routes import lifecycle_router
from rhumbatron.api.replay_routes import replay_router
from rhumbatron.api.schedule_routes import schedule_router
from rhumbatron.api.schemas import (
    DeadLetterDetail,
    DeadLetterPageBody,
    DeadLetterSummary,
    Health,
    RetryBody,
    SendCommandBody,
    SendCommandRequest,
)
from rhumbatron.api.subscription_routes import subscription_router
from rhumbatron.errors import DeadLetterNotFoundError, NatsUnavailableError, RhumbatronError
from rhumbatron.product.dead_letters import DeadLetterKind, DeadLetterStatus
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN
from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["create_api"]

_log = logging.getLogger(__name__)

_bearer = HTTPBearer(
    auto_error=False,
    description="A static API token (local) or a JWT (the cloud); the scopes each operation "
    "needs are listed on it.",
)


# -- dependencies ------------------------------------------------------------------------------


def _runtime_of(request: Request) -> Rhumbatron:
    runtime = request.app.state.rhumbatron
    assert isinstance(runtime, Rhumbatron)
    return runtime


async def _runtime(request: Request) -> Rhumbatron:
    # async: FastAPI would run a plain function in its thread pool, for a dictionary read.
    return _runtime_of(request)


async def _principal(
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
    for scope in security_scopes.scopes:
        if scope not in principal.scopes:
            raise PermissionDeniedError(scope, tenant=principal.tenant_id, has=principal.scopes)
    return principal


async def _streams_ready(request: Request) -> None:
    """Create the streams once per process before the first send (a no-op once done).

    Called from the route, after authentication: an anonymous request must not make the
    API talk to JetStream, nor learn that NATS is down."""
    if request.app.state.streams_ready:
        return
    from nats.errors import Error as NatsError

    try:
        await _runtime_of(request).ensure_streams()
    except (NatsError, TimeoutError) as exc:
        # ensure_streams reports a refused stream itself; a dropped connection surfaces as
        # the client's own error, which is NATS being unavailable to this request.
        raise NatsUnavailableError(
            f"cannot reach JetStream to create the streams: {type(exc).__name__}: {exc}"
        ) from exc
    request.app.state.streams_ready = True


Runtime = Annotated[Rhumbatron, Depends(_runtime)]
Reader = Annotated[Principal, Security(_principal, scopes=[SCOPE_DEAD_LETTERS_READ])]
Writer = Annotated[Principal, Security(_principal, scopes=[SCOPE_DEAD_LETTERS_WRITE])]
Sender = Annotated[Principal, Security(_principal, scopes=[SCOPE_COMMANDS_SEND])]
LetterId = Annotated[str, Path(alias="id", min_length=1, max_length=64)]

router = APIRouter()


# -- routes ------------------------------------------------------------------------------------


@router.get(
    "/health",
    response_model=Health,
    summary="Whether this process can serve",
    responses={
        503: {
            "model": Health,
            "description": "NATS or the product database is down.",
            "headers": {
                "Retry-After": {
                    "description": "Seconds to wait before asking again.",
                    "required": True,
                    "schema": {"type": "integer"},
                }
            },
        }
    },
)
async def health(runtime: Runtime, response: Response) -> Health:
    """No token needed. 200 when NATS is connected and the product database is readable,
    503 (with the same body) otherwise."""
    try:
        nats_ok = (await runtime.nats()).is_connected
    except RhumbatronError as exc:
        _log.info("health: NATS: %s", exc)
        nats_ok = False
    try:
        runtime.product().connection.execute("SELECT 1 FROM dead_letters LIMIT 1").fetchall()
        db_ok = True
    except Exception as exc:  # any failure to read is the answer, not an error
        _log.info("health: product database: %s", exc)
        db_ok = False
    ok = nats_ok and db_ok
    if not ok:
        response.status_code = 503
        response.headers["Retry-After"] = str(runtime.settings.api_retry_after_s)
    return Health(status="ok" if ok else "unavailable", nats=nats_ok, product_database=db_ok)


@router.get(
    "/dead-letters",
    response_model=DeadLetterPageBody,
    summary="List dead letters",
    responses=error_responses(401, 403, 422, 503),
)
async def list_dead_letters(
    *,
    runtime: Runtime,
    principal: Reader,
    status: Annotated[
        Literal["open", "closed", "all"], Query(description="Open letters unless asked.")
    ] = "open",
    kind: Annotated[DeadLetterKind | None, Query()] = None,
    queue: Annotated[str | None, Query(max_length=64, description="The origin queue.")] = None,
    project_id: Annotated[
        str | None, Query(alias="projectId", pattern=PROJECT_ID_PATTERN.pattern)
    ] = None,
    after: Annotated[
        str | None, Query(min_length=1, max_length=64, description="The previous page's next.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=operator.MAX_PAGE)] = 50,
) -> DeadLetterPageBody:
    """The caller's tenant's letters, oldest first. Page with ``after``: the ``next`` of
    the previous page."""
    try:
        page = operator.list_dead_letters(
            runtime,
            tenant_id=principal.tenant_id,
            status=None if status == "all" else DeadLetterStatus(status),
            kind=kind,
            queue=queue,
            project_id=project_id,
            after=after,
            limit=limit,
        )
    except DeadLetterNotFoundError as exc:
        raise InvalidRequestError(str(exc), field="after") from None
    return DeadLetterPageBody.of(page)


@router.get(
    "/dead-letters/{id}",
    response_model=DeadLetterDetail,
    summary="Inspect a dead letter",
    responses=error_responses(401, 403, 404, 422, 503),
)
async def inspect_dead_letter(
    runtime: Runtime, principal: Reader, dead_letter_id: LetterId
) -> DeadLetterDetail:
    """The letter with its full command payload, last error, attempts and resolution."""
    inspection = operator.inspect_dead_letter(
        runtime, dead_letter_id, tenant_id=principal.tenant_id
    )
    return DeadLetterDetail.of_inspection(inspection)


@router.post(
    "/dead-letters/{id}/retry",
    response_model=RetryBody,
    summary="Send a dead-lettered command again",
    responses=error_responses(401, 403, 404, 409, 422, 503),
)
async def retry_dead_letter(
    request: Request, runtime: Runtime, principal: Writer, dead_letter_id: LetterId
) -> RetryBody:
    """Sends the command again with ``attempt + 1`` (agent.wake on agent-wakeups, others
    on integration), exactly once: a second Retry of the same attempt sends nothing and
    answers ``sent: false`` with ``alreadyRetriedAs``. The letter stays open until the
    command succeeds or fails again. A poison-event letter can only be dismissed (409)."""
    await _streams_ready(request)
    outcome = await operator.retry_dead_letter(
        runtime, dead_letter_id, tenant_id=principal.tenant_id
    )
    return RetryBody.of(outcome)


@router.post(
    "/dead-letters/{id}/dismiss",
    response_model=DeadLetterSummary,
    summary="Dismiss a dead letter",
    responses=error_responses(401, 403, 404, 409, 422, 503),
)
async def dismiss_dead_letter(
    runtime: Runtime, principal: Writer, dead_letter_id: LetterId
) -> DeadLetterSummary:
    """Closes an open letter with the resolution ``dismissed``."""
    letter = operator.dismiss_dead_letter(runtime, dead_letter_id, tenant_id=principal.tenant_id)
    return DeadLetterSummary.of(letter)


@router.post(
    "/commands",
    response_model=SendCommandBody,
    status_code=202,
    summary="Send a command to a queue",
    responses=error_responses(401, 403, 404, 422, 503),
)
async def send_command(
    request: Request, runtime: Runtime, principal: Sender, body: SendCommandRequest
) -> SendCommandBody:
    """Queues the command under the message ID ``<queue>:<commandId>`` (``:<attempt>``
    added after the first attempt): the same command sent again within two hours is
    dropped, and ``duplicate`` says so. A project of another tenant is not found (404)."""
    await _streams_ready(request)
    result = await operator.send_command(
        runtime, body.queue, body.command, tenant_id=principal.tenant_id
    )
    return SendCommandBody.of(body.command, result)


# -- composition -------------------------------------------------------------------------------


def create_api(app: Rhumbatron, auth: Authenticator, *, manage_runtime: bool = True) -> FastAPI:
    """The operator API over ``app`` (from :func:`~rhumbatron.runtime.bootstrap.bootstrap`).

    With ``manage_runtime`` (uvicorn, tests) the app ensures the streams when the server
    starts and closes the runtime when it stops: the NATS connection opens on the server's
    event loop and must be drained there. The Lambda handler passes False: its runtime
    outlives every invocation, and ``prepare`` ensures the streams.
    """

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        if manage_runtime:
            # Best effort: a server that starts while NATS is down still serves /health and
            # the reads; the first send tries again (_streams_ready).
            try:
                await app.ensure_streams()
                api.state.streams_ready = True
            except RhumbatronError as exc:
                _log.warning("streams not ensured at start-up: %s", exc)
        yield
        if manage_runtime:
            try:
                await app.close()
            except Exception as exc:  # a server already gone leaves nothing to drain
                _log.warning("closing the runtime: %s", exc)

    api = _OperatorApi(
        title="Rhumbatron operator API",
        version="1",
        summary="Dead letters: list, inspect, retry, dismiss; send commands. Projects, "
        "Changes, agent callbacks, the project view and feed; agents.",
        lifespan=lifespan,
        # operationId = the route function's name: retry_dead_letter, send_command, ...
        generate_unique_id_function=lambda route: route.name,
    )
    api.state.rhumbatron = app
    api.state.authenticator = auth
    api.state.streams_ready = False
    api.state.retry_after_s = app.settings.api_retry_after_s
    install_error_handlers(api)
    # Outside every route: a body over the limit is refused before anything reads it.
    api.add_middleware(BodyLimit, max_bytes=app.settings.api_max_body_bytes)
    api.include_router(router)
    api.include_router(lifecycle_router(app, _principal, _streams_ready))
    api.include_router(replay_router(app, _principal))
    api.include_router(subscription_router(app, _principal))
    api.include_router(schedule_router(app, _principal))
    api.include_router(consumers_router(app, _principal))
    return api


class _OperatorApi(FastAPI):
    """FastAPI with the Command payload documented per command type."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            schema = super().openapi()
            _document_payloads(schema)
            self.openapi_schema = schema
        return self.openapi_schema


def _document_payloads(schema: dict[str, Any]) -> None:
    """The envelope's ``payload`` is typed by ``commandType`` at validation time, which a
    JSON schema of the model cannot say: name each type's payload model instead."""
    from pydantic.json_schema import models_json_schema

    from rhumbatron.protocol.command_types import COMMAND_TYPES

    components = schema.setdefault("components", {}).setdefault("schemas", {})
    command = components.get("Command")
    if command is None:
        return
    payloads = sorted({spec.payload for spec in COMMAND_TYPES.values()}, key=lambda m: m.__name__)
    _, defs = models_json_schema(
        [(model, "validation") for model in payloads],
        ref_template="#/components/schemas/{model}",
    )
    components.update(defs.get("$defs", {}))
    components.pop("Payload", None)
    command["properties"]["commandType"]["enum"] = sorted(COMMAND_TYPES)
    command["properties"]["payload"] = {
        "description": "The payload of commandType: "
        + ", ".join(
            f"{name} takes {spec.payload.__name__}" for name, spec in COMMAND_TYPES.items()
        ),
        "anyOf": [{"$ref": f"#/components/schemas/{model.__name__}"} for model in payloads],
    }
