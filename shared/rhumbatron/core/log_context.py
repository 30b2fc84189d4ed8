"""The correlation ID of the work in hand, on every log line the package writes.

The package logs through the standard library (``logging.getLogger(__name__)``); it knows
nothing of Powertools. Where the work at hand belongs to one message — a command a queue
consumer runs, an event the router settles — the code binds that message's correlation ID
(:func:`correlated`) for as long as it works on it. :class:`CorrelationIdFilter`, installed
on a handler by the entry layer (:mod:`rhumbatron.entrypoints.observability` in Lambda),
puts it on each record as ``correlation_id``.

A :class:`~contextvars.ContextVar`, not a global: a queue consumer runs several commands at
once on one event loop, each in its own task, and each task sees only its own binding.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from types import TracebackType

__all__ = ["CorrelationIdFilter", "correlated", "current_correlation_id"]

_correlation_id: ContextVar[str | None] = ContextVar("rhumbatron_correlation_id", default=None)


def current_correlation_id() -> str | None:
    """The correlation ID bound in this context, or None."""
    return _correlation_id.get()


def correlated(correlation_id: str | None) -> AbstractContextManager[None]:
    """Bind ``correlation_id`` to the log lines written inside the block (None: keep the
    binding around it)."""
    return _Binding(correlation_id)


class _Binding(AbstractContextManager[None]):
    """A class, not a generator: a queue consumer binds one per command, on its hot path."""

    __slots__ = ("_correlation_id", "_token")

    def __init__(self, correlation_id: str | None) -> None:
        self._correlation_id = correlation_id
        self._token: Token[str | None] | None = None

    def __enter__(self) -> None:
        if self._token is not None:
            raise RuntimeError("a correlation binding is entered once; make a new one")
        if self._correlation_id is not None:
            self._token = _correlation_id.set(self._correlation_id)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _correlation_id.reset(self._token)
            self._token = None


class CorrelationIdFilter(logging.Filter):
    """Sets ``record.correlation_id`` to the bound correlation ID, when one is bound."""

    def filter(self, record: logging.LogRecord) -> bool:
        correlation_id = _correlation_id.get()
        if correlation_id is not None:
            record.correlation_id = correlation_id
        return True
