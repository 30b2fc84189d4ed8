"""The sweep's ceilings (issue #3 scale notes): computed from the settings, and warned about
when the streams carry more than a bounded job can keep up with."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from rhumbatron.core.settings import load_settings
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.router.capacity import (
    DRAIN_AT_SHARE,
    capacity_report,
    capacity_warnings,
    ceilings,
    drain_mode,
    report_for,
    sizing_warnings,
    stream_events_per_day,
    tick_prune_rows,
)
from rhumbatron.router.ticks import drain_plan, in_fetches, sweep_plan


def test_at_the_spec_values_the_archive_keeps_up_with_144000_events_a_day() -> None:
    limits = ceilings(load_settings())
    assert limits.archive_events_per_day == 144_000
    # analytics skips the 288 release-sweep ticks and the daily tick
    assert limits.analytics_events_per_day == (1_440 - 288 - 1) * 100
    assert limits.sweep_apply_events_per_day == 1_440 * 2 * 100
    # 5,000 claim rows a day, five per event (one per subscription, reactions included)
    assert limits.prune_events_per_day == 1_000


def test_raising_the_batch_settings_raises_the_ceilings() -> None:
    limits = ceilings(
        load_settings(
            archive_batch_size=500,
            archive_batches_per_tick=4,
            processed_events_prune_cap=400_000,
        )
    )
    assert limits.archive_events_per_day == 1_440 * 500 * 4
    assert limits.prune_events_per_day == 80_000


def test_a_rate_past_80_percent_of_a_ceiling_warns_naming_the_setting_to_raise() -> None:
    # 80 % of the archive's 144,000 is 115,200 (drain mode off: it would lift the ceiling)
    sweep_only = load_settings(router_drain_mode=False)
    warnings = capacity_warnings(sweep_only, observed_per_day=115_201)
    (archive,) = [w for w in warnings if "archive_events_per_day" in w]
    assert archive == (
        "the streams carry about 115,201 events a day, over 80% of archive_events_per_day "
        "(144,000): raise RHUMBATRON_ARCHIVE_BATCH_SIZE or RHUMBATRON_ARCHIVE_BATCHES_PER_TICK "
        "(see docs/operations.md)"
    )
    # (exactly 80 % is not past it)
    for below in (115_199, 115_200):
        at = capacity_warnings(sweep_only, observed_per_day=below)
        assert not [w for w in at if "archive_events_per_day" in w], below
    # with drain mode deciding (the default), that rate drains instead of warning
    assert not [
        w
        for w in capacity_warnings(load_settings(), observed_per_day=115_201)
        if "archive_events_per_day" in w
    ]
    # the prune sizes its chunks for the observed rate, so it is never the one that binds
    assert not [w for w in warnings if "prune_events_per_day" in w]
    assert capacity_warnings(load_settings(), observed_per_day=1_000) == []


def test_a_deployment_sized_above_a_ceiling_is_warned_at_start() -> None:
    assert sizing_warnings(load_settings()) == []
    warnings = sizing_warnings(
        load_settings(expected_events_per_day=200_000, router_drain_mode=False)
    )
    names = sorted(w.split(" but ")[1].split(" is ")[0] for w in warnings)
    # 200,000 a day on the sweep's cadence alone: above the archive, analytics and the
    # 15-call ceilings; the prune is sized for it
    assert names == [
        "analytics_events_per_day",
        "archive_events_per_day",
        "sweep_apply_calls_per_day",
    ]
    assert all("sized for 200,000 events a day" in w for w in warnings)
    # in drain mode (which that sizing turns on) only the 15-call ceiling is left: it binds
    # with nudges off
    drained = sizing_warnings(load_settings(expected_events_per_day=200_000))
    assert [w.split(" but ")[1].split(" is ")[0] for w in drained] == ["sweep_apply_calls_per_day"]


def test_while_nudges_run_the_projectors_sweep_only_ceilings_warn_of_nothing() -> None:
    # sized for 10^8 a day in drain mode: only the projector's sweep-only ceilings are below
    settings = load_settings(expected_events_per_day=100_000_000)
    names = sorted(w.split(" but ")[1].split(" is ")[0] for w in sizing_warnings(settings))
    assert names == ["sweep_apply_calls_per_day", "sweep_apply_events_per_day"]
    assert sizing_warnings(settings, nudged=True) == []
    # and the rate of 10^8 a day passes 80 % of them only while nothing nudges
    observed = capacity_warnings(settings, observed_per_day=1e8)
    assert {w.split(" of ")[1].split(" ")[0] for w in observed} == {
        "sweep_apply_calls_per_day",
        "sweep_apply_events_per_day",
    }
    assert capacity_warnings(settings, observed_per_day=1e8, nudged=True) == []


# -- the prune that keeps up with the volume (issue #17) --------------------------------------


def test_at_the_default_sizing_only_the_daily_tick_prunes() -> None:
    # 1,000 events a day leave at most 5,000 claim rows: the spec's daily cap keeps up
    settings = load_settings()
    assert settings.expected_events_per_day == 1_000
    assert tick_prune_rows(settings) == 0
    assert tick_prune_rows(settings, observed_per_day=1_000) == 0


def test_sized_for_a_million_events_a_day_every_tick_prunes_twice_the_inflow() -> None:
    settings = load_settings(expected_events_per_day=1_000_000)
    # 5 × 10⁶ claim rows a day at most; twice that over 1,440 ticks
    assert tick_prune_rows(settings) == math.ceil(2 * 5_000_000 / 1_440) == 6_945
    # ... and the prune ceiling is above the sized volume, with room
    assert ceilings(settings).prune_events_per_day >= 2 * 1_000_000 - 2_000


def test_a_rate_observed_above_the_sizing_sizes_the_chunks() -> None:
    settings = load_settings()
    assert tick_prune_rows(settings, observed_per_day=144_000) == math.ceil(2 * 720_000 / 1_440)
    # a rate below the sizing does not shrink them
    sized = load_settings(expected_events_per_day=144_000)
    assert tick_prune_rows(sized, observed_per_day=10) == tick_prune_rows(sized)


def test_a_batch_above_the_fetch_cap_is_fetched_in_full_fetches_and_the_ceiling_is_true() -> None:
    # GIVEN archive batches of 1,000 records, over the spec's fetch cap of 100
    settings = load_settings(archive_batch_size=1_000, analytics_batch_size=250)
    plan = {
        s.value: (consumes, batch) for s, consumes, batch in sweep_plan(settings, analytics=True)
    }
    # THEN a tick fetches ten full fetches of 100 for the archiver (three for analytics' 250)
    assert plan["audit-archiver"] == (10, 100)
    assert plan["analytics-projector"] == (3, 100)
    assert in_fetches(settings, 2, 1_000) == (20, 100)
    # AND the ceiling counts what those fetches move: 1,440 ticks × 1,000
    assert ceilings(settings).archive_events_per_day == 1_440_000
    # at the spec's values nothing changes: one fetch of 100 a tick
    assert in_fetches(load_settings(), 1, 100) == (1, 100)


def test_the_operations_table_shows_every_ceiling_the_code_computes() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = page.split("## The event router's ceilings", 1)[1].split("\n## ", 1)[0]
    shown: dict[str, int] = {}
    for line in section.splitlines():
        field = re.search(r"\| `([a-z_]+)` \|$", line)
        figure = re.search(r"\*\*([\d,]+)\*\*", line)
        if field and figure:
            shown[field.group(1)] = int(figure.group(1).replace(",", ""))
    assert shown == ceilings(load_settings()).as_dict()


# -- drain mode (the archiver, analytics and reactions drain above a sized rate) ----------


def test_the_default_sizing_keeps_the_specs_cadences() -> None:
    settings = load_settings()
    assert not drain_mode(settings)
    assert not drain_mode(settings, observed_per_day=1_000)
    assert sweep_plan(settings, analytics=True) == sweep_plan(settings, analytics=True, drain=False)
    assert ceilings(settings).archive_events_per_day == 144_000


def test_drain_mode_starts_above_half_of_the_lowest_sweep_only_ceiling() -> None:
    analytics_ceiling = ceilings(load_settings()).analytics_events_per_day
    assert analytics_ceiling == 115_100  # the lowest of archive, analytics and reactions
    threshold = DRAIN_AT_SHARE * analytics_ceiling
    assert not drain_mode(load_settings(expected_events_per_day=int(threshold)))
    assert drain_mode(load_settings(expected_events_per_day=int(threshold) + 1))
    # the rate the streams were seen to carry counts too
    assert drain_mode(load_settings(), observed_per_day=threshold + 1)


def test_in_drain_mode_the_ceilings_are_every_tick_draining_every_stream() -> None:
    settings = load_settings(expected_events_per_day=1_000_000)
    drained = 1_440 * 8 * settings.router_drain_max_fetches * 100
    limits = ceilings(settings)
    assert limits.archive_events_per_day == limits.analytics_events_per_day == drained
    assert limits.reactions_events_per_day == drained
    assert drained > 10**8
    assert [step[0] for step in drain_plan(settings)] == [
        Subscription.AUDIT_ARCHIVER,
        Subscription.ANALYTICS_PROJECTOR,
        Subscription.REACTIONS,
    ]
    assert [step[0] for step in drain_plan(settings, analytics=False)] == [
        Subscription.AUDIT_ARCHIVER,
        Subscription.REACTIONS,
    ]


# -- the capacity alarm's point ---------------------------------------------------------------


async def test_the_capacity_point_is_the_share_of_the_tightest_ceiling_that_binds() -> None:
    # nudges off (no router-nudge function): the projector's 15-call ceiling, 21,600, binds
    quiet = await capacity_report(load_settings(), None)
    assert quiet.used_percent is None  # no rate measured, no point
    report = dataclasses.replace(quiet, observed_events_per_day=10_800.0)
    assert report.used_percent == pytest.approx(50.0)
    # nudged: the tightest is then analytics' sweep-only 115,100
    nudged = dataclasses.replace(report, nudged=True)
    assert nudged.used_percent == pytest.approx(100 * 10_800 / 115_100)
    settings = load_settings(router_nudge_function="rhumbatron-router-nudge")
    assert (await capacity_report(settings, None)).nudged
    # the router says what it saw, whatever its own settings name
    assert (await capacity_report(load_settings(), None, nudged=True)).nudged
    assert not (await capacity_report(settings, None, nudged=False)).nudged


def test_a_streams_rate_is_its_messages_over_the_span_of_its_first_and_last_message() -> None:
    # GIVEN stream-info states as JetStream writes them (RFC 3339, nanoseconds, Z)
    def state(first: str, last: str, messages: int) -> dict[str, object]:
        return {"first_ts": first, "last_ts": last, "messages": messages}

    two_minutes = state("2026-03-02T10:00:00.123456789Z", "2026-03-02T10:02:00.123456999Z", 120)
    # THEN 120 messages over two minutes are 86,400 a day
    assert stream_events_per_day(two_minutes) == pytest.approx(86_400)
    # AND a span of exactly a minute counts; a shorter one, or no message, tells nothing
    minute = state("2026-03-02T10:00:00Z", "2026-03-02T10:01:00Z", 10)
    assert stream_events_per_day(minute) == pytest.approx(14_400)
    short = state("2026-03-02T10:00:00.000000000Z", "2026-03-02T10:00:59.999999000Z", 10)
    assert stream_events_per_day(short) == 0
    assert stream_events_per_day(state("2026-03-02T10:00:00Z", "2026-03-02T10:05:00Z", 0)) == 0
    assert stream_events_per_day({"messages": 5, "first_ts": "2026-03-02T10:00:00Z"}) == 0
    assert stream_events_per_day({"messages": 5, "last_ts": "2026-03-02T10:05:00Z"}) == 0
    assert stream_events_per_day({}) == 0


def test_the_report_sizes_every_figure_for_the_observed_rate_and_warns_of_it() -> None:
    # GIVEN a deployment sized for the default, whose streams carry 500,000 events a day
    settings = load_settings(router_drain_mode=None)
    observed = 500_000.0
    # WHEN the report is made, nudges on
    report = report_for(settings, observed, nudged=True)
    # THEN the prune's chunk, the ceilings and drain mode are those of the observed rate
    assert report.observed_events_per_day == observed
    assert (
        report.tick_prune_rows
        == tick_prune_rows(settings, observed)
        > tick_prune_rows(settings, None)
    )
    assert report.ceilings == ceilings(settings, observed) != ceilings(settings, None)
    assert report.drain_mode is True and drain_mode(settings, None) is False
    # AND its warnings are the sizing's and the rate's, judged with the nudges on (the
    # projector's sweep-only ceilings do not bind then)
    rate_warnings = capacity_warnings(settings, observed, nudged=True)
    assert rate_warnings != capacity_warnings(settings, observed, nudged=False)
    assert report.warnings == sizing_warnings(settings, nudged=True) + rate_warnings
    # AND with no rate read, only the sizing warns, judged with the nudges as they are
    sized = load_settings(expected_events_per_day=200_000, router_drain_mode=False)
    assert sizing_warnings(sized, nudged=True) != sizing_warnings(sized, nudged=False)
    for nudged in (True, False):
        assert report_for(sized, None, nudged=nudged).warnings == sizing_warnings(
            sized, nudged=nudged
        )


def test_the_ceilings_count_whole_ticks_and_whole_rows() -> None:
    # GIVEN a release sweep every 7 minutes: analytics skips its 205 ticks and the daily one
    odd = load_settings(release_sweep_every_min=7, router_drain_mode=False)
    # THEN analytics carries 1,234 ticks of 100 events a day
    assert ceilings(odd).analytics_events_per_day == 1_234 * 100
    # AND the prune deletes its daily cap on the daily tick and its chunk on the 1,439 others,
    # and each event leaves up to one row per subscription (5): whole events
    capped = load_settings(processed_events_prune_cap=5_001)
    rows = tick_prune_rows(capped, 1e6)
    assert rows > 0
    prune = ceilings(capped, 1e6).prune_events_per_day
    assert prune == (5_001 + 1_439 * rows) // 5
    assert isinstance(prune, int)
