"""The dashboard's Change trace: the spans of one Change's trace, for its timeline.

Read from the local span store (``<state>/traces.sqlite``, :mod:`rhumbatron.metrics.trace_spans`),
which ``rhumbatron up`` fills (``trace_spans`` is on there). Without a Change asked for, the
latest Change with spans is shown. Each span comes with its offset from the trace's first
span and its duration, in milliseconds, and its depth under the spans of this trace, so the
page draws rows of bars scaled to time without any arithmetic of its own but the scale.
"""

from __future__ import annotations

from typing import Any

from rhumbatron.metrics.trace_spans import SpanRow, install_span_store
from rhumbatron.protocol.tracecontext import change_trace_id
from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["change_trace"]


def change_trace(app: Rhumbatron, project_id: str | None, change_id: str | None) -> dict[str, Any]:
    """``{enabled, changes, projectId, changeId, traceId, spans}`` for the page."""
    if not app.settings.trace_spans:
        return {"enabled": False, "changes": [], "spans": []}
    store = install_span_store(app.settings)
    recent = store.recent_changes()
    if change_id is not None and project_id is None:
        project_id = next((p for p, c in recent if c == change_id), None)
    if change_id is None and recent:
        project_id, change_id = recent[0]
    answer: dict[str, Any] = {
        "enabled": True,
        "changes": [{"projectId": p, "changeId": c} for p, c in recent],
        "projectId": project_id,
        "changeId": change_id,
        "traceId": None,
        "spans": [],
    }
    if project_id is None or change_id is None:
        return answer
    answer["traceId"] = change_trace_id(project_id, change_id)
    answer["spans"] = _timeline(store.change(project_id, change_id))
    return answer


def _timeline(spans: list[SpanRow]) -> list[dict[str, Any]]:
    if not spans:
        return []
    origin = min(s.start_s for s in spans)
    parents = {s.span_id: s.parent_id for s in spans}

    def depth(span_id: str) -> int:
        seen: set[str] = set()
        level = 0
        parent = parents.get(span_id)
        while parent in parents and parent not in seen:
            seen.add(parent)
            level += 1
            parent = parents[parent]
        return level

    return [
        {
            "spanId": s.span_id,
            "parentId": s.parent_id,
            "name": s.name,
            "depth": depth(s.span_id),
            "offsetMs": round((s.start_s - origin) * 1000, 3),
            "durationMs": round((s.end_s - s.start_s) * 1000, 3),
            "error": s.error,
        }
        for s in spans
    ]
