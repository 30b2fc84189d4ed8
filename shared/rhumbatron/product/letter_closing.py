"""A command that succeeded closes its open dead letter (resolution ``succeeded``).

The queue runtime calls :class:`SucceededCommandLetters` after every handled command. Almost
no command has a letter, so this must cost next to nothing: a Retry (attempt > 1) always
looks; a first attempt — a producer re-sending the same command after the duplicate window —
is checked against the set of command IDs with an open letter, read at most once a second.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rhumbatron.actors.storage import SqliteStore, sqlite_error
from rhumbatron.core.clock import Clock
from rhumbatron.product.dead_letters import (
    Resolution,
    close_command_dead_letter,
    open_command_ids,
)
from rhumbatron.protocol.envelopes import Command

__all__ = ["SucceededCommandLetters"]

#: How long the set of open letters is trusted before it is read again.
_OPEN_LETTERS_FRESH_S = 1.0


@dataclass
class SucceededCommandLetters:
    """Closes the open letter of each command that succeeded, in the product database
    ``product`` gives (opened on first use)."""

    product: Callable[[], SqliteStore]
    clock: Clock
    _open: frozenset[str] = field(default=frozenset(), init=False)
    _read_at: float = field(default=float("-inf"), init=False)

    async def __call__(self, command: Command) -> None:
        product = self.product()
        try:
            if command.attempt == 1 and command.command_id not in self._open_ids(product):
                return
            with product.transaction() as db:
                close_command_dead_letter(
                    db, command.command_id, Resolution.SUCCEEDED, now_s=self.clock.now().timestamp()
                )
        except sqlite3.Error as exc:
            raise sqlite_error(exc, product.path, "closing a dead letter") from exc

    def _open_ids(self, product: SqliteStore) -> frozenset[str]:
        now = time.monotonic()
        if now - self._read_at >= _OPEN_LETTERS_FRESH_S:
            self._open, self._read_at = open_command_ids(product.connection), now
        return self._open
