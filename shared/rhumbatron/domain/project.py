"""The project root aggregate: creation, and promotion that advances the canonical generation.

Its facts (project.created, artifact.promoted, canonical.advanced) are the only ones the
ProjectRoot actor writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.transition import Insert, Transition, Update, Upsert
from rhumbatron.errors import DomainError
from rhumbatron.protocol.envelopes import Event

__all__ = [
    "PROJECT_ADMIN_MOVES",
    "ProjectState",
    "create_project",
    "project_admin_key",
    "promote_candidate",
    "provision_app",
    "remove_app",
    "set_project_status",
]


@dataclass(frozen=True, slots=True)
class ProjectState:
    project_id: str
    tenant_id: str
    name: str
    status: str
    canonical_generation: int
    canonical_candidate_id: str | None


def create_project(current: ProjectState | None, ctx: FactContext, *, name: str) -> Transition:
    """Create the project once; creating it again with the same name changes nothing."""
    if current is not None:
        if current.name != name:
            raise DomainError(
                f"project {ctx.project_id!r} already exists named {current.name!r}, not {name!r}"
            )
        return Transition()
    row = {
        "project_id": ctx.project_id,
        "tenant_id": ctx.caller.tenant_id,
        "name": name,
        "status": "active",
        "canonical_generation": 0,
        "canonical_candidate_id": None,
        "created_at": ctx.now.isoformat(),
    }
    fact = ctx.fact("project.created", {"name": name}, canonical_generation=0)
    return Transition(patch=(Insert("project", row),), facts=(fact,))


def promote_candidate(
    current: ProjectState | None,
    ctx: FactContext,
    *,
    candidate_id: str,
    artifact_id: str,
    expected_generation: int,
    change_ids: tuple[str, ...] = (),
) -> Transition:
    """decidePromotion: advance canonical from ``expected_generation`` to the next one.

    The key is candidate + expected generation: repeating a promotion that already happened
    returns an empty transition (``already_promoted``); promoting from a generation that is no
    longer canonical is refused.
    """
    if current is None:
        raise DomainError(f"project {ctx.project_id!r} does not exist; create it first")
    if (
        current.canonical_candidate_id == candidate_id
        and current.canonical_generation == expected_generation + 1
    ):
        return Transition()  # already_promoted
    if current.canonical_generation != expected_generation:
        raise DomainError(
            f"candidate {candidate_id!r} expects canonical generation {expected_generation}, "
            f"but project {ctx.project_id!r} is at {current.canonical_generation}; recompose it"
        )
    generation = expected_generation + 1
    patch = _promotion_patch(
        ctx, candidate_id=candidate_id, artifact_id=artifact_id, generation=generation
    )
    facts = _promotion_facts(
        ctx,
        candidate_id=candidate_id,
        artifact_id=artifact_id,
        generation=generation,
        previous_generation=expected_generation,
        change_ids=change_ids,
    )
    return Transition(patch=patch, facts=facts)


def _promotion_patch(
    ctx: FactContext, *, candidate_id: str, artifact_id: str, generation: int
) -> tuple[Update, Insert]:
    """Canonical moves to ``generation`` (the promoted Candidate), and its artifact is kept."""
    return (
        Update(
            "project",
            key={"project_id": ctx.project_id},
            values={"canonical_generation": generation, "canonical_candidate_id": candidate_id},
        ),
        Insert(
            "artifacts",
            {
                "artifact_id": artifact_id,
                "candidate_id": candidate_id,
                "generation": generation,
                "promoted_at": ctx.now.isoformat(),
            },
        ),
    )


def _promotion_facts(
    ctx: FactContext,
    *,
    candidate_id: str,
    artifact_id: str,
    generation: int,
    previous_generation: int,
    change_ids: tuple[str, ...],
) -> tuple[Event, Event]:
    """``artifact.promoted`` then ``canonical.advanced`` (from ``previous_generation``)."""
    return (
        ctx.fact(
            "artifact.promoted",
            {"artifactId": artifact_id, "candidateId": candidate_id, "generation": generation},
            canonical_generation=generation,
        ),
        ctx.fact(
            "canonical.advanced",
            {
                "generation": generation,
                "previousGeneration": previous_generation,
                "candidateId": candidate_id,
                "changeIds": list(change_ids),
            },
            canonical_generation=generation,
        ),
    )


# -- administration: the shard of ``project:<id>`` ----------------------------------------------
#: A project is ``active`` until archived; an archived one can be deleted.
PROJECT_ADMIN_MOVES = {
    "active": frozenset({"archived", "deleted"}),
    "archived": frozenset({"deleted"}),
}


def project_admin_key(project_id: str) -> str:
    """The resource key whose shard holds a project's administration (status, apps)."""
    return f"project:{project_id}"


def set_project_status(
    current: str | None, ctx: FactContext, *, to: str, reason: str = ""
) -> Transition:
    """Archive or delete the project (``project.archived`` / ``project.deleted``)."""
    status = current or "active"
    if status == to:
        return Transition()
    if to not in PROJECT_ADMIN_MOVES.get(status, frozenset()):
        raise DomainError(f"project {ctx.project_id!r} is {status}; it cannot become {to}")
    row = {"project_id": ctx.project_id, "status": to, "updated_at": ctx.now.isoformat()}
    fact = ctx.fact(f"project.{to}", {"reason": reason})
    return Transition(patch=(Upsert("project_admin", row, key=("project_id",)),), facts=(fact,))


def provision_app(
    current: str | None, project_status: str | None, ctx: FactContext, *, app_name: str
) -> Transition:
    """Make the project's app live (``app.provisioned``); live already is nothing."""
    if current == "live":
        return Transition()
    if (project_status or "active") != "active":
        raise DomainError(
            f"project {ctx.project_id!r} is {project_status}; apps are provisioned only for "
            "an active project"
        )
    row = {"app_name": app_name, "status": "live", "updated_at": ctx.now.isoformat()}
    fact = ctx.fact("app.provisioned", {"appName": app_name})
    return Transition(patch=(Upsert("apps", row, key=("app_name",)),), facts=(fact,))


def remove_app(
    current: str | None, ctx: FactContext, *, app_name: str, reason: str = ""
) -> Transition:
    """Take the app down (``app.removed``); an app not live is nothing."""
    if current != "live":
        return Transition()
    row = {"app_name": app_name, "status": "removed", "updated_at": ctx.now.isoformat()}
    fact = ctx.fact("app.removed", {"appName": app_name, "reason": reason})
    return Transition(patch=(Upsert("apps", row, key=("app_name",)),), facts=(fact,))
