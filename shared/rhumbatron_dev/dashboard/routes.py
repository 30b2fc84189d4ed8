"""The dashboard's routes under ``/dashboard``, mounted by ``rhumbatron up`` next to the API.

The cloud API never mounts them: in the cloud the dashboard is CloudWatch's. Locally,

* ``GET /dashboard`` is the page, with the run's API token written in;
* ``GET /dashboard/dashboard.js`` is its script;
* ``GET /dashboard/api/summary``, ``GET /dashboard/api/feed?project=`` and
  ``GET /dashboard/api/trace?project=&change=`` (a Change's spans, :mod:`.trace`) are its
  data, for a bearer token of every tenant with ``dead-letters:read`` (the page sends the
  run's token).

The page's Retry and Dismiss call the API's own ``POST /dead-letters/{id}/retry`` and
``/dismiss``; the dashboard adds no write route.

Every route answers only requests whose ``Host`` is one of ``allowed_hosts`` (the loopback
names of the server's port): a page of another site that rebinds its DNS name to 127.0.0.1
would otherwise be same-origin with the dashboard and could read the token from it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from rhumbatron.api.auth import SCOPE_DEAD_LETTERS_READ, Authenticator, Principal
from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.errors import ApiError, AuthenticationError, PermissionDeniedError
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN
from rhumbatron.protocol.values import IDENTIFIER
from rhumbatron.runtime.bootstrap import Rhumbatron
from rhumbatron_dev.dashboard.page import DASHBOARD_SCRIPT, render_page
from rhumbatron_dev.dashboard.stats import LocalRunStats
from rhumbatron_dev.dashboard.summary import FEED_DEFAULT, FEED_MAX, collect_summary, project_feed
from rhumbatron_dev.dashboard.trace import change_trace

__all__ = ["DashboardForbiddenError", "dashboard_router"]

#: The page holds a token: no caching, no referrer, no framing, scripts from itself only.
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
}


class DashboardForbiddenError(ApiError):
    """403: a request for another host name, or a token bound to one tenant (the dashboard
    shows every tenant's data)."""

    status_code = 403
    default_code = "forbidden"


def dashboard_router(
    app: Rhumbatron,
    *,
    token: str,
    auth: Authenticator,
    allowed_hosts: Collection[str],
    stats: LocalRunStats | None = None,
) -> APIRouter:
    """The ``/dashboard`` routes over ``app`` (the API's runtime), serving ``token`` in the
    page; ``stats`` are the local roles' counters (None shows no roles)."""
    hosts = frozenset(host.lower() for host in allowed_hosts)

    async def loopback_only(request: Request) -> None:
        host = request.headers.get("host", "").lower()
        if host not in hosts:
            raise DashboardForbiddenError(
                f"the dashboard answers only Host {', '.join(sorted(hosts))}, not {host!r}; "
                "open it by the address `rhumbatron up` printed"
            )

    async def reader(request: Request) -> Principal:
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise AuthenticationError(
                "the dashboard's data needs an Authorization: Bearer <token> header (the page "
                "sends the token `rhumbatron up` printed)",
                code="missing_token",
            )
        principal = auth.authenticate(credentials.strip())
        if SCOPE_DEAD_LETTERS_READ not in principal.scopes:
            raise PermissionDeniedError(
                SCOPE_DEAD_LETTERS_READ, tenant=principal.tenant_id, has=principal.scopes
            )
        if principal.tenant_id != ANY_TENANT:
            raise DashboardForbiddenError(
                f"the dashboard shows every tenant's data; the token is bound to tenant "
                f"{principal.tenant_id!r}: use the token `rhumbatron up` printed"
            )
        return principal

    router = APIRouter(
        prefix="/dashboard", dependencies=[Depends(loopback_only)], include_in_schema=False
    )
    # The reader is a route dependency, not a parameter: under postponed annotations FastAPI
    # cannot resolve an Annotated alias local to this function.
    readers = [Depends(reader)]

    @router.get("", response_class=HTMLResponse)
    @router.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(render_page(token), headers=_PAGE_HEADERS)

    @router.get("/dashboard.js")
    async def script() -> Response:
        return Response(
            DASHBOARD_SCRIPT,
            media_type="text/javascript",
            headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
        )

    # async def on purpose, as the API's routes: the product and actor files are read on
    # the event loop, never beside another transaction on a worker thread.
    @router.get("/api/summary", dependencies=readers)
    async def summary() -> dict[str, Any]:
        return await collect_summary(app, stats)

    @router.get("/api/feed", dependencies=readers)
    async def feed(
        project: Annotated[
            str | None, Query(pattern=PROJECT_ID_PATTERN.pattern, description="A project ID.")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=FEED_MAX)] = FEED_DEFAULT,
    ) -> dict[str, Any]:
        return project_feed(app, project, limit)

    @router.get("/api/trace", dependencies=readers)
    async def trace(
        project: Annotated[
            str | None, Query(pattern=PROJECT_ID_PATTERN.pattern, description="A project ID.")
        ] = None,
        change: Annotated[str | None, Query(pattern=IDENTIFIER, description="A Change ID.")] = None,
    ) -> dict[str, Any]:
        return change_trace(app, project, change)

    return router
