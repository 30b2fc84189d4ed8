"""The API's span: each mutating request runs in a span, so what it writes and sends carries
its ``traceparent`` (see :mod:`rhumbatron.core.tracing`).

A valid incoming ``traceparent`` is the span's parent (the caller's trace goes on); an absent
or invalid one starts a new trace, and never fails the request. A Change the request writes
is stamped with the Change's own trace (its ID is computed from the project and the Change,
not taken from the caller), with this span as parent — so the Change's timeline starts at
this request, and a timer's hop of the same Change, days later with no header, lands in the
same trace. The caller's header is kept on the span as its link.

A pure ASGI middleware, as the others: it sees the request before any route and the route's
path template after it, and reads methods that change nothing not at all (the dashboard
polls every 2 s; a span per poll would bury the Changes' spans).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from rhumbatron.api.audit_trail import MUTATING_METHODS
from rhumbatron.core.tracing import span
from rhumbatron.protocol.tracecontext import TraceContext

__all__ = ["TraceRequests"]

_HEADER = b"traceparent"


class TraceRequests:
    """Run each mutating request in a span named ``api <METHOD> <route path>``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING_METHODS:
            await self.app(scope, receive, send)
            return
        incoming = next(
            (value.decode("latin-1") for name, value in scope["headers"] if name == _HEADER),
            None,
        )
        parent = TraceContext.parse(incoming)
        method = scope["method"]
        with span(
            f"api {method} {scope.get('path', '')}",
            parent=parent,
            link=parent.header if parent is not None else None,
        ) as request:
            try:
                await self.app(scope, receive, send)
            finally:
                route = scope.get("route")
                if route is not None and hasattr(route, "path"):
                    request.name = f"api {method} {route.path}"
