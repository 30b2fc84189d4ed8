"""The span in progress, what it stamps on what it writes and sends, and where spans go.

Whoever runs work for a message or a request opens a :func:`span` (the API for a mutating
request, the router for an Event a rule acts on, a queue consumer for a Command); whatever
that work writes or sends asks :func:`traceparent_for` what to stamp on it (the outbox row's
``traceparent`` column, a Command's ``traceparent`` header). The span in progress lives in a
:class:`~contextvars.ContextVar`, so it follows the work into ``asyncio`` tasks and
``asyncio.to_thread`` without being passed through every signature, as OpenTelemetry's
context does.

One trace per Change: what is about a Change is stamped with the Change's trace
(:func:`~rhumbatron.protocol.tracecontext.change_trace_id`), whatever trace the work itself
is in; the parent is the span in progress, or a fresh span ID when no span is (a timer's
hop). A span that stamped a Change of another trace is recorded in that trace too, so the
Change's timeline shows the API call that created it.

Spans are *recorded* only where a sink is installed (the local span store, when
``trace_spans`` is on); elsewhere a span is a ContextVar and an ID, and nothing else. Where
the X-Ray SDK is loaded already (Powertools Tracer imports it), a span about a Change
annotates the current X-Ray (sub)segment with ``change_id`` and ``change_trace_id``; this
module never imports the SDK itself (cold starts: tests/unit/test_import_hygiene.py).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

from rhumbatron.protocol.tracecontext import TraceContext, change_trace_id, new_span_id

__all__ = [
    "Span",
    "SpanSink",
    "current_span",
    "install_span_sink",
    "record_hops",
    "span",
    "traceparent_for",
]


@dataclass(slots=True)
class Span:
    """One unit of work in a trace; ``context`` is its own position (its span ID is the
    parent of what it causes)."""

    context: TraceContext
    parent_id: str | None
    name: str
    start_s: float
    end_s: float | None = None
    project_id: str | None = None
    change_id: str | None = None
    #: Changes of another trace this span stamped: it is recorded in their traces too.
    touched: set[tuple[str, str]] = field(default_factory=set)
    #: An incoming ``traceparent`` of another trace (an API caller's), kept as a link.
    link: str | None = None
    error: str | None = None


class SpanSink(Protocol):
    """Where finished spans go (the local span store)."""

    def record(self, finished: Span) -> None: ...


_current: ContextVar[Span | None] = ContextVar("rhumbatron_span", default=None)
_sinks: list[SpanSink] = []


def current_span() -> Span | None:
    """The span in progress here, if any."""
    return _current.get()


def install_span_sink(sink: SpanSink) -> Callable[[], None]:
    """Record every finished span of this process in ``sink``; returns the uninstall."""
    _sinks.append(sink)

    def uninstall() -> None:
        if sink in _sinks:
            _sinks.remove(sink)

    return uninstall


@functools.lru_cache(maxsize=4_096)
def _change_trace(project_id: str, change_id: str) -> str:
    return change_trace_id(project_id, change_id)


def traceparent_for(project_id: str, change_id: str | None) -> str | None:
    """The ``traceparent`` to stamp on a row or message written now: about a Change, the
    Change's trace with the span in progress (or a fresh span ID) as parent; about no
    Change, the span in progress's own, or None outside any span."""
    current = _current.get()
    if change_id is None:
        return None if current is None else current.context.header
    trace_id = _change_trace(project_id, change_id)
    if current is None:
        return f"00-{trace_id}-{new_span_id()}-01"
    if current.context.trace_id != trace_id and (project_id, change_id) not in current.touched:
        current.touched.add((project_id, change_id))
        _annotate_xray(change_id, trace_id)
    return f"00-{trace_id}-{current.context.span_id}-{current.context.flags}"


def span(
    name: str,
    *,
    parent: TraceContext | None = None,
    project_id: str | None = None,
    change_id: str | None = None,
    link: str | None = None,
) -> AbstractContextManager[Span]:
    """Open a span for the work in the block: in the Change's trace when ``change_id`` is
    given, else in ``parent``'s, else in a new trace; ``parent`` is the position that caused
    it (a header read). The span is the current one inside the block, and is recorded when
    the block ends, raising or not."""
    if change_id is not None and project_id is not None:
        trace_id = _change_trace(project_id, change_id)
        _annotate_xray(change_id, trace_id)
    elif parent is not None:
        trace_id = parent.trace_id
    else:
        trace_id = TraceContext.new().trace_id
    flags = parent.flags if parent is not None else "01"
    return _Scope(
        Span(
            TraceContext(trace_id, new_span_id(), flags),
            None if parent is None else parent.span_id,
            name,
            time.time(),
            project_id=project_id,
            change_id=change_id,
            link=link,
        )
    )


class _Scope(AbstractContextManager[Span]):
    """A span current for a block. A class, not a generator: a queue consumer opens one per
    command, and a generator's context manager cost several times more on that path."""

    __slots__ = ("_opened", "_token")

    def __init__(self, opened: Span) -> None:
        self._opened = opened
        self._token: Token[Span | None] | None = None

    def __enter__(self) -> Span:
        if self._token is not None or self._opened.end_s is not None:
            raise RuntimeError(f"span {self._opened.name!r} is entered once; open a new one")
        self._token = _current.set(self._opened)
        return self._opened

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        opened = self._opened
        if exc is not None:
            opened.error = f"{type(exc).__name__}: {exc}"[:500]
        assert self._token is not None
        _current.reset(self._token)
        opened.end_s = time.time()
        if _sinks:
            _record(opened)


def record_hops(name: str, traceparents: Iterable[str | None], start_s: float) -> None:
    """Record a span ``name`` from ``start_s`` to now under each distinct position of
    ``traceparents`` (a publish of rows written by a few spans); nothing without a sink."""
    if not _sinks:
        return
    end_s = time.time()
    for parent in dict.fromkeys(header for header in traceparents if header):
        context = TraceContext.parse(parent)
        if context is None:
            continue
        _record(Span(context.child(), context.span_id, name, start_s, end_s))


def _record(finished: Span) -> None:
    for sink in _sinks:
        # A span that cannot be recorded fails nothing: it is only not on the timeline.
        with contextlib.suppress(Exception):
            sink.record(finished)


def _annotate_xray(change_id: str, trace_id: str) -> None:
    """Annotate the current X-Ray subsegment, only where the SDK is loaded already."""
    core = sys.modules.get("aws_xray_sdk.core")
    if core is None:
        return
    try:
        recorder = core.xray_recorder
        entity = recorder.current_subsegment() or recorder.current_segment()
        entity.put_annotation("change_id", change_id)
        entity.put_annotation("change_trace_id", trace_id)
    except Exception:  # no segment open here (or no tracer): nothing to annotate
        return
