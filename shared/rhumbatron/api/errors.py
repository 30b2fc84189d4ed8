"""The API's one error model, its errors, and the handlers that turn every failure into it.

Every error answer has the body ``{"error": {"code", "message", "field"}}``
(:class:`ErrorResponse`), documented on each operation with its status:

=====  ==========================================================================
401    no bearer token, an expired one, or one that does not verify
       (``WWW-Authenticate: Bearer``, with ``error="invalid_token"`` for a bad one)
403    the token lacks the operation's scope; the message names it; or a tenant-bound
       token asked for a platform route (``platform_required``); or a platform token asked
       to create what only a tenant can own (``tenant_required``)
404    no such dead letter, project, Change, Task, event, subscription or schedule for this
       tenant, or no such route
409    the dead letter is already closed; a poison event cannot be retried; the state of
       what the request names refuses it (a project not active, a Task another Agent holds)
413    the body is over ``api_max_body_bytes`` (1 MiB), declared or streamed
       (``payload_too_large``, answered by :mod:`rhumbatron.api.body_limit`)
422    the request is invalid; ``field`` names the first bad field; or a command refers to
       what does not exist (``unknown_subject``: a project never provisioned, a Change, a
       Candidate, a generation never promoted, an app not live), ``field`` naming it
503    NATS is down, or the product file is busy or full (``Retry-After``)
=====  ==========================================================================

No other 5xx is answered on purpose: an unexpected exception is a bug, logged with its
traceback, and answered as a 500 in the same model.

The API's own errors (:class:`ApiError` and below) extend the package hierarchy of
:mod:`rhumbatron.errors`::

    RhumbatronError
     └── ApiError                  an HTTP answer with a status, a code and maybe a field
          ├── AuthenticationError  401
          ├── PermissionDeniedError 403
          ├── PlatformRequiredError 403 (a tenant token on a platform route)
          ├── ForbiddenError       403 (a platform token creating what a tenant owns)
          ├── NotFoundError        404
          ├── ConflictError        409
          ├── ArchiveDamagedError  409
          ├── InvalidRequestError  422
          └── UnavailableError     503

The request layer's own refusals (a project not active, a Task the Agent does not hold, a
Change that does not exist) are answered from one table, :data:`_STATUS_OF`; a route maps a
:class:`~rhumbatron.errors.DomainError` whose answer depends on what it asked with
:func:`domain_refusal`.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from rhumbatron.errors import (
    ActorBusyError,
    ActorError,
    ApiError,
    ChangeNotFoundError,
    ConflictError,
    CursorNotFoundError,
    DeadLetterClosedError,
    DeadLetterError,
    DeadLetterNotFoundError,
    DomainError,
    EnvelopeError,
    EventNotFoundError,
    InvalidRequestError,
    MessagingError,
    NatsUnavailableError,
    NotHolderError,
    ProjectActiveError,
    ProjectExistsError,
    ProjectIdUnavailableError,
    ProjectNotActiveError,
    ProjectNotFoundError,
    RhumbatronError,
    TaskNotFoundError,
    UnknownSubjectError,
    WorkflowEngineError,
    WorkflowNotFoundError,
)
from rhumbatron.redaction import describe_input

__all__ = [
    "ErrorDetail",
    "ErrorResponse",
    "domain_refusal",
    "error_responses",
    "install_error_handlers",
]

_log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    """What went wrong: a stable ``code``, a sentence for a person, and the bad field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str = Field(description="Stable, machine-readable: not_found, already_closed, ...")
    message: str = Field(description="What was wrong, with the value, and what to do.")
    field: str | None = Field(
        default=None, description="The request field at fault (422), as sent: command.commandId."
    )


