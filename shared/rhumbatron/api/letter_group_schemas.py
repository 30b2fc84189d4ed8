"""The dead-letter groups' bodies (``/dead-letters/groups``): frozen pydantic models,
camelCase on the wire, like :mod:`rhumbatron.api.schemas`."""

from datetime import UTC, datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.operator.letter_groups import GroupAction, LetterGroup
from rhumbatron.product.dead_letters import DeadLetterKind

__all__ = ["GroupActionBody", "GroupActionRequest", "LetterGroupBody", "LetterGroupsBody"]


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class LetterGroupBody(_Wire):
    """Open dead letters that failed the same way."""

    id: str = Field(description="The group's ID: stable while its letters are open.")
    kind: DeadLetterKind
    queue: str | None = Field(description="The queue its commands failed on.")
    command_type: str | None
    consumer: str | None = Field(description="The subscription (poison events).")
    reason: str = Field(description="The failure, its IDs, numbers and quoted values elided.")
    count: int = Field(ge=1)
    retryable: bool = Field(description="False: its letters can only be dismissed.")
    letter_ids: list[str]
    first_at: AwareDatetime
    last_at: AwareDatetime

    @classmethod
    def of(cls, group: LetterGroup) -> "LetterGroupBody":
        return cls(
            id=group.group_id,
            kind=group.kind,
            queue=group.queue,
            command_type=group.command_type,
            consumer=group.consumer,
            reason=group.reason,
            count=group.count,
            retryable=group.retryable,
            letter_ids=list(group.letter_ids),
            first_at=datetime.fromtimestamp(group.first_at_s, UTC),
            last_at=datetime.fromtimestamp(group.last_at_s, UTC),
        )


class LetterGroupsBody(_Wire):
    """The caller's open dead letters in groups, the largest first."""

    groups: list[LetterGroupBody]


class GroupActionRequest(_Wire):
    """A group's Retry or Dismiss: ``dryRun`` counts what it would do and does nothing."""

    dry_run: bool = False


class GroupActionBody(_Wire):
    """What a group's Retry or Dismiss did, letter by letter."""

    group_id: str
    action: str = Field(description="retry or dismiss.")
    dry_run: bool
    count: int = Field(ge=0, description="Letters this call acted on (would, in a dry run).")
    done: list[str] = Field(description="The letters this call acted on.")
    already: list[str] = Field(
        description="Letters another call had acted on (a Retry reserved, a letter closed)."
    )
    failed: dict[str, str] = Field(description="Letters that could not be acted on, and why.")

    @classmethod
    def of(cls, action: GroupAction) -> "GroupActionBody":
        return cls(
            group_id=action.group_id,
            action=action.action,
            dry_run=action.dry_run,
            count=len(action.done),
            done=action.done,
            already=action.already,
            failed=action.failed,
        )
