"""Building facts inside transitions: who acted, why, and which ID the fact gets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.event_types import EVENT_TYPES, EventIdKind
from rhumbatron.protocol.ids import new_event_id, stable_event_id

__all__ = ["Caller", "FactContext"]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks for a transition and in which causal chain."""

    tenant_id: str
    actor: str
    correlation_id: str
    caused_by: str | None = None


@dataclass(frozen=True, slots=True)
class FactContext:
    """Everything a transition needs to stamp its facts."""

    caller: Caller
    project_id: str
    now: datetime

    def fact(
        self,
        event_type: str,
        payload: dict[str, Any],
        *,
        change_id: str | None = None,
        task_id: str | None = None,
        key: str | None = None,
        resource: str | None = None,
        canonical_generation: int | None = None,
        event_id: str | None = None,
    ) -> Event:
        """An Event of ``event_type`` with the ID its type prescribes.

        Change Events get ``stable_event_id(change, type, task, key)``; the actor's own
        Events get a fresh ID, minted here, inside the transaction — unless the caller gives
        ``event_id``: an observer's fact that must carry the same ID on every attempt (a
        schedule's fire, a disablement), so the outbox and JetStream drop a repeat.
        """
        spec = EVENT_TYPES.get(event_type)
        if event_id is not None:
            if spec is not None and spec.id_kind is EventIdKind.STABLE:
                raise ValueError(f"{event_type} takes its stable ID from its Change, not event_id")
        elif spec is not None and spec.id_kind is EventIdKind.STABLE:
            if change_id is None:
                raise ValueError(f"{event_type} needs a change_id for its stable ID")
            event_id = stable_event_id(change_id, event_type, task_id, key)
        else:
            event_id = new_event_id()
        return Event.create(
            event_id=event_id,
            event_type=event_type,
            event_version=spec.version if spec else 1,
            tenant_id=self.caller.tenant_id,
            project_id=self.project_id,
            change_id=change_id,
            task_id=task_id,
            actor=self.caller.actor,
            resource=resource,
            canonical_generation=canonical_generation,
            caused_by=self.caller.caused_by,
            correlation_id=self.caller.correlation_id,
            timestamp=self.now,
            payload=payload,
        )