class ErrorResponse(BaseModel):
    """The body of every error answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    error: ErrorDetail


# -- the API's own errors ----------------------------------------------------------------------


# -- mapping the package's errors --------------------------------------------------------------

#: Package errors and their answers (status, code, and the request field at fault, as the
#: client names it), most specific first.
_STATUS_OF: tuple[tuple[type[Exception], int, str, str | None], ...] = (
    (DeadLetterNotFoundError, 404, "not_found", None),
    (ProjectNotFoundError, 404, "not_found", None),
    (CursorNotFoundError, 404, "not_found", None),
    (ChangeNotFoundError, 404, "not_found", None),
    (TaskNotFoundError, 404, "not_found", None),
    (EventNotFoundError, 404, "not_found", None),
    (WorkflowNotFoundError, 404, "not_found", None),
    (DeadLetterClosedError, 409, "already_closed", None),
    (DeadLetterError, 409, "not_retryable", None),
    (ProjectIdUnavailableError, 409, "project_id_unavailable", "projectId"),
    (ProjectExistsError, 409, "project_exists", "name"),
    (ProjectNotActiveError, 409, "project_not_active", None),
    (ProjectActiveError, 409, "project_active", None),
    (NotHolderError, 409, "not_holder", None),
    (NatsUnavailableError, 503, "nats_unavailable", None),
    (MessagingError, 503, "messaging_unavailable", None),
    (ActorBusyError, 503, "storage_busy", None),
    (ActorError, 503, "storage_unavailable", None),
    (WorkflowEngineError, 503, "workflow_engine_unavailable", None),
    (EnvelopeError, 422, "invalid_request", None),
    (UnknownSubjectError, 422, "unknown_subject", None),
)


def _answer(
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(code=code, message=message, field=field))
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def _unavailable_headers(request: Request) -> dict[str, str]:
    retry_after = getattr(request.app.state, "retry_after_s", 5)
    return {"Retry-After": str(retry_after)}


async def _rhumbatron_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, ApiError):
        headers = dict(exc.headers)
        if exc.status_code == 503:
            headers.update(_unavailable_headers(request))
        return _answer(exc.status_code, exc.code, exc.message, field=exc.field, headers=headers)
    for kind, status, code, field in _STATUS_OF:
        if isinstance(exc, kind):
            if status == 503:
                _log.warning("%s %s: 503 %s: %s", request.method, request.url.path, code, exc)
            return _answer(
                status,
                code,
                str(exc),
                field=field or getattr(exc, "field", None),
                headers=_unavailable_headers(request) if status == 503 else None,
            )
    return await _unexpected(request, exc)


@contextmanager
def domain_refusal(code: str = "conflict", *, invalid_field: str | None = None) -> Iterator[None]:
    """A :class:`DomainError` of the library as an answer: 409 with ``code`` (the state
    refuses it), or 422 on ``invalid_field`` (the request's own values are at fault)."""
    try:
        yield
    except DomainError as exc:
        if invalid_field is not None:
            raise InvalidRequestError(str(exc), field=invalid_field) from None
        raise ConflictError(str(exc), code=code) from None


async def _sqlite_error(request: Request, exc: Exception) -> JSONResponse:
    """A SQLite error raised inside a product transaction (the storage layer wraps only
    BEGIN and COMMIT): busy and full are the disk's state, worth a retry later."""
    if isinstance(exc, sqlite3.OperationalError):
        _log.warning("%s %s: product database: %s", request.method, request.url.path, exc)
        return _answer(
            503,
            "storage_unavailable",
            f"the product database cannot be written now ({exc}); retry later",
            headers=_unavailable_headers(request),
        )
    return await _unexpected(request, exc)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    _log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _answer(500, "internal_error", f"unexpected {type(exc).__name__}; this is a bug")


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422, in our model: ``field`` names the first bad field as the client sent
    it (``limit``, ``command.payload``), ``message`` lists every problem, quoting a value only
    where :func:`~rhumbatron.redaction.describe_input` allows."""
    assert isinstance(exc, RequestValidationError)
    problems: list[str] = []
    first: str | None = None
    for err in exc.errors():
        loc = err.get("loc", ())
        where = _field_name(loc)
        first = first or where
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "missing":
            problems.append(f"{where} is missing")
            continue
        # Never the value of a secret, nor a whole object: a model-level error's input is the
        # request itself, secrets and all (issue #21).
        quoted = describe_input(loc, err.get("input"))
        problems.append(f"{where}: {message}" if quoted is None else f"{where}={quoted}: {message}")
    return _answer(
        422,
        "invalid_request",
        "invalid request: " + "; ".join(problems or ["the request does not validate"]),
        field=first,
    )


def _field_name(loc: Sequence[Any]) -> str:
    """``("body", "command", "commandId")`` -> ``command.commandId``; ``("query", "limit")`` ->
    ``limit``. Pydantic already names fields by their aliases, as the client sent them."""
    parts = [str(part) for part in loc[1:]] if loc else []
    if not parts or (len(loc) == 2 and isinstance(loc[1], int)):
        return "body"  # the body as a whole: missing, or not JSON (the loc ends in an offset)
    return ".".join(parts)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own answers (an unknown route, a wrong method), in our model."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # FastAPI's answer to a body it cannot read at all (not UTF-8, a broken form): an
        # invalid body like any other, so the same 422 on the field "body".
        return _answer(422, "invalid_request", f"invalid request: {exc.detail}", field="body")
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _answer(exc.status_code, code, str(exc.detail), headers=exc.headers)


def install_error_handlers(api: FastAPI) -> None:
    """Answer every error in :class:`ErrorResponse`."""
    api.add_exception_handler(RequestValidationError, _validation_error)
    api.add_exception_handler(StarletteHTTPException, _http_error)
    api.add_exception_handler(RhumbatronError, _rhumbatron_error)
    api.add_exception_handler(sqlite3.Error, _sqlite_error)
    api.add_exception_handler(Exception, _unexpected)


# -- OpenAPI -----------------------------------------------------------------------------------

_DESCRIPTIONS = {
    401: "No bearer token, or an expired or invalid one.",
    403: "The token lacks the operation's scope (named in the message).",
    404: "No such record for this tenant.",
    409: "The dead letter is already closed, or cannot be retried (a poison event).",
    422: "The request is invalid; `field` names the first bad field.",
    503: "NATS is down, or the product database is busy or full: retry after Retry-After.",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "The Bearer challenge (RFC 6750).",
            "required": True,
            "schema": {"type": "string"},
        }
    },
    403: {
        "WWW-Authenticate": {
            "description": 'Bearer error="insufficient_scope" with the scope needed.',
            "required": True,
            "schema": {"type": "string"},
        }
    },
    503: {
        "Retry-After": {
            "description": "Seconds to wait before trying again.",
            "required": True,
            "schema": {"type": "integer"},
        }
    },
}


def error_responses(*statuses: int, **meaning: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of ``statuses``, each with :class:`ErrorResponse`.

    ``meaning`` gives an operation its own wording of a status (``e404="No such ..."``):
    the shared descriptions speak of dead letters.
    """
    wording = {int(key.removeprefix("e")): text for key, text in meaning.items()}
    return {
        status: {
            "model": ErrorResponse,
            "description": wording.get(status, _DESCRIPTIONS[status]),
            **({"headers": _HEADERS[status]} if status in _HEADERS else {}),
        }
        for status in statuses
    }
