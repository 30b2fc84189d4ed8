"""The agent registry: which Agents exist, of which kind, and how a webhook Agent is called.

A ``scripted`` Agent runs in process; a ``webhook`` Agent is an external service woken by a
signed POST to its URL (:mod:`rhumbatron.agents.webhook`). The registry lives in the product
database (``AGENTS_SCHEMA``). Registering is idempotent: the same values again change
nothing, so a deployment script can register on every run.

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
from rhumbatron.errors import RhumbatronError
from rhumbatron.runtime.clock import Clock
from rhumbatron.runtime.settings import Settings

__all__ = [
    "AGENTS_SCHEMA",
    "AGENT_ID_PATTERN",
    "MAX_SECRETS",
    "AgentKind",
    "AgentNotFoundError",
    "AgentRecord",
    "AgentRegistry",
    "AgentRegistryError",
]

AGENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS agents (
    agent_id   TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('scripted', 'webhook')),
    url        TEXT,
    secrets    TEXT NOT NULL DEFAULT '[]',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS agents_by_tenant ON agents (tenant_id, agent_id);
"""

#: Used with fullmatch: "^...$" would let a trailing newline through.
AGENT_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,100}")
#: The current secret and, during a rotation, the previous one.
MAX_SECRETS = 2


class AgentRegistryError(RhumbatronError, ValueError):
    """A registration or rotation that cannot be done; the message names the value."""


class AgentNotFoundError(AgentRegistryError, LookupError):
    """No Agent with that ID is registered."""


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
    """Registers Agents in ``store`` (the product database, which holds ``AGENTS_SCHEMA``)."""

    def __init__(self, store: SqliteStore, settings: Settings, clock: Clock) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock

    def register_scripted(self, agent_id: str, tenant_id: str) -> AgentRecord:
        """Register (or turn into) a scripted Agent; the same values again are a no-op."""
        _check_ids(agent_id, tenant_id)
        return self._upsert(agent_id, tenant_id, AgentKind.SCRIPTED, None, None)

    def register_webhook(
        self, agent_id: str, tenant_id: str, url: str, secrets: Sequence[str] | None = None
    ) -> AgentRecord:
        """Register (or update) a webhook Agent called at ``url``.

        The URL must pass :func:`~rhumbatron.agents.url_safety.check_webhook_url`. Without
        ``secrets``, an Agent already registered keeps its secrets and a new one gets a
        generated secret (read it from the returned record and give it to the receiver).
        Given ``secrets`` (newest first, at most two) replace the registered ones.
        """
        _check_ids(agent_id, tenant_id)
        # Resolved here, outside the transaction: DNS may be slow and must not hold the file.
        check_webhook_url(url, self._settings.webhook_allowed_hosts)
        wanted = None if secrets is None else _checked_secrets(agent_id, secrets)
        return self._upsert(agent_id, tenant_id, AgentKind.WEBHOOK, url, wanted)

    def rotate_secret(self, agent_id: str) -> str:
        """Add a new secret in front and keep the previous one; return the new secret.

        Wakes are then signed with both until :meth:`drop_old_secret`. Rotating again during
        a rotation drops the oldest, so at most two are ever valid.
        """
        new = generate_secret()
        with self._store.transaction() as connection:
            record = self._webhook(connection, agent_id, "rotate its secret")
            self._write_secrets(connection, record, (new, *record.secrets)[:MAX_SECRETS])
        return new

    def drop_old_secret(self, agent_id: str) -> AgentRecord:
        """End a rotation: keep only the newest secret (a no-op when there is one)."""
        with self._store.transaction() as connection:
            record = self._webhook(connection, agent_id, "drop its old secret")
            if len(record.secrets) <= 1:
                return record
            return self._write_secrets(connection, record, record.secrets[:1])

    def get(self, agent_id: str) -> AgentRecord | None:
        """The Agent ``agent_id``, or None when it is not registered."""
        return _read(self._store.connection, agent_id)

    def list(self, tenant_id: str | None = None) -> builtins.list[AgentRecord]:
        """Every Agent (of ``tenant_id`` when given), ordered by ID."""
        if tenant_id is None:
            rows = self._store.connection.execute("SELECT * FROM agents ORDER BY agent_id")
        else:
            rows = self._store.connection.execute(
                "SELECT * FROM agents WHERE tenant_id = ? ORDER BY agent_id", (tenant_id,)
            )
        return [_record(row) for row in rows.fetchall()]

    def _upsert(
        self,
        agent_id: str,
        tenant_id: str,
        kind: AgentKind,
        url: str | None,
        secrets: tuple[str, ...] | None,
    ) -> AgentRecord:
        now = self._clock.now()
        with self._store.transaction() as connection:
            current = _read(connection, agent_id)
            if current is not None and current.tenant_id != tenant_id:
                # An Agent ID is global; letting another tenant take it over would send its
                # wakes, and their Task IDs, to that tenant's URL.
                raise AgentRegistryError(
                    f"agent {agent_id!r} is registered for tenant {current.tenant_id!r}, not "
                    f"{tenant_id!r}; choose another agent ID"
                )
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
                "INSERT INTO agents (agent_id, tenant_id, kind, url, secrets, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (agent_id) DO UPDATE SET "
                "kind = excluded.kind, url = excluded.url, secrets = excluded.secrets, "
                "updated_at = excluded.updated_at",
                (
                    record.agent_id,
                    record.tenant_id,
                    record.kind.value,
                    record.url,
                    json.dumps(builtins.list(record.secrets)),
                    record.created_at.isoformat(),
                    record.updated_at.isoformat(),
                ),
            )
            return record

    def _webhook(self, connection: sqlite3.Connection, agent_id: str, doing: str) -> AgentRecord:
        record = _read(connection, agent_id)
        if record is None:
            raise AgentNotFoundError(
                f"agent {agent_id!r} is not registered; register it before you {doing}"
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
            "UPDATE agents SET secrets = ?, updated_at = ? WHERE agent_id = ?",
            (json.dumps(builtins.list(secrets)), updated.updated_at.isoformat(), record.agent_id),
        )
        return updated


def _check_ids(agent_id: str, tenant_id: str) -> None:
    if not AGENT_ID_PATTERN.fullmatch(agent_id):
        raise AgentRegistryError(
            f"agent ID {agent_id[:120]!r} is invalid: use 1 to 100 characters of "
            "A-Z, a-z, 0-9, '.', '_' and '-'"
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


def _read(connection: sqlite3.Connection, agent_id: str) -> AgentRecord | None:
    row = connection.execute("SELECT * FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
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
