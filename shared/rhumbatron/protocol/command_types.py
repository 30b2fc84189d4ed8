"""``COMMAND_TYPES``: the closed registry of Command types, one payload model each.

Names are imperative (a Command asks for work). Each type names the queue it travels on by
default (the spec's queue diagram) and whether it counts toward the router's
1,000-commands-per-Change-per-day cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated

from pydantic import Field

from rhumbatron.protocol.ids import EVENT_ID_PATTERN
from rhumbatron.protocol.payloads import Payload
from rhumbatron.protocol.values import (
    AgentId,
    Generation,
    Identifier,
    NameId,
    PromotedGeneration,
)

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


#: Free text a person reads (a reason): one paragraph, not a document.
_Text = Annotated[str, Field(min_length=1, max_length=1000)]


class AgentWake(Payload):
    agent_id: AgentId
    reason: _Text
    event_id: str | None = Field(default=None, pattern=EVENT_ID_PATTERN.pattern)
    #: The kind of the event a reaction's wake answers (``reason`` = ``reaction:<sub>``).
    event_kind: str | None = Field(default=None, max_length=64)


class ChangeDispatch(Payload):
    reason: str = "task_completed"


class CandidateCreate(Payload):
    base_generation: Generation | None = None
    reason: str = "work_graph_completed"


class ChangeSettle(Payload):
    reason: _Text


class CandidatesRecompose(Payload):
    generation: PromotedGeneration
    stale_candidate_ids: tuple[Identifier, ...] = Field(default=(), max_length=1000)


class ForksSweep(Payload):
    pass


class ProjectCleanup(Payload):
    reason: str = "archived"


class ReleaseRecover(Payload):
    release_id: Identifier


class ProjectProvision(Payload):
    name: str = Field(min_length=1, max_length=200)
    tenant_id: str = Field(min_length=1, max_length=64)


class AppProvision(Payload):
    #: It names the app's directory (``<state>/apps/<project>/<app>``): one safe component.
    app_name: NameId


class AppRemove(Payload):
    app_name: NameId


class VerificationStart(Payload):
    #: It names the Candidate's fork file (``<state>/forks/<project>/<candidate>.json``).
    candidate_id: Identifier


class ReleaseStart(Payload):
    release_id: Identifier
    generation: PromotedGeneration
    candidate_id: Identifier | None = None
    app_name: NameId | None = None


class IndexBuild(Payload):
    generation: Generation | None = None
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
