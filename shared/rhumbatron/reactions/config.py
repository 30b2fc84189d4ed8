"""The reactions' tunables, each with the spec's value as its default (DECISIONS "Reactions").

They live here, not in :class:`~rhumbatron.runtime.settings.Settings`, until that file takes
them; they are read from the same ``RHUMBATRON_*`` environment variables.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    reaction_event_link: str = Field(
        default="/projects/{projectId}/events/{eventId}",
        min_length=1,
        description="Where a webhook receiver fetches the event its pointer names (a template "
        "of {projectId} and {eventId}).",
    )
