"""The product database: what the spec keeps outside the actors (dead letters, metrics rows).

:class:`ProductDatabase` is imported on first use: its schema gathers the tables of the
indexing, router, metrics and agents packages, and a cold start that only needs the dead
letters' types (the operator API's routes) should not import those packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rhumbatron.product.dead_letters import DeadLetter, DeadLetterKind, DeadLetterStatus

if TYPE_CHECKING:
    from rhumbatron.product.database import ProductDatabase

__all__ = ["DeadLetter", "DeadLetterKind", "DeadLetterStatus", "ProductDatabase"]


def __getattr__(name: str) -> Any:
    if name == "ProductDatabase":
        from rhumbatron.product.database import ProductDatabase

        return ProductDatabase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
