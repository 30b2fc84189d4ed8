"""The operator API: :func:`create_api` composes the FastAPI app from a runtime and an
:class:`~rhumbatron.api.auth.Authenticator`.

Served by uvicorn locally and by Mangum behind API Gateway
(:mod:`rhumbatron.api.lambda_handler`). The routes live in :mod:`rhumbatron.api.routes`,
one module per resource; they take the runtime and the caller this module keeps on
``app.state`` through :mod:`rhumbatron.api.dependencies`, and only translate HTTP to the
request layer (:mod:`rhumbatron.operator`, :mod:`rhumbatron.lifecycle`, the reactions'
registries) and back.

Routes are ``async def`` on purpose, and call the product database on the event loop:
the process has one SQLite connection, and a transaction must not interleave with
another on it. Run on the loop, with no ``await`` inside, each transaction is whole;
FastAPI's thread pool (``def`` routes) would run two at once on the same connection.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from rhumbatron.api.audit_trail import AuditTrail
from rhumbatron.api.body_limit import BodyLimit
from rhumbatron.api.docs_page import install_docs_page
from rhumbatron.api.errors import install_error_handlers
from rhumbatron.api.routes import ROUTERS
from rhumbatron.api.tracing import TraceRequests
from rhumbatron.errors import RhumbatronError

if TYPE_CHECKING:
    from rhumbatron.api.auth import Authenticator
    from rhumbatron.api.ports import ApiRuntime

__all__ = ["create_api"]

_log = logging.getLogger(__name__)


# -- composition -------------------------------------------------------------------------------


def create_api(app: ApiRuntime, auth: Authenticator, *, manage_runtime: bool = True) -> FastAPI:
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
            # the reads; the first send tries again (dependencies.StreamsGate).
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
        # FastAPI's pages load their assets from a CDN: /docs is served from the package
        # instead (docs_page), and ReDoc is not offered.
        docs_url=None,
        redoc_url=None,
    )
    # What the routes' dependencies read (rhumbatron.api.dependencies).
    api.state.rhumbatron = app
    api.state.authenticator = auth
    api.state.streams_ready = False
    api.state.retry_after_s = app.settings.api_retry_after_s
    install_error_handlers(api)
    # Outside every route: a body over the limit is refused before anything reads it.
    api.add_middleware(BodyLimit, max_bytes=app.settings.api_max_body_bytes)
    # Every mutating request that reached an operation is audited.
    api.add_middleware(AuditTrail)
    # Outermost: the request's span holds everything it writes and sends (api.tracing).
    api.add_middleware(TraceRequests)
    for router in ROUTERS:
        api.include_router(router)
    install_docs_page(api)
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
