"""Releases: one per promoted generation with a live app, keyed ``rel_<project>_<generation>``.

The release row is the idempotency key of the release (the spec's "releases primary key"):
starting it again finds the row and writes nothing. It lives in the shard of the Change whose
Candidate was promoted, so a release fact and the Change's move commit together.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.transition import Insert, Transition, Update, parse_state
from rhumbatron.errors import DomainError

__all__ = ["ReleaseState", "ReleaseStatus", "finish_release", "release_id_for", "start_release"]


class ReleaseStatus(StrEnum):
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ReleaseState:
    release_id: str
    change_id: str
    generation: int
    candidate_id: str
    app_name: str
    status: ReleaseStatus
    reason: str = ""


def release_id_for(project_id: str, generation: int) -> str:
    """``rel_<project>_<generation>``: the release's primary key and workflow instance ID."""
    if generation < 1:
        raise DomainError(f"generation {generation} was never promoted; releases start at 1")
    return f"rel_{project_id}_{generation}"


def start_release(
    existing: ReleaseState | None,
    ctx: FactContext,
    *,
    change_id: str,
    generation: int,
    candidate_id: str,
    app_name: str,
) -> Transition:
    """Record the release as started (``release.started``); a second start is nothing."""
    release_id = release_id_for(ctx.project_id, generation)
    if existing is not None:
        return Transition()
    row = {
        "release_id": release_id,
        "change_id": change_id,
        "generation": generation,
        "candidate_id": candidate_id,
        "app_name": app_name,
        "status": ReleaseStatus.STARTED.value,
        "reason": "",
        "updated_at": ctx.now.isoformat(),
    }
    fact = ctx.fact(
        "release.started",
        {"releaseId": release_id, "generation": generation, "reason": f"app {app_name}"},
        change_id=change_id,
        key=release_id,
    )
    return Transition(patch=(Insert("releases", row),), facts=(fact,))


def finish_release(
    existing: ReleaseState | None,
    ctx: FactContext,
    *,
    release_id: str,
    outcome: ReleaseStatus | str,
    reason: str = "",
) -> Transition:
    """``release.completed`` or ``release.failed``; finishing it the same way again is
    nothing, the other way is refused."""
    target = parse_state(ReleaseStatus, outcome)
    if target is ReleaseStatus.STARTED:
        raise DomainError("a release finishes as completed or failed, not started")
    if existing is None:
        raise DomainError(f"no release {release_id!r}; start it first")
    if existing.status is target:
        return Transition()
    if existing.status is not ReleaseStatus.STARTED:
        raise DomainError(f"release {release_id!r} already {existing.status}; it cannot {target}")
    fact = ctx.fact(
        f"release.{target.value}",
        {"releaseId": release_id, "generation": existing.generation, "reason": reason},
        change_id=existing.change_id,
        key=release_id,
    )
    return Transition(
        patch=(
            Update(
                "releases",
                {"release_id": release_id},
                {"status": target.value, "reason": reason, "updated_at": ctx.now.isoformat()},
            ),
        ),
        facts=(fact,),
    )
