"""The product database file: dead letters, platform metrics, the analytics claims, the
project indexes' status, the agent registry, the subscriptions, schedules and reactions'
bookkeeping, and the change requests.

One SQLite file, ``<state>/product.sqlite``. The analytics projector's claims live here, next
to the metric rows they guard, so a claim and its data point commit together. Its tables
belong to the stores that use them; this module does not import them: the composition root
gathers their schema (:mod:`rhumbatron.runtime.product_schema`) and opens the file with it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.settings import Settings

__all__ = ["CHANGE_REQUESTS_SCHEMA", "ProductDatabase"]

#: Change creation's idempotency key (spec "Idempotency and dedupe"): one Change per
#: ``(project_id, client_request_id)``, taken with ``INSERT … ON CONFLICT DO NOTHING``.
CHANGE_REQUESTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS change_requests (
    project_id        TEXT NOT NULL,
    client_request_id TEXT NOT NULL,
    change_id         TEXT NOT NULL UNIQUE,
    tenant_id         TEXT NOT NULL,
    created_at_s      REAL NOT NULL,
    PRIMARY KEY (project_id, client_request_id)
);
"""


class ProductDatabase(SqliteStore):
    """``<state>/product.sqlite``, with the tables of ``schema`` (every store's, gathered by
    the composition root) and their ``migrations``."""

    def __init__(
        self,
        settings: Settings,
        schema: str,
        migrations: Sequence[Callable[[sqlite3.Connection], None]] = (),
    ) -> None:
        super().__init__(
            settings.state_dir / "product.sqlite", settings, schema, migrations=migrations
        )
