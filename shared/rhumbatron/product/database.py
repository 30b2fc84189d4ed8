"""The product database file: dead letters, platform metrics, the analytics claims, the
project indexes' status, the agent registry and the change requests.

One SQLite file, ``<state>/product.sqlite``. The analytics projector's claims live here, next
to the metric rows they guard, so a claim and its data point commit together.
"""

from __future__ import annotations

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.agents.registry import AGENTS_SCHEMA, migrate_agents
from rhumbatron.core.settings import Settings
from rhumbatron.indexing.indexer import PROJECT_INDEXES_SCHEMA
from rhumbatron.metrics.platform_metrics import PLATFORM_METRICS_SCHEMA
from rhumbatron.product.dead_letters import DEAD_LETTERS_SCHEMA, migrate_dead_letters
from rhumbatron.queues.wake_consumer import AGENT_EVENT_WAKES_SCHEMA
from rhumbatron.reactions.registry import SUBSCRIPTIONS_SCHEMA
from rhumbatron.reactions.schedules import SCHEDULES_SCHEMA
from rhumbatron.reactions.store import REACTIONS_SCHEMA
from rhumbatron.router.claims import CLAIMS_SCHEMA

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
    """``<state>/product.sqlite``."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(
            settings.state_dir / "product.sqlite",
            settings,
            DEAD_LETTERS_SCHEMA
            + PLATFORM_METRICS_SCHEMA
            + CLAIMS_SCHEMA
            + PROJECT_INDEXES_SCHEMA
            + AGENTS_SCHEMA
            + CHANGE_REQUESTS_SCHEMA
            + SUBSCRIPTIONS_SCHEMA
            + SCHEDULES_SCHEMA
            + REACTIONS_SCHEMA
            + AGENT_EVENT_WAKES_SCHEMA,
            migrations=(migrate_dead_letters, migrate_agents),
        )
