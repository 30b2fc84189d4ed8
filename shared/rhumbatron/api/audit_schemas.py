"""The audit log's response bodies: frozen pydantic models, camelCase on the wire, like
:mod:`rhumbatron.api.schemas`."""

from datetime import UTC, datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.product.audit import AuditEntry, AuditOutcome

__all__ = ["AuditEntryBody", "AuditPageBody"]


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class AuditEntryBody(_Wire):
    """One mutation asked of the API, and what came of it."""

    id: int = Field(description="The row's ID; pass the last as `before` for older rows.")
    at: AwareDatetime = Field(description="When the answer was sent.")
    principal: str | None = Field(description="The token's subject; null: it did not verify.")
    tenant_id: str | None = Field(description='The token\'s tenant ("*": the platform).')
    operation: str = Field(description="The operation ID (retry_dead_letter, send_command …).")
    method: str
    path: str = Field(description="The path as requested.")
    target: dict[str, str] = Field(description="The path parameters: what it acted on.")
    status: int = Field(description="The HTTP status of the answer.")
    outcome: AuditOutcome = Field(description="succeeded (2xx), refused (4xx), failed (5xx).")
    error_code: str | None = Field(description="The error model's code of a refusal.")

    @classmethod
    def of(cls, entry: AuditEntry) -> "AuditEntryBody":
        return cls(
            id=entry.audit_id,
            at=datetime.fromtimestamp(entry.at_s, UTC),
            principal=entry.principal,
            tenant_id=entry.tenant_id,
            operation=entry.operation,
            method=entry.method,
            path=entry.path,
            target=dict(entry.target),
            status=entry.status_code,
            outcome=entry.outcome,
            error_code=entry.error_code,
        )


class AuditPageBody(_Wire):
    """A page of the audit log, newest first."""

    items: list[AuditEntryBody]
    next: int | None = Field(
        default=None, description="Pass as `before` for the next (older) page; null: the last."
    )
