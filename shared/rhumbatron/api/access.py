"""Whom a caller may act for: its own tenant, a project's owner, itself as an actor.

Tenancy fails closed: every route under ``/projects/{projectId}`` first finds the project's
owner (:func:`project_owner`), and a project that does not exist and a project of another
tenant are the same 404. A platform token (tenant ``*``) may act on every tenant's projects,
as the facts' tenant is always the project's owner; it owns nothing, so it cannot create a
project, an agent, a subscription or a schedule (:func:`own_tenant`). Agent IDs are a
tenant's own too: a Change, a callback and a registration consult only the tenant's agents,
so no answer says whether another tenant has an agent of some ID.
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING

from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import ForbiddenError, ProjectNotFoundError

if TYPE_CHECKING:
    from rhumbatron.api.auth import Principal
    from rhumbatron.api.ports import ApiRuntime

__all__ = ["api_caller", "own_tenant", "project_owner"]

_SPACE = re.compile(r"\s+")


def own_tenant(principal: Principal, doing: str) -> str:
    """The caller's tenant, which will own what it creates; a platform token owns nothing."""
    if principal.tenant_id == ANY_TENANT:
        raise ForbiddenError(
            f"a platform token (tenant {ANY_TENANT!r}) acts for every tenant and owns nothing; "
            f"use a tenant's token to {doing}",
            code="tenant_required",
        )
    return principal.tenant_id


def project_owner(app: ApiRuntime, principal: Principal, project_id: str) -> str:
    """The project's tenant, when the caller may see the project; 404 otherwise — the same
    answer for a project that does not exist and one of another tenant."""
    owner = app.project_tenant(project_id)
    if owner is None or principal.tenant_id not in (ANY_TENANT, owner):
        raise ProjectNotFoundError(f"no project {project_id!r}; check the project ID")
    return owner


def api_caller(principal: Principal, tenant: str, correlation_id: str) -> Caller:
    """A person calling through the API: ``user:<subject>``, never another kind of actor
    (a token whose subject says ``agent:x`` must not pass for that Agent's own writes)."""
    subject = _SPACE.sub("_", principal.subject)[:200] or "unknown"
    return Caller(tenant, f"user:{subject}", correlation_id or f"api_{uuid.uuid4().hex}")
