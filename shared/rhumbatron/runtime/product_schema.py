"""The product database's schema: every store's tables in ``<state>/product.sqlite``, in one
place. The stores keep their DDL beside the SQL that reads it; the composition root gathers
it here, so the product package never imports the packages that use it.
"""

from __future__ import annotations

from rhumbatron.agents.registry import AGENTS_SCHEMA, migrate_agents
from rhumbatron.core.settings import Settings
from rhumbatron.indexing.indexer import PROJECT_INDEXES_SCHEMA
from rhumbatron.metrics.platform_metrics import PLATFORM_METRICS_SCHEMA
from rhumbatron.product.audit import AUDIT_SCHEMA
from rhumbatron.product.database import CHANGE_REQUESTS_SCHEMA, ProductDatabase
from rhumbatron.product.dead_letters import DEAD_LETTERS_SCHEMA, migrate_dead_letters
from rhumbatron.queues.wake_consumer import AGENT_EVENT_WAKES_SCHEMA
from rhumbatron.reactions.schedule_registry import SCHEDULES_SCHEMA
from rhumbatron.reactions.store import REACTIONS_SCHEMA
from rhumbatron.reactions.subscription_table import SUBSCRIPTIONS_SCHEMA
from rhumbatron.router.claims import CLAIMS_SCHEMA

__all__ = ["PRODUCT_MIGRATIONS", "PRODUCT_SCHEMA", "open_product_database"]

PRODUCT_SCHEMA = (
    DEAD_LETTERS_SCHEMA
    + PLATFORM_METRICS_SCHEMA
    + CLAIMS_SCHEMA
    + PROJECT_INDEXES_SCHEMA
    + AGENTS_SCHEMA
    + CHANGE_REQUESTS_SCHEMA
    + SUBSCRIPTIONS_SCHEMA
    + SCHEDULES_SCHEMA
    + REACTIONS_SCHEMA
    + AGENT_EVENT_WAKES_SCHEMA
    + AUDIT_SCHEMA
)
PRODUCT_MIGRATIONS = (migrate_dead_letters, migrate_agents)


def open_product_database(settings: Settings) -> ProductDatabase:
    """``<state>/product.sqlite`` with every store's tables (opened on first use)."""
    return ProductDatabase(settings, PRODUCT_SCHEMA, PRODUCT_MIGRATIONS)
