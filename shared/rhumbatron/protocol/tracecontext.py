"""W3C trace context (``traceparent``) as it travels with Events and Commands.

``traceparent`` is ``00-<trace id>-<parent id>-<flags>``: version ``00``, 32 lowercase hex
digits of trace ID (not all zero), 16 of parent (span) ID (not all zero) and 2 of flags — 55
characters. Anything else is *absent*: a bad header never fails a request or a message, it
is only not continued (W3C: a receiver that cannot parse it starts a new trace).

One trace per Change: the trace ID of a Change is :func:`change_trace_id` of its project and
Change ID, so every hop of a Change lands in the same trace, those started by a timer with
no header to read included (see docs/tracing.md).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

__all__ = ["TRACEPARENT_HEADER", "TraceContext", "change_trace_id", "new_span_id"]

#: The header's name on NATS messages and HTTP requests (HTTP headers ignore case).
TRACEPARENT_HEADER = "traceparent"

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
_SAMPLED = "01"


def new_span_id() -> str:
    """16 random lowercase hex digits, never all zero."""
    while (span_id := os.urandom(8).hex()) == _ZERO_SPAN:
        pass  # pragma: no cover - one chance in 2**64
    return span_id


def change_trace_id(project_id: str, change_id: str) -> str:
    """The trace ID of every hop of a Change: the first 32 hex digits of SHA-256 over the
    UTF-8 of ``project_id``, ``\\x1f``, ``change_id``. Computed, never stored: a timer's hop
    (a sweep, a settle) finds the trace of its Change with no header to read."""
    digest = hashlib.sha256(f"{project_id}\x1f{change_id}".encode()).hexdigest()[:32]
    return digest if digest != _ZERO_TRACE else "0" * 31 + "1"


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One position in a trace: the trace, the span that sent or wrote what carries it, and
    the flags (``01``: sampled)."""

    trace_id: str
    span_id: str
    flags: str = _SAMPLED

    @classmethod
    def parse(cls, header: str | None) -> TraceContext | None:
        """The context in a ``traceparent`` value, or None when it is absent or not a valid
        version-00 value (then the receiver starts a trace of its own)."""
        if header is None or len(header) != 55:
            return None
        match = _TRACEPARENT.fullmatch(header)
        if match is None:
            return None
        trace_id, span_id, flags = match.groups()
        if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
            return None
        return cls(trace_id, span_id, flags)

    @classmethod
    def new(cls) -> TraceContext:
        """A new trace (a request that brought none, about no Change)."""
        return cls(os.urandom(16).hex(), new_span_id())

    def child(self) -> TraceContext:
        """The same trace, a new span (whose parent is this one's)."""
        return TraceContext(self.trace_id, new_span_id(), self.flags)

    @property
    def header(self) -> str:
        """The ``traceparent`` value."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"
