"""The agent registry: which Agents exist, of which kind, and how a webhook Agent is called.

A ``scripted`` Agent runs in process; a ``webhook`` Agent is an external service woken by a
signed POST to its URL (:mod:`rhumbatron.agents.webhook`). The registry lives in the product
database (``AGENTS_SCHEMA``). Registering is idempotent: the same values again change
nothing, so a deployment script can register on every run.

Agent IDs are a tenant's own: the key is ``(tenant_id, agent_id)``, and every call names the
tenant. Two tenants may each register ``agent-7``; neither sees, replaces or wakes the other's
(a Task naming ``agent-7`` wakes the ``agent-7`` of its project's tenant). A file made when
the ID was global is rebuilt at open by :func:`migrate_agents` (issue #21).

Secrets rotate without a gap: :meth:`AgentRegistry.rotate_secret` puts a new secret first
and keeps the previous one, so every wake is signed with both while the receiver switches;
:meth:`AgentRegistry.drop_old_secret` ends the rotation. An Agent never holds more than two.
"""

from __future__ import annotations

import builtins
import json
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.agents.signing import generate_secret, parse_secret
from rhumbatron.agents.url_safety import check_webhook_url
from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import AgentNotFoundError, AgentRegistryError
from rhumbatron.protocol.values import AGENT_ID

__all__ = [
    "AGENTS_SCHEMA",
    "AGENT_ID_PATTERN",
    "MAX_SECRETS",
    "AgentKind",
    "AgentRecord",
    "AgentRegistry",
    "migrate_agents",
]

_AGENTS_COLUMNS = """
    tenant_id  TEXT NOT NULL,
    agent_id   TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('scripted', 'webhook')),
    url        TEXT,
    secrets    TEXT NOT NULL DEFAULT '[]',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, agent_id)
"""
#: One row per (tenant, agent): an agent ID names an Agent only within its tenant.
AGENTS_SCHEMA = f"CREATE TABLE IF NOT EXISTS agents ({_AGENTS_COLUMNS});"

#: :data:`~rhumbatron.protocol.values.AGENT_ID` without its anchors, for ``fullmatch``:
#: Python's ``$`` also matches before a final newline.
AGENT_ID_PATTERN = re.compile(AGENT_ID.removeprefix("^").removesuffix("$"))
#: The current secret and, during a rotation, the previous one.
MAX_SECRETS = 2


class AgentKind(StrEnum):
    SCRIPTED = "scripted"
    WEBHOOK = "webhook"


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """One ``agents`` row. ``secrets`` is newest first and kept out of ``repr``."""

    agent_id: str
    tenant_id: str
    kind: AgentKind
    url: str | None
    secrets: tuple[str, ...] = field(repr=False)
    created_at: datetime
    updated_at: datetime


class AgentRegistry:
    """Registers Agents in ``store`` (the product database, which holds ``AGENTS_SCHEMA``).

    Every method names the tenant first: an agent ID means nothing without it.
    """

    def __init__(self, store: SqliteStore, settings: Settings, clock: Clock) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock

    def register_scripted(self, tenant_id: str, agent_id: str) -> AgentRecord:
        """Register (or turn into) a scripted Agent; the same values again are a no-op."""
        _check_ids(tenant_id, agent_id)
        return self._upsert(tenant_id, agent_id, AgentKind.SCRIPTED, None, None)

    def register_webhook(
        self, tenant_id: str, agent_id: str, url: str, secrets: Sequence[str] | None = None
    ) -> AgentRecord:
        """Register (or update) the tenant's webhook Agent called at ``url``.

        The URL must pass :func:`~rhumbatron.agents.url_safety.check_webhook_url`. Without
        ``secrets``, an Agent already registered keeps its secrets and a new one gets a
        generated secret (read it from the returned record and give it to the receiver).
        Given ``secrets`` (newest first, at most two) replace the registered ones.
        """
        _check_ids(tenant_id, agent_id)
        # Resolved here, outside the transaction: DNS may be slow and must not hold the file.
        check_webhook_url(url, self._settings.webhook_allowed_hosts)
        wanted = None if secrets is None else _checked_secrets(agent_id, secrets)
        return self._upsert(tenant_id, agent_id, AgentKind.WEBHOOK, url, wanted)

    def rotate_secret(self, tenant_id: str, agent_id: str) -> str:
        """Add a new secret in front and keep the previous one; return the new secret.

        Wakes are then signed with both until :meth:`drop_old_secret`. Rotating again during
        a rotation drops the oldest, so at most two are ever valid.
        """
        new = generate_secret()
        with self._store.transaction() as connection:
            record = self._webhook(connection, tenant_id, agent_id, "rotate its secret")
            self._write_secrets(connection, record, (new, *record.secrets)[:MAX_SECRETS])
        return new

    def drop_old_secret(self, tenant_id: str, agent_id: str) -> AgentRecord:
        """End a rotation: keep only the newest secret (a no-op when there is one)."""
        with self._store.transaction() as connection:
            record = self._webhook(connection, tenant_id, agent_id, "drop its old secret")
            if len(record.secrets) <= 1:
                return record
            return self._write_secrets(connection, record, record.secrets[:1])

    def get(self, tenant_id: str, agent_id: str) -> AgentRecord | None:
        """The tenant's Agent ``agent_id``, or None when the tenant has none of that ID
        (whether another tenant has one is not this tenant's business)."""
        return _read(self._store.connection, tenant_id, agent_id)

    def list(self, tenant_id: str) -> builtins.list[AgentRecord]:
        """The tenant's Agents, ordered by ID."""
        rows = self._store.connection.execute(
            "SELECT * FROM agents WHERE tenant_id = ? ORDER BY agent_id", (tenant_id,)
        )
        return [_record(row) for row in rows.fetchall()]

    def _upsert(
        self,
        tenant_id: str,
        agent_id: str,
        kind: AgentKind,
        url: str | None,
        secrets: tuple[str, ...] | None,
    ) -> AgentRecord:
        now = self._clock.now()
        with self._store.transaction() as connection:
            current = _read(connection, tenant_id, agent_id)
            if kind is AgentKind.SCRIPTED:
                secrets = ()
            elif secrets is None:
                if current is not None and current.kind is AgentKind.WEBHOOK:
                    secrets = current.secrets
                else:
                    secrets = (generate_secret(),)
            wanted = AgentRecord(
                agent_id=agent_id,
                tenant_id=tenant_id,
                kind=kind,
                url=url,
                secrets=secrets,
                created_at=current.created_at if current else now,
                updated_at=current.updated_at if current else now,
            )
            if wanted == current:
                return current
            record = wanted if current is None else replace(wanted, updated_at=now)
            connection.execute(
                "INSERT INTO agents (tenant_id, agent_id, kind, url, secrets, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant_id, agent_id) "
                "DO UPDATE SET kind = excluded.kind, url = excluded.url, "
                "secrets = excluded.secrets, updated_at = excluded.updated_at",
                (
                    record.tenant_id,
                    record.agent_id,
                    record.kind.value,
                    record.url,
                    json.dumps(builtins.list(record.secrets)),
                    record.created_at.isoformat(),
                    record.updated_at.isoformat(),
                ),
            )
            return record

    def _webhook(
        self, connection: sqlite3.Connection, tenant_id: str, agent_id: str, doing: str
    ) -> AgentRecord:
        record = _read(connection, tenant_id, agent_id)
        if record is None:
            raise AgentNotFoundError(
                f"tenant {tenant_id!r} has no agent {agent_id!r}; register it before you {doing}"
            )
        if record.kind is not AgentKind.WEBHOOK:
            raise AgentRegistryError(
                f"agent {agent_id!r} is {record.kind.value}, not webhook; only a webhook agent "
                f"has secrets, so it cannot {doing}"
            )
        return record

    def _write_secrets(
        self, connection: sqlite3.Connection, record: AgentRecord, secrets: tuple[str, ...]
    ) -> AgentRecord:
        updated = replace(record, secrets=secrets, updated_at=self._clock.now())
        connection.execute(
            "UPDATE agents SET secrets = ?, updated_at = ? WHERE tenant_id = ? AND agent_id = ?",
            (
                json.dumps(builtins.list(secrets)),
                updated.updated_at.isoformat(),
                record.tenant_id,
                record.agent_id,
            ),
        )
        return updated


