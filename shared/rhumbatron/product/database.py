"""The product database file: dead letters, platform metrics, and the analytics claims.

One SQLite file, ``<state>/product.sqlite``. The analytics projector's claims live here, next
to the metric rows they guard, so a claim and its data point commit together.
"""

from __future__ import annotations

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.metrics.platform_metrics import PLATFORM_METRICS_SCHEMA
from rhumbatron.product.dead_letters import DEAD_LETTERS_SCHEMA
from rhumbatron.router.claims import CLAIMS_SCHEMA
from rhumbatron.runtime.settings import Settings

__all__ = ["ProductDatabase"]


class ProductDatabase(SqliteStore):
    """``<state>/product.sqlite``."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(
            settings.state_dir / "product.sqlite",
            settings,
            DEAD_LETTERS_SCHEMA + PLATFORM_METRICS_SCHEMA + CLAIMS_SCHEMA,
        )
