"""``GET /audit``: the audit log, newest first (:mod:`rhumbatron.product.audit`)."""

from typing import Annotated

from fastapi import APIRouter, Query

from rhumbatron import operator
from rhumbatron.api.audit_schemas import AuditEntryBody, AuditPageBody
from rhumbatron.api.dependencies import AuditReader, Runtime
from rhumbatron.api.routes._presets import base_errors
from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.errors import InvalidRequestError
from rhumbatron.product.audit import AuditOutcome, list_audit

__all__ = ["router"]

router = APIRouter()


@router.get(
    "/audit",
    response_model=AuditPageBody,
    summary="Read the audit log",
    responses=base_errors(),
)
async def read_audit(
    *,
    runtime: Runtime,
    principal: AuditReader,
    operation: Annotated[
        str | None, Query(max_length=100, description="Only this operation ID.")
    ] = None,
    by: Annotated[
        str | None, Query(max_length=200, description="Only this principal (token subject).")
    ] = None,
    outcome: Annotated[AuditOutcome | None, Query()] = None,
    tenant_id: Annotated[
        str | None,
        Query(alias="tenantId", max_length=64, description="Only this tenant (a platform token)."),
    ] = None,
    before: Annotated[int | None, Query(ge=1, description="The previous page's next.")] = None,
    limit: Annotated[int, Query(ge=1, le=operator.MAX_PAGE)] = 50,
) -> AuditPageBody:
    """Every mutation asked of the API — who, what, when, and the outcome — newest first.
    A tenant's token reads its tenant's rows; a platform token every row, or one tenant's
    with ``tenantId``. Page with ``before``: the ``next`` of the previous page."""
    tenant = principal.tenant_scope
    if tenant_id is not None:
        if principal.tenant_id not in (ANY_TENANT, tenant_id):
            raise InvalidRequestError(
                f"tenantId {tenant_id!r} is not this token's tenant {principal.tenant_id!r}; "
                "only a platform token reads another tenant's audit",
                field="tenantId",
            )
        tenant = tenant_id
    entries = list_audit(
        runtime.product().connection,
        tenant_id=tenant,
        operation=operation,
        principal=by,
        outcome=outcome,
        before=before,
        limit=limit + 1,
    )
    page = entries[:limit]
    return AuditPageBody(
        items=[AuditEntryBody.of(e) for e in page],
        next=page[-1].audit_id if len(entries) > limit else None,
    )
