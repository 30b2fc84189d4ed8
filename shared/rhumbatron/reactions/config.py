"""The reactions' tunables, each with the spec's value as its default (DECISIONS "Reactions").

They live here, not in :class:`~rhumbatron.core.settings.Settings`, until that file takes
them; they are read from the same ``RHUMBATRON_*`` environment variables.
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rhumbatron.reactions.webhook_ledger import RetryPolicy

__all__ = ["ReactionSettings"]


class ReactionSettings(BaseSettings):
    """Loop guards and the admission gate (S2-012, S2-013, S2-129)."""

    model_config = SettingsConfigDict(env_prefix="RHUMBATRON_", frozen=True, extra="ignore")

    reaction_depth_cap: int = Field(
        default=8,
        ge=1,
        description="An event this many reaction hops deep (its causedBy chain) fires no more "
        "reactions.",
    )
    reaction_default_cooldown_s: float = Field(
        default=60.0,
        ge=0,
        description="A subscription that fired fires again only after this long, unless its "
        "governance sets its own cooldown.",
    )
    reaction_daily_budget: int = Field(
        default=1_000,
        ge=0,
        description="Reactions one tenant may run per UTC day; past it each is skipped and the "
        "day's first refusal records budget.exceeded.",
    )
    reaction_in_flight_cap: int = Field(
        default=100,
        ge=1,
        description="Reactions of one tenant running at once (webhook deliveries, workflow "
        "starts, wakes); past it the event waits on the stream (the cursor lags).",
    )
    reaction_in_flight_lease_s: float = Field(
        default=300.0,
        gt=0,
        description="An in-flight slot whose holder died is freed after this long.",
    )
    reaction_webhook_retry_schedule_s: tuple[float, ...] = Field(
        # DECISIONS "Webhook signature": 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, then a dead letter.
        default=(5.0, 300.0, 1_800.0, 7_200.0, 18_000.0, 36_000.0),
        min_length=1,
        description="After a webhook's first failed attempt, the waits before each retry (one "
        "per retry); when the last retry fails too, the delivery becomes a dead letter.",
    )
    reaction_webhook_disable_after_s: float = Field(
        default=5 * 24 * 3600.0,
        gt=0,
        description="A webhook subscription whose endpoint failed every attempt for this long "
        "is disabled (reaction.disabled); one that answers 410 Gone is disabled at once.",
    )
    reaction_webhook_retry_batch: int = Field(
        default=100,
        ge=1,
        description="Webhook retries one sweep tick sends at most; the rest wait for the next.",
    )
    reaction_history_days: int = Field(
        default=14,
        ge=1,
        description="Days the reactions' bookkeeping (finished deliveries, suppressions, cause "
        "chains, admissions) is kept; the daily housekeeping deletes older rows.",
    )
    reaction_event_link: str = Field(
        default="/projects/{projectId}/events/{eventId}",
        min_length=1,
        description="Where a webhook receiver fetches the event its pointer names (a template "
        "of {projectId} and {eventId}).",
    )

    @field_validator("reaction_webhook_retry_schedule_s")
    @classmethod
    def _positive_waits(cls, schedule: tuple[float, ...]) -> tuple[float, ...]:
        if any(not wait > 0 for wait in schedule):
            raise ValueError(f"every retry wait must be over 0 s, got {list(schedule)}")
        return schedule

    @property
    def webhook_retry_policy(self) -> RetryPolicy:
        """The webhook ledger's retry schedule and disable window."""
        return RetryPolicy(
            self.reaction_webhook_retry_schedule_s, self.reaction_webhook_disable_after_s
        )
