"""The analytics projector's mapping: lifecycle Events → metric names → ``EVENT_METRICS`` points.

Spec (analytics-projector): lifecycle Events map to metric names such as ``change_created``,
``task_*``, ``agent_wakeup``, ``model_route``, ``candidate_*``, ``promotion_*`` and
``release_completed``; one data point per fresh Event, at most 100 per tick
(:func:`~rhumbatron.metrics.record_event_points` enforces the cap). Most names are the type
name with ``.`` → ``_``; the two the spec names differently are ``agent.woke`` →
``agent_wakeup`` and ``model.routed`` → ``model_route``.

Left unmapped on purpose (no metric):

* ``change.status_changed``, ``change.settled``: intermediate state moves, repeated by every
  settle pass; the terminal ``change.*`` types already count outcomes.
* ``artifact.promoted``: the same promotion ``candidate.promoted`` and
  ``promotion.completed`` already count.
* ``claim.released``, ``intent.declared``, ``intent.changed``: coordination chatter, one per
  agent edit; ``claim_acquired`` and ``claim_expired`` keep the signal (expiries are the
  reliability problem worth a graph).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rhumbatron.metrics.platform_metrics import DataPoint
from rhumbatron.protocol.envelopes import Event

__all__ = ["ANALYTICS_METRICS", "analytics_point"]

#: Event type name → metric name, for every lifecycle Event worth a count. Read-only; a test
#: checks each key is in ``EVENT_TYPES``.
ANALYTICS_METRICS: Mapping[str, str] = MappingProxyType(
    {
        "project.created": "project_created",
        "canonical.advanced": "canonical_advanced",
        "claim.acquired": "claim_acquired",
        "claim.expired": "claim_expired",
        "challenge.created": "challenge_created",
        "changeset.proposed": "changeset_proposed",
        "change.created": "change_created",
        "change.planned": "change_planned",
        "change.completed": "change_completed",
        "change.failed": "change_failed",
        "change.cancelled": "change_cancelled",
        "change.not_selected": "change_not_selected",
        "change.declined": "change_declined",
        "task.ready": "task_ready",
        "task.assigned": "task_assigned",
        "task.started": "task_started",
        "task.completed": "task_completed",
        "task.failed": "task_failed",
        "task.blocked": "task_blocked",
        "agent.woke": "agent_wakeup",
        "model.routed": "model_route",
        "verification.started": "verification_started",
        "candidate.created": "candidate_created",
        "candidate.verified": "candidate_verified",
        "candidate.rejected": "candidate_rejected",
        "candidate.stale": "candidate_stale",
        "candidate.promoted": "candidate_promoted",
        "promotion.requested": "promotion_requested",
        "promotion.completed": "promotion_completed",
        "promotion.rejected": "promotion_rejected",
        "release.started": "release_started",
        "release.completed": "release_completed",
        "release.failed": "release_failed",
    }
)


def analytics_point(event: Event) -> DataPoint | None:
    """The ``EVENT_METRICS`` data point for ``event``, or None if its type has no metric.

    A count of 1, dimensioned by event type and keyed by the Event's ID so a redelivered
    Event leaves one row (see :func:`~rhumbatron.metrics.write_points`). The project is
    the row's ``project_id`` column, not a dimension: as an EMF dimension it would make
    one CloudWatch metric per project and type, a cost that grows with every project.
    """
    name = ANALYTICS_METRICS.get(event.event_type)
    if name is None:
        return None
    return DataPoint(
        name=name,
        value=1.0,
        unit="Count",
        dimensions={"event_type": event.event_type},
        event_id=event.event_id,
        project_id=event.project_id,
    )
