"""The soak's logic (issue #17, ``make soak``), on a short run: the same checks, the same
figures, a few thousand events instead of a million (``bench/soak.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.soak import FLAT_TOLERANCE, DayFigures, SoakPlan, SoakResult, results_json, run_soak

pytestmark = pytest.mark.integration


async def test_a_short_soak_applies_archives_and_keeps_every_table_flat(tmp_path: Path) -> None:
    # GIVEN three simulated days of 3,000 events over 16 projects on all eight streams,
    #   sized for 10^8 a day, written hourly and swept hourly (the figures are the same kind)
    plan = SoakPlan(events=3_000, days=3, projects=16, write_every_min=60, sweep_every_min=60)

    # WHEN the soak runs on the embedded stack
    seen: list[tuple[int, int | None, str]] = []
    result = await run_soak(
        plan, tmp_path, progress=lambda done, total, note="": seen.append((done, total, note))
    )

    # THEN every check passes: nothing lost, every event applied and archived once, no dead
    #   letter, lag 0, every table flat after the first day, no ceiling warning
    assert result.checks() == dict.fromkeys(result.checks(), True)
    # AND the progress it reported rose to every event, a note at the end of each day
    assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
    assert seen[-1][:2] == (3_000, 3_000)
    assert [note for _, _, note in seen if note][-1].startswith("soak: day 3 of 3, 3,000 events")
    assert (result.events, result.lost, result.unapplied, result.unarchived) == (3_000, 0, 0, 0)
    assert len(result.days) == 3
    # AND the event tables did grow on the first day, so "flat" means something
    first = result.days[0].rows
    assert first["view.project_events"] > 0 and first["actor.outbox"] > 0
    # AND its figures are what the results file names
    figures = results_json(result)
    assert {
        "soak.events",
        "soak.lost",
        "soak.unarchived",
        "soak.max_table_growth_after_day1",
        "soak.commits_per_event",
        "soak.usd_per_million_at_1e8",
    } <= figures.keys()
    assert figures["soak.events"] == 3_000
    assert result.commits_by_role["actor"] > 0 and result.commits_by_role["publisher"] > 0
    json.dumps(figures)  # the file is JSON


def _day(day: int, outbox_rows: int) -> DayFigures:
    return DayFigures(day, day * 1_000, {"actor.outbox": outbox_rows}, {"actor": 4_096}, {})


def test_a_table_that_keeps_growing_after_the_first_day_fails_the_soak() -> None:
    result = SoakResult(SoakPlan())
    result.days = [_day(1, 1_000), _day(2, 2_000), _day(3, 2_000)]
    assert result.checks()["flat from day 2"]
    # 11 % above the second day's rows: past the 10 % the soak allows
    result.days[2] = _day(3, int(2_000 * (1 + FLAT_TOLERANCE)) + 20)
    assert not result.checks()["flat from day 2"]
    assert result.growth_after_day1()["rows actor.outbox"] > FLAT_TOLERANCE


def test_a_plan_that_cannot_show_a_steady_state_is_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match="--days 2"):
        SoakPlan(days=2).check()
    with pytest.raises(ValueError, match="--projects 4"):
        SoakPlan(projects=4).check()


def test_the_targets_are_a_million_events_in_twenty_minutes_half_a_commit_and_five_dollars() -> (
    None
):
    result = SoakResult(SoakPlan())
    result.events, result.wall_s = 1_000_000, 990.0
    result.commits_by_role = {"actor": 146_304, "publisher": 147_524, "router": 67_008}
    result.cpu_s_by_role = {"publisher": 244.0, "router": 367.0, "sweep": 91.0}
    result.nudges, result.alarm_fires, result.s3_puts = 9_200, 147_500, 11_000
    assert result.targets() == dict.fromkeys(result.targets(), True)
    # one commit per event more, beside the actor's: the commits and the cost both miss
    result.commits_by_role["publisher"] += 1_000_000
    missed = [name for name, ok in result.targets().items() if not ok]
    assert [name.split(" ")[0] for name in missed] == ["commits", "USD"]
    # and a short run never passes the first
    result.events = 999_999
    assert not result.targets()["1,000,000 events in under 20 minutes"]
