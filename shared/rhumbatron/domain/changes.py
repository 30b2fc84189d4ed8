"""Change facts written to the shard that owns ``change:<id>`` (spec ``appendChangeEvents``).

Change Events carry deterministic IDs, so a retried workflow step that appends the same facts
is a no-op in the outbox; the change's status row moves in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.transition import Transition, Upsert
from rhumbatron.errors import DomainError
from rhumbatron.protocol.event_types import EVENT_TYPES

__all__ = ["TERMINAL_STATUSES", "ChangeFact", "ChangeState", "append_change_events"]

#: A Change in one of these states never moves again.
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "not_selected", "declined"})


@dataclass(frozen=True, slots=True)
class ChangeState:
    change_id: str
    status: str


@dataclass(frozen=True, slots=True)
class ChangeFact:
    """One fact to append: its type, payload, and (for Task Events) the Task and a key."""

    event_type: str
    payload: dict[str, Any]
    task_id: str | None = None
    key: str | None = None


def append_change_events(
    current: ChangeState | None,
    ctx: FactContext,
    *,
    change_id: str,
    status: str,
    facts: tuple[ChangeFact, ...],
) -> Transition:
    """Move the Change to ``status`` and append its facts, with stable IDs."""
    if current is not None and current.status in TERMINAL_STATUSES and status != current.status:
        raise DomainError(
            f"change {change_id!r} is {current.status}; a terminal change cannot become {status}"
        )
    for fact in facts:
        spec = EVENT_TYPES.get(fact.event_type)
        if spec is None or not spec.requires_change:
            raise DomainError(
                f"{fact.event_type!r} is not a Change Event; Change Events are "
                + ", ".join(sorted(n for n, s in EVENT_TYPES.items() if s.requires_change))
            )
    row = {"change_id": change_id, "status": status, "updated_at": ctx.now.isoformat()}
    events = tuple(
        ctx.fact(f.event_type, f.payload, change_id=change_id, task_id=f.task_id, key=f.key)
        for f in facts
    )
    return Transition(patch=(Upsert("changes", row, key=("change_id",)),), facts=events)
