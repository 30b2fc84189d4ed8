"""``COMMAND_TYPES``: the closed registry of Command types, one payload model each.

Names are imperative (a Command asks for work). Each type names the queue it travels on by
default (the spec's queue diagram) and whether it counts toward the router's
1,000-commands-per-Change-per-day cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from pydantic import Field

from rhumbatron.protocol.payloads import Payload

__all__ = ["COMMAND_TYPES", "QUEUES", "CommandTypeSpec", "command_type_spec"]

#: Every queue: one subject ``cmd.<queue>`` each on the COMMANDS work-queue stream.
QUEUES: tuple[str, ...] = (
    "agent-wakeups",
    "integration",
    "verification",
    "release",
    "indexing",
    "dead-letter",
)


@dataclass(frozen=True, slots=True)
class CommandTypeSpec:
    """Everything the system knows about one Command type."""

    name: str
    payload: type[Payload]
    queue: str
    summary: str
    counts_toward_change_cap: bool = False


class AgentWake(Payload):
    agent_id: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    event_id: str | None = None
    #: The kind of the event a reaction's wake answers (``reason`` = ``reaction:<sub>``).
    event_kind: str | None = None


class ChangeDispatch(Payload):
    reason: str = "task_completed"


class CandidateCreate(Payload):
    base_generation: int | None = Field(default=None, ge=0)
    reason: str = "work_graph_completed"


class ChangeSettle(Payload):
    reason: str = Field(min_length=1)


class CandidatesRecompose(Payload):
    generation: int = Field(ge=1)
    stale_candidate_ids: tuple[str, ...] = ()


class ForksSweep(Payload):
    pass


class ProjectCleanup(Payload):
    reason: str = "archived"


class ReleaseRecover(Payload):
    release_id: str = Field(min_length=1)


class ProjectProvision(Payload):
    name: str = Field(min_length=1, max_length=200)
    tenant_id: str = Field(min_length=1)


class AppProvision(Payload):
    app_name: str = Field(min_length=1)


class AppRemove(Payload):
    app_name: str = Field(min_length=1)


class VerificationStart(Payload):
    candidate_id: str = Field(min_length=1)


class ReleaseStart(Payload):
    release_id: str = Field(min_length=1)
    generation: int = Field(ge=1)
    candidate_id: str | None = None
    app_name: str | None = None


class IndexBuild(Payload):
    generation: int | None = Field(default=None, ge=0)
    reason: str = "promotion"


class IndexPurge(Payload):
    reason: str = "archived"


def _cmd(
    name: str, payload: type[Payload], queue: str, summary: str, *, capped: bool = False
) -> CommandTypeSpec:
    if queue not in QUEUES:
        raise ValueError(f"command {name!r} names unknown queue {queue!r}")
    return CommandTypeSpec(name, payload, queue, summary, capped)


_ALL: tuple[CommandTypeSpec, ...] = (
    _cmd("agent.wake", AgentWake, "agent-wakeups", "Wake an agent for a change.", capped=True),
    _cmd("change.dispatch", ChangeDispatch, "integration", "Dispatch ready tasks.", capped=True),
    _cmd("candidate.create", CandidateCreate, "integration", "Compose a candidate.", capped=True),
    _cmd("change.settle", ChangeSettle, "integration", "Settle a change's state.", capped=True),
    _cmd("candidates.recompose", CandidatesRecompose, "integration", "Settle stale candidates."),
    _cmd("forks.sweep", ForksSweep, "integration", "Remove abandoned forks."),
    _cmd("project.cleanup", ProjectCleanup, "integration", "Clean up an archived project."),
    _cmd("release.recover", ReleaseRecover, "integration", "Recover a stuck release."),
    _cmd("project.provision", ProjectProvision, "integration", "Provision a project."),
    _cmd("app.provision", AppProvision, "integration", "Provision a project's app."),
    _cmd("app.remove", AppRemove, "integration", "Remove a project's app."),
    _cmd("verification.start", VerificationStart, "verification", "Start verification."),
    _cmd("release.start", ReleaseStart, "release", "Start a release."),
    _cmd("index.build", IndexBuild, "indexing", "Build a project's index."),
    _cmd("index.purge", IndexPurge, "indexing", "Purge a project's index."),
)

#: The closed list of Command types, by name. Read-only.
COMMAND_TYPES: MappingProxyType[str, CommandTypeSpec] = MappingProxyType(
    {spec.name: spec for spec in _ALL}
)


def command_type_spec(name: str) -> CommandTypeSpec:
    """The spec of ``name``; raises :class:`~rhumbatron.errors.UnknownTypeError` if absent."""
    from rhumbatron.errors import UnknownTypeError

    try:
        return COMMAND_TYPES[name]
    except KeyError:
        raise UnknownTypeError(
            f"unknown command type {name!r}: COMMAND_TYPES is closed; use one of "
            f"{', '.join(sorted(COMMAND_TYPES))}"
        ) from None