def migrate_agents(connection: sqlite3.Connection) -> None:
    """Bring an ``agents`` table keyed by ``agent_id`` alone (one namespace across tenants)
    up to the ``(tenant_id, agent_id)`` key; a current table is left as it is.

    SQLite cannot change a primary key: sqlite-utils' ``transform`` copies the rows into a
    table of the current shape (its columns' constraints, CHECK included, kept), which then
    takes the old one's name — inside the caller's (schema) transaction, which ``transform``
    joins (sqlite-utils 4), so a crash leaves either table whole. Every row keeps its
    tenant: under the old key no two rows shared an agent ID, so none collide under the new
    one.
    """
    import sqlite_utils

    keyed = {row[1]: row[5] for row in connection.execute("PRAGMA table_info(agents)")}
    if not keyed or keyed.get("tenant_id"):
        return  # no table yet (the schema creates it), or tenant_id is in the key already
    sqlite_utils.Database(connection).table("agents").transform(
        pk=("tenant_id", "agent_id"), column_order=["tenant_id", "agent_id"]
    )
    # transform keeps the old table's indexes: the old shape's by-tenant index is the new
    # key's prefix, so it only costs writes.
    connection.execute("DROP INDEX IF EXISTS agents_by_tenant")


def _check_ids(tenant_id: str, agent_id: str) -> None:
    if not AGENT_ID_PATTERN.fullmatch(agent_id):
        raise AgentRegistryError(
            f"agent ID {agent_id[:120]!r} is invalid: use 1 to 100 characters of "
            "A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
        )
    if not tenant_id.strip():
        raise AgentRegistryError(f"agent {agent_id!r} needs a tenant ID, got {tenant_id!r}")


def _checked_secrets(agent_id: str, secrets: Sequence[str]) -> tuple[str, ...]:
    wanted = tuple(secrets)
    if not 1 <= len(wanted) <= MAX_SECRETS:
        raise AgentRegistryError(
            f"agent {agent_id!r}: give 1 or {MAX_SECRETS} secrets (newest first), not "
            f"{len(wanted)}; or none to keep or generate one"
        )
    if len(set(wanted)) != len(wanted):
        raise AgentRegistryError(f"agent {agent_id!r}: the same secret is given twice")
    for secret in wanted:
        parse_secret(secret)  # raises WebhookSecretError, which never shows the secret
    return wanted


def _read(connection: sqlite3.Connection, tenant_id: str, agent_id: str) -> AgentRecord | None:
    row = connection.execute(
        "SELECT * FROM agents WHERE tenant_id = ? AND agent_id = ?", (tenant_id, agent_id)
    ).fetchone()
    return None if row is None else _record(row)


def _record(row: sqlite3.Row) -> AgentRecord:
    return AgentRecord(
        agent_id=row["agent_id"],
        tenant_id=row["tenant_id"],
        kind=AgentKind(row["kind"]),
        url=row["url"],
        secrets=tuple(json.loads(row["secrets"])),
        created_at=datetime.fromisoformat(row["created_at"]),
        updated_at=datetime.fromisoformat(row["updated_at"]),
    )
