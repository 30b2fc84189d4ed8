"""The housekeeping planner (spec "Sweep housekeeping" table, "Queues"; DECISIONS "Maintenance
ticks"): which tick queues what, the caps, the windows and the stable command IDs."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import NatsUnavailableError
from rhumbatron.lifecycle.housekeeping import (
    PLATFORM_PROJECT_ID,
    Housekeeper,
    HousekeepingPlan,
    QuietChange,
    ReleasingChange,
    plan_housekeeping,
)
from rhumbatron.messaging.commands import CommandBus
from rhumbatron.protocol.envelopes import Command

DAILY = datetime(2026, 11, 29, 4, 17, tzinfo=UTC)
SWEEP = datetime(2026, 11, 29, 18, 4, tzinfo=UTC)

DAILY_SET = ["forks.sweep", "project.cleanup", "index.purge", "index.build"]
RELEASE_SET = ["release.recover", "change.settle", "index.purge"]


@dataclass
class World:
    """Fixed answers, offered in full whatever the limit (so the planner's own cap shows), and
    a record of every question asked."""

    archived: list[str] = field(default_factory=lambda: ["arch-1"])
    unindexed: list[str] = field(default_factory=lambda: ["new-1"])
    deleted: list[str] = field(default_factory=lambda: ["gone-1"])
    releasing: list[ReleasingChange] = field(
        default_factory=lambda: [
            ReleasingChange("acme-web", "chg-1", "rel-1", SWEEP - timedelta(hours=1))
        ]
    )
    quiet: list[QuietChange] = field(
        default_factory=lambda: [
            QuietChange("acme-web", "chg-2", "verifying", SWEEP - timedelta(minutes=10))
        ]
    )
    asked: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)

    def archived_projects(self, limit: int) -> list[str]:
        self.asked.append(("archived_projects", (limit,)))
        return self.archived

    def active_projects_without_ready_index(self, limit: int) -> list[str]:
        self.asked.append(("active_projects_without_ready_index", (limit,)))
        return self.unindexed

    def deleted_projects_with_index_rows(self, limit: int) -> list[str]:
        self.asked.append(("deleted_projects_with_index_rows", (limit,)))
        return self.deleted

    def releasing_changes(self, promoted_before: datetime, limit: int) -> list[ReleasingChange]:
        self.asked.append(("releasing_changes", (promoted_before, limit)))
        return self.releasing

    def quiet_changes(
        self, updated_after: datetime, updated_before: datetime, limit: int
    ) -> list[QuietChange]:
        self.asked.append(("quiet_changes", (updated_after, updated_before, limit)))
        return self.quiet


def crowded_world(count: int) -> World:
    """A world offering ``count`` of everything."""
    old = SWEEP - timedelta(hours=1)
    return World(
        archived=[f"arch-{n}" for n in range(count)],
        unindexed=[f"new-{n}" for n in range(count)],
        deleted=[f"gone-{n}" for n in range(count)],
        releasing=[ReleasingChange("acme-web", f"c{n}", f"rel-{n}", old) for n in range(count)],
        quiet=[QuietChange("acme-web", f"q{n}", "verifying", old) for n in range(count)],
    )


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")


def kinds(plan: HousekeepingPlan) -> list[str]:
    """The command types of a plan, each once, in send order."""
    return list(dict.fromkeys(p.command.command_type for p in plan.commands))


def by_type(plan: HousekeepingPlan, command_type: str) -> list[Command]:
    return [p.command for p in plan.commands if p.command.command_type == command_type]


# -- which tick queues what -------------------------------------------------------------------


def test_the_0417_tick_queues_exactly_the_daily_set(settings: Settings) -> None:
    # GIVEN one archived Project and one active Project without a ready index
    world = World()
    # WHEN the 04:17 UTC tick plans
    plan = plan_housekeeping(world, settings, DAILY)
    # THEN it is the daily tick only, and queues the daily set with its stable IDs and queues
    assert (plan.daily, plan.release_sweep) == (True, False)
    assert [(p.queue, p.command.command_type, p.command.command_id) for p in plan.commands] == [
        ("integration", "forks.sweep", "cmd_forks_sweep_20261129"),
        ("integration", "project.cleanup", "cmd_cleanup_arch-1_20261129"),
        ("indexing", "index.purge", "cmd_index_purge_arch-1_20261129"),
        ("indexing", "index.build", "cmd_index_backfill_new-1_20261129"),
    ]
    # AND the release-sweep questions were never asked
    assert [name for name, _ in world.asked] == [
        "archived_projects",
        "active_projects_without_ready_index",
    ]


def test_the_daily_commands_carry_the_payloads_and_projects_the_spec_names(
    settings: Settings,
) -> None:
    plan = plan_housekeeping(World(), settings, DAILY)
    sweep, cleanup, purge, build = (p.command for p in plan.commands)
    # forks.sweep is about no one Project: it carries the platform placeholder
    assert (sweep.project_id, sweep.change_id, sweep.payload.model_dump()) == (
        PLATFORM_PROJECT_ID,
        None,
        {},
    )
    assert (cleanup.project_id, cleanup.payload.model_dump()) == ("arch-1", {"reason": "archived"})
    assert (purge.project_id, purge.payload.model_dump()) == ("arch-1", {"reason": "archived"})
    assert (build.project_id, build.payload.model_dump()) == (
        "new-1",
        {"generation": None, "reason": "backfill"},
    )
    assert {c.created_at for c in (sweep, cleanup, purge, build)} == {DAILY}


def test_a_release_sweep_tick_queues_exactly_the_release_set(settings: Settings) -> None:
    # GIVEN a Change still releasing, a quiet Change and a deleted Project with index rows
    world = World()
    # WHEN the 18:04 tick plans
    plan = plan_housekeeping(world, settings, SWEEP)
    # THEN it is a release-sweep tick only, and queues the release set
    assert (plan.daily, plan.release_sweep) == (False, True)
    assert [(p.queue, p.command.command_type, p.command.command_id) for p in plan.commands] == [
        ("integration", "release.recover", "cmd_recover_rel-1_202611291804"),
        ("integration", "change.settle", "cmd_settle_chg-2_202611291804"),
        ("indexing", "index.purge", "cmd_index_purge_gone-1_202611291804"),
    ]
    recover, settle, purge = (p.command for p in plan.commands)
    assert (recover.project_id, recover.change_id, recover.payload.model_dump()) == (
        "acme-web",
        "chg-1",
        {"release_id": "rel-1"},
    )
    assert (settle.change_id, settle.payload.model_dump()["reason"]) == (
        "chg-2",
        "quiet in verifying since 2026-11-29T17:54:00.000Z",
    )
    assert (purge.project_id, purge.change_id, purge.payload.model_dump()) == (
        "gone-1",
        None,
        {"reason": "deleted"},
    )
    # AND the daily questions were never asked
    assert [name for name, _ in world.asked] == [
        "releasing_changes",
        "quiet_changes",
        "deleted_projects_with_index_rows",
    ]


@pytest.mark.parametrize(
    "minute",
    [
        datetime(2026, 11, 29, 18, 5, tzinfo=UTC),
        datetime(2026, 11, 29, 4, 16, tzinfo=UTC),
        datetime(2026, 11, 29, 4, 18, tzinfo=UTC),
        datetime(2026, 11, 29, 0, 0, tzinfo=UTC),
        datetime(2026, 11, 29, 16, 17, tzinfo=UTC),
    ],
)
def test_a_minute_that_is_no_housekeeping_tick_queues_nothing_and_asks_nothing(
    settings: Settings, minute: datetime
) -> None:
    world = World()
    plan = plan_housekeeping(world, settings, minute)
    assert (plan.daily, plan.release_sweep, plan.commands, world.asked) == (False, False, [], [])


@pytest.mark.parametrize("hour_minute", [(4, 19), (4, 14), (4, 4), (23, 59), (0, 4)])
def test_release_sweep_minutes_around_the_daily_tick_get_only_the_release_set(
    settings: Settings, hour_minute: tuple[int, int]
) -> None:
    # GIVEN a minute 4, 9, 14 … of the hour other than 04:17 (19 % 5 == 4: 04:19 is one)
    hour, minute = hour_minute
    now = datetime(2026, 11, 29, hour, minute, tzinfo=UTC)
    # WHEN it plans THEN only the release set is queued
    plan = plan_housekeeping(World(), settings, now)
    assert (plan.daily, plan.release_sweep) == (False, True)
    assert kinds(plan) == RELEASE_SET


def test_a_tick_given_in_another_timezone_is_read_in_utc(settings: Settings) -> None:
    # 05:17 at UTC+1 is the 04:17 UTC tick
    plus_one = DAILY.astimezone(timezone(timedelta(hours=1)))
    plan = plan_housekeeping(World(), settings, plus_one)
    assert kinds(plan) == DAILY_SET
    assert plan.command_ids[0] == "cmd_forks_sweep_20261129"


# -- caps and windows -------------------------------------------------------------------------


def test_each_daily_kind_is_capped_at_ten_although_the_world_offers_25(
    settings: Settings,
) -> None:
    # GIVEN 25 archived Projects and 25 without a ready index
    world = crowded_world(25)
    # WHEN the daily tick plans
    plan = plan_housekeeping(world, settings, DAILY)
    # THEN the world was asked for 10 of each, and 10 of each are queued
    assert world.asked == [
        ("archived_projects", (10,)),
        ("active_projects_without_ready_index", (10,)),
    ]
    counts = {kind: len(by_type(plan, kind)) for kind in DAILY_SET}
    assert counts == {"forks.sweep": 1, "project.cleanup": 10, "index.purge": 10, "index.build": 10}
    # AND cleanup and purge name the same ten Projects
    assert [c.project_id for c in by_type(plan, "project.cleanup")] == [
        c.project_id for c in by_type(plan, "index.purge")
    ]


def test_each_release_sweep_kind_is_capped_at_ten_although_the_world_offers_25(
    settings: Settings,
) -> None:
    world = crowded_world(25)
    plan = plan_housekeeping(world, settings, SWEEP)
    assert [args[-1] for _, args in world.asked] == [10, 10, 10]
    counts = {kind: len(by_type(plan, kind)) for kind in RELEASE_SET}
    assert counts == {"release.recover": 10, "change.settle": 10, "index.purge": 10}


def test_the_cap_is_the_housekeeping_batch_cap_setting(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, housekeeping_batch_cap=3)
    world = crowded_world(25)
    plan = plan_housekeeping(world, settings, SWEEP)
    assert [args[-1] for _, args in world.asked] == [3, 3, 3]
    assert len(plan.commands) == 9


def test_the_windows_passed_to_the_world_are_45_minutes_3_minutes_and_6_hours(
    settings: Settings,
) -> None:
    world = World()
    plan_housekeeping(world, settings, SWEEP)
    asked = dict(world.asked)
    assert asked["releasing_changes"] == (SWEEP - timedelta(minutes=45), 10)
    assert asked["quiet_changes"] == (
        SWEEP - timedelta(hours=6),
        SWEEP - timedelta(minutes=3),
        10,
    )


def test_the_windows_follow_the_settings(tmp_path: Path) -> None:
    settings = load_settings(
        state_dir=tmp_path,
        release_recover_after_s=600,
        settle_quiet_min_s=60,
        settle_quiet_max_s=3_600,
    )
    world = World()
    plan_housekeeping(world, settings, SWEEP)
    asked = dict(world.asked)
    assert asked["releasing_changes"][0] == SWEEP - timedelta(minutes=10)
    assert asked["quiet_changes"][:2] == (SWEEP - timedelta(hours=1), SWEEP - timedelta(minutes=1))


# -- stable command IDs -----------------------------------------------------------------------


def test_two_plans_of_the_same_minute_have_the_same_ids(settings: Settings) -> None:
    # GIVEN a tick that runs twice (a retried Lambda), the second time late in the minute
    first = plan_housekeeping(crowded_world(3), settings, SWEEP)
    again = plan_housekeeping(crowded_world(3), settings, SWEEP + timedelta(seconds=59))
    # THEN both plans carry the same command IDs: JetStream drops the repeat
    assert first.command_ids == again.command_ids
    assert len(set(first.command_ids)) == len(first.command_ids)
    daily = plan_housekeeping(crowded_world(3), settings, DAILY)
    daily_again = plan_housekeeping(crowded_world(3), settings, DAILY + timedelta(seconds=30))
    assert daily.command_ids == daily_again.command_ids


def test_the_next_tick_and_the_next_day_get_new_ids(settings: Settings) -> None:
    sweep = plan_housekeeping(crowded_world(3), settings, SWEEP)
    next_sweep = plan_housekeeping(crowded_world(3), settings, SWEEP + timedelta(minutes=5))
    assert set(sweep.command_ids).isdisjoint(next_sweep.command_ids)
    daily = plan_housekeeping(crowded_world(3), settings, DAILY)
    tomorrow = plan_housekeeping(crowded_world(3), settings, DAILY + timedelta(days=1))
    assert set(daily.command_ids).isdisjoint(tomorrow.command_ids)
    assert tomorrow.command_ids[0] == "cmd_forks_sweep_20261130"


def test_the_longest_identifiers_still_make_command_ids_stably(settings: Settings) -> None:
    # GIVEN a 128-character release ID and a 128-character Change ID (the longest identifiers
    # the envelopes take; one with a space or a '/' is refused before it gets here)
    odd_release = "rel_" + "r" * 124
    long_change = "c" * 128
    old = SWEEP - timedelta(hours=1)
    world = World(
        releasing=[ReleasingChange("acme-web", "chg-1", odd_release, old)],
        quiet=[QuietChange("acme-web", long_change, "verifying", old)],
    )
    # WHEN it plans twice
    first = plan_housekeeping(world, settings, SWEEP)
    again = plan_housekeeping(world, settings, SWEEP)
    # THEN the commands were built (the envelope accepted the IDs), stable across plans
    recover, settle = by_type(first, "release.recover")[0], by_type(first, "change.settle")[0]
    assert recover.command_id == f"cmd_recover_{odd_release}_202611291804"
    assert settle.command_id == f"cmd_settle_{long_change}_202611291804"
    assert first.command_ids == again.command_ids
    # AND the payload still carries the release ID as it is
    assert recover.payload.model_dump() == {"release_id": odd_release}


# -- the Housekeeper without a bus --------------------------------------------------------------


async def test_a_minute_without_housekeeping_never_reaches_for_the_bus(
    settings: Settings,
) -> None:
    async def no_bus() -> CommandBus:
        raise AssertionError("a quiet minute must not connect")

    clock = ManualClock(datetime(2026, 11, 29, 18, 5, tzinfo=UTC))
    report = await Housekeeper(World(), settings, clock, no_bus).run()
    assert (report.command_ids, report.total_sent, report.total_failed) == ([], 0, 0)


async def test_an_unreachable_bus_counts_every_command_failed(settings: Settings) -> None:
    # GIVEN a bus that cannot connect
    async def unreachable() -> CommandBus:
        raise NatsUnavailableError("no server at nats://127.0.0.1:1")

    # WHEN the release sweep runs
    report = await Housekeeper(World(), settings, ManualClock(SWEEP), unreachable).run()
    # THEN nothing is raised; every planned command is reported failed for the next tick
    assert report.failed == {"release.recover": 1, "change.settle": 1, "index.purge": 1}
    assert report.failed_ids == report.command_ids
    assert (report.total_sent, report.total_duplicates) == (0, 0)
