"""The audit trail: every mutating request that reached an operation, written to the audit
log (:mod:`rhumbatron.product.audit`) once its answer is sent.

An ASGI middleware outside every route, so an operation cannot forget it: it sees the
method, the operation the router matched (its operation ID) and the path parameters it
named, the caller :func:`~rhumbatron.api.dependencies.get_principal` authenticated (none
when the token did not verify), the status, and for a refusal the error model's ``code``.
It keeps no request body (a subscription's carries its webhook secret).

The row is written on the event loop after the answer went out, as the routes write the
product database (see :mod:`rhumbatron.api.app`); a row that cannot be written (the file
busy past its timeout) is logged with everything it would have held, and the answer stands.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from rhumbatron.product.audit import record_audit

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from rhumbatron.api.auth import Principal
    from rhumbatron.api.ports import ApiRuntime

__all__ = ["MUTATING_METHODS", "PRINCIPAL_STATE_KEY", "AuditTrail"]

_log = logging.getLogger(__name__)

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Where ``get_principal`` leaves the authenticated caller in the request's state.
PRINCIPAL_STATE_KEY = "audit_principal"
#: A refusal's body is read for its error code up to this many bytes (the error model's
#: bodies are far smaller).
_ERROR_BODY_LIMIT = 16_384


class AuditTrail:
    """Records each mutating request that reached an operation (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING_METHODS:
            await self.app(scope, receive, send)
            return
        status = 500  # an answer that never started is the platform's failure
        error_body = bytearray()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif (
                message["type"] == "http.response.body"
                and status >= 400
                and len(error_body) < _ERROR_BODY_LIMIT
            ):
                error_body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            if route is not None:  # an operation was reached (not an unknown path)
                _write(scope, getattr(route, "name", str(route)), status, bytes(error_body))


def _write(scope: Scope, operation: str, status: int, error_body: bytes) -> None:
    runtime: ApiRuntime = scope["app"].state.rhumbatron
    principal: Principal | None = scope.get("state", {}).get(PRINCIPAL_STATE_KEY)
    entry: dict[str, Any] = {
        "at_s": runtime.clock.now().timestamp(),
        "principal": principal.subject if principal else None,
        "tenant_id": principal.tenant_id if principal else None,
        "operation": operation,
        "method": scope["method"],
        "path": scope["path"],
        "target": dict(scope.get("path_params") or {}),
        "status_code": status,
        "error_code": _error_code(error_body) if status >= 400 else None,
    }
    try:
        with runtime.product().transaction() as db:
            record_audit(db, **entry)
    except Exception as exc:  # the answer went out: the log keeps what the row would have
        _log.error("cannot write the audit row %s: %s", entry, exc)


def _error_code(body: bytes) -> str | None:
    """The error model's ``code`` of a refusal's body, if it is one."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code is not None else None
