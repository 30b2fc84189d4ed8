"""How a long operation reports how far it got: a callback the caller may pass in.

Replay, the views rebuild and the reconciliation take an optional ``progress`` of this type
and call it as they finish each piece of work (a batch of records, a stream), with what is
done so far and the whole when it is known. The operation never depends on it: the operator
CLI draws a progress bar from it, everything else passes None.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ProgressCallback"]


class ProgressCallback(Protocol):
    """Hears ``done`` units of work out of ``total`` (None while the whole is unknown), each
    call at least as far as the one before; ``note`` says what was just finished, in a line
    an operator can read, or is empty."""

    def __call__(self, done: int, total: int | None, note: str = "") -> None: ...
