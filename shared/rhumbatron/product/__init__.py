"""The product database: what the spec keeps outside the actors (dead letters, metrics rows)."""

from rhumbatron.product.database import ProductDatabase
from rhumbatron.product.dead_letters import DeadLetter, DeadLetterKind, DeadLetterStatus

__all__ = ["DeadLetter", "DeadLetterKind", "DeadLetterStatus", "ProductDatabase"]
