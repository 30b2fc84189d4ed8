"""The audit log: every mutation an operator (a person or an agent) asked of the API.

One row per mutating request that reached an operation — who (the token's subject and
tenant; none when the token did not verify), what (the operation and the path parameters
it named), when, and the outcome (``succeeded``, ``refused`` with the error model's code,
or ``failed``). Request bodies are never kept: a subscription's body carries its webhook
secret. Rows are kept ``audit_retention_days`` (365) and pruned by the daily maintenance.

Read with ``GET /audit`` (scope ``audit:read``): a tenant's token sees its tenant's rows,
a platform token every row.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "AUDIT_SCHEMA",
    "AuditEntry",
    "AuditOutcome",
    "list_audit",
    "outcome_of_status",
    "prune_audit",
    "record_audit",
]

AUDIT_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_log (
    audit_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    at_s        REAL NOT NULL,
    principal   TEXT,
    tenant_id   TEXT,
    operation   TEXT NOT NULL,
    method      TEXT NOT NULL,
    path        TEXT NOT NULL,
    target      TEXT NOT NULL DEFAULT '{}',
    status_code INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    error_code  TEXT
);
CREATE INDEX IF NOT EXISTS audit_log_tenant ON audit_log (tenant_id, audit_id);
CREATE INDEX IF NOT EXISTS audit_log_age ON audit_log (at_s);
"""


class AuditOutcome(StrEnum):
    SUCCEEDED = "succeeded"  # 2xx
    REFUSED = "refused"  # 4xx: the request, its caller or the state said no
    FAILED = "failed"  # 5xx: the platform could not do it now


def outcome_of_status(status_code: int) -> AuditOutcome:
    if status_code < 400:
        return AuditOutcome.SUCCEEDED
    return AuditOutcome.REFUSED if status_code < 500 else AuditOutcome.FAILED


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audited request."""

    audit_id: int
    at_s: float
    principal: str | None
    tenant_id: str | None
    operation: str
    method: str
    path: str
    target: Mapping[str, str]
    status_code: int
    outcome: AuditOutcome
    error_code: str | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> AuditEntry:
        return cls(
            audit_id=int(row["audit_id"]),
            at_s=float(row["at_s"]),
            principal=row["principal"],
            tenant_id=row["tenant_id"],
            operation=str(row["operation"]),
            method=str(row["method"]),
            path=str(row["path"]),
            target=json.loads(row["target"]),
            status_code=int(row["status_code"]),
            outcome=AuditOutcome(row["outcome"]),
            error_code=row["error_code"],
        )


def record_audit(
    connection: sqlite3.Connection,
    *,
    at_s: float,
    principal: str | None,
    tenant_id: str | None,
    operation: str,
    method: str,
    path: str,
    target: Mapping[str, Any],
    status_code: int,
    error_code: str | None = None,
) -> int:
    """Write one row; returns its ID."""
    cursor = connection.execute(
        "INSERT INTO audit_log (at_s, principal, tenant_id, operation, method, path, target, "
        "status_code, outcome, error_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            at_s,
            principal,
            tenant_id,
            operation,
            method,
            path,
            json.dumps({k: str(v) for k, v in target.items()}, sort_keys=True),
            status_code,
            outcome_of_status(status_code).value,
            error_code,
        ),
    )
    return int(cursor.lastrowid or 0)


def list_audit(
    connection: sqlite3.Connection,
    *,
    tenant_id: str | None = None,
    operation: str | None = None,
    principal: str | None = None,
    outcome: AuditOutcome | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """Rows, newest first, filtered (``tenant_id`` None: every tenant's); ``before`` is the
    last ID of the previous page."""
    clauses: list[str] = []
    params: list[object] = []
    for column, value in (
        ("tenant_id", tenant_id),
        ("operation", operation),
        ("principal", principal),
        ("outcome", outcome.value if outcome else None),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if before is not None:
        clauses.append("audit_id < ?")
        params.append(before)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = connection.execute(
        f"SELECT * FROM audit_log {where} ORDER BY audit_id DESC LIMIT ?", [*params, limit]
    ).fetchall()
    return [AuditEntry.from_row(row) for row in rows]


def prune_audit(connection: sqlite3.Connection, *, older_than_s: float, limit: int) -> int:
    """Delete at most ``limit`` rows written before ``older_than_s``; returns how many."""
    return connection.execute(
        "DELETE FROM audit_log WHERE audit_id IN (SELECT audit_id FROM audit_log "
        "WHERE at_s < ? ORDER BY audit_id LIMIT ?)",
        (older_than_s, limit),
    ).rowcount
