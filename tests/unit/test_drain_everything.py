"""The local drain (`drain_everything`): rounds of one fetch of every subscription of every
stream, until a round moves nothing. Driven here through a router that answers each consume
from a script, so a round's counts can be set exactly."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.router.handlers import RecordHandler, RunContext
from rhumbatron.router.other_streams import drain_everything
from rhumbatron.router.reports import SubscriptionReport


class ScriptedRouter:
    """A :class:`~rhumbatron.router.ports.ConsumingRouter` whose consumes answer from
    ``rounds``: round N's first consume gets ``rounds[N]``, every other consume nothing."""

    def __init__(self, rounds: list[SubscriptionReport]) -> None:
        self.rounds = rounds
        self.consumes = 0
        self.released = 0
        self._settings = load_settings(nats_url="nats://127.0.0.1:1")

    @property
    def settings(self) -> Settings:
        return self._settings

    def run_context(self, stream_index: int) -> RunContext:
        return RunContext(stream_index, now_s=0.0, apply_calls_left=15)

    def handler(self, stream_index: int, subscription: Subscription) -> RecordHandler:
        raise AssertionError("the local drain reads no handler")

    async def consume(
        self,
        run: RunContext,
        subscription: Subscription,
        *,
        consumes: int,
        batch: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> SubscriptionReport:
        assert (consumes, batch) == (1, self._settings.router_fetch_max_records)
        per_round = 8 * len(Subscription)
        round_number, position = divmod(self.consumes, per_round)
        self.consumes += 1
        if position == 0 and round_number < len(self.rounds):
            return self.rounds[round_number]
        return SubscriptionReport()

    async def release_held(self, stream_index: int | None = None) -> int:
        self.released += 1
        return 0


@pytest.mark.parametrize(
    "first_round",
    [
        SubscriptionReport(applied=1, duplicates=1),
        SubscriptionReport(applied=1, dead_lettered=1),
        SubscriptionReport(duplicates=2, dead_lettered=1),
    ],
)
async def test_the_local_drain_goes_on_while_a_round_moves_anything(
    first_round: SubscriptionReport,
) -> None:
    # GIVEN a first round that moved records (of any kind), a second that applied 2, and
    # nothing after
    router = ScriptedRouter([first_round, SubscriptionReport(applied=2, deferred=1)])
    # WHEN everything is drained
    totals = await drain_everything(router, max_rounds=10)
    # THEN it ran three rounds (the third moved nothing), summed every count, and released
    # what the runs held
    assert router.consumes == 3 * 8 * len(Subscription)
    assert totals["applied"] == first_round.applied + 2
    assert totals["duplicates"] == first_round.duplicates
    assert totals["dead_lettered"] == first_round.dead_lettered
    assert (totals["deferred"], totals["failed"]) == (1, 0)
    assert router.released == 1


async def test_the_local_drain_stops_at_its_rounds_and_when_a_round_only_defers() -> None:
    # GIVEN rounds that keep applying
    busy = ScriptedRouter([SubscriptionReport(applied=1)] * 5)
    # WHEN drained with at most 3 rounds  THEN it stops there
    assert (await drain_everything(busy, max_rounds=3))["applied"] == 3
    # AND a round that only defers or fails records moved nothing: the drain ends after it
    stuck = ScriptedRouter([SubscriptionReport(deferred=4, failed=1)] * 5)
    totals = await drain_everything(stuck, max_rounds=10)
    assert stuck.consumes == 8 * len(Subscription)
    assert (totals["deferred"], totals["failed"]) == (4, 1)
