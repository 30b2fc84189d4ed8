"""The 1,000-command cap: counted types, per Change, per UTC day, atomic across routers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.causal.command_cap import DROPPED_METRIC, CommandCap
from rhumbatron.causal.store import CausalStore, CommandCount, StoredDecision
from rhumbatron.core.clock import ManualClock, utc_day
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import UnknownTypeError
from rhumbatron.metrics import MetricBinding, MetricsRecorder, RecordingSink, recent_points
from rhumbatron.protocol.command_types import COMMAND_TYPES
from rhumbatron.protocol.envelopes import Command
from rhumbatron.runtime.product_schema import open_product_database

COUNTED = ("change.dispatch", "candidate.create", "change.settle", "agent.wake")
NOT_COUNTED = ("index.build", "candidates.recompose")
NOON = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    def build(**overrides: Any) -> Settings:
        return load_settings(
            state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", **overrides
        )

    return build


@pytest.fixture
def stores() -> Iterator[list[CausalStore]]:
    opened: list[CausalStore] = []
    yield opened
    for store in opened:
        store.close()


def cap_for(settings: Settings, stores: list[CausalStore], **kwargs: Any) -> CommandCap:
    store = CausalStore(settings)
    stores.append(store)
    return CommandCap(settings, store, **kwargs)


def test_the_registry_counts_exactly_the_four_spec_types() -> None:
    counted = {name for name, spec in COMMAND_TYPES.items() if spec.counts_toward_change_cap}
    assert counted == set(COUNTED)
    for name in NOT_COUNTED:
        assert COMMAND_TYPES[name].counts_toward_change_cap is False


def test_default_cap_is_1000_per_change_per_day(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    # GIVEN the default settings
    cap = cap_for(make_settings(), stores)
    assert cap.limit == 1_000
    # WHEN 1,001 counted commands of one Change arrive on one day
    results = [cap.admit("chg-1", COUNTED[i % 4], NOON) for i in range(1_001)]
    # THEN the first 1,000 pass and the 1,001st is dropped
    assert results.count(True) == 1_000
    assert results[-1] is False
    assert cap.count("chg-1", utc_day(NOON)) == CommandCount(admitted=1_000, dropped=1)


@pytest.mark.parametrize("command_type", COUNTED)
def test_each_counted_type_is_capped(
    make_settings: Callable[..., Settings], stores: list[CausalStore], command_type: str
) -> None:
    cap = cap_for(make_settings(change_command_cap_per_day=2), stores)
    assert [cap.admit("chg-1", command_type, NOON) for _ in range(3)] == [True, True, False]


@pytest.mark.parametrize("command_type", NOT_COUNTED)
def test_index_build_and_recompose_are_never_capped_nor_counted(
    make_settings: Callable[..., Settings], stores: list[CausalStore], command_type: str
) -> None:
    # GIVEN a Change already at its cap
    cap = cap_for(make_settings(change_command_cap_per_day=1), stores)
    assert cap.admit("chg-1", "agent.wake", NOON)
    assert not cap.admit("chg-1", "agent.wake", NOON)
    # THEN uncounted types still pass, and count nothing
    assert all(cap.admit("chg-1", command_type, NOON) for _ in range(5))
    assert cap.count("chg-1", utc_day(NOON)) == CommandCount(admitted=1, dropped=1)


def test_a_command_without_a_change_is_never_capped(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    cap = cap_for(make_settings(change_command_cap_per_day=1), stores)
    assert all(cap.admit(None, "change.settle", NOON) for _ in range(5))


def test_the_cap_is_per_change(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    cap = cap_for(make_settings(change_command_cap_per_day=2), stores)
    for _ in range(2):
        assert cap.admit("chg-1", "agent.wake", NOON)
    assert not cap.admit("chg-1", "agent.wake", NOON)
    # another Change has its own count
    assert cap.admit("chg-2", "agent.wake", NOON)
    assert cap.count("chg-2", utc_day(NOON)) == CommandCount(admitted=1)


def test_the_count_restarts_each_utc_day(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    # GIVEN a Change capped late in the UTC day
    clock = ManualClock(datetime(2026, 3, 1, 23, 59, 30, tzinfo=UTC))
    cap = cap_for(make_settings(change_command_cap_per_day=2), stores)
    assert [cap.admit("chg-1", "change.dispatch", clock.now()) for _ in range(3)] == [
        True,
        True,
        False,
    ]
    # WHEN the clock crosses midnight UTC
    clock.advance(seconds=31)
    # THEN the Change may send again
    assert cap.admit("chg-1", "change.dispatch", clock.now())
    assert cap.count("chg-1", "2026-03-01") == CommandCount(admitted=2, dropped=1)
    assert cap.count("chg-1", "2026-03-02") == CommandCount(admitted=1)


def test_a_utc_day_is_not_a_local_day(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    # 01:00 at UTC+02:00 is still the previous UTC day
    cap = cap_for(make_settings(change_command_cap_per_day=1), stores)
    assert cap.admit("chg-1", "agent.wake", datetime(2026, 3, 1, 23, 0, tzinfo=UTC))
    local = datetime(2026, 3, 2, 1, 0, tzinfo=timezone(timedelta(hours=2)))
    assert not cap.admit("chg-1", "agent.wake", local)


def test_a_dropped_command_is_logged_as_an_error_and_counted(
    make_settings: Callable[..., Settings],
    stores: list[CausalStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a cap of 1 and a METRICS recorder
    settings = make_settings(change_command_cap_per_day=1)
    product = open_product_database(settings)
    sink = RecordingSink()
    cap = cap_for(
        settings, stores, metrics=MetricsRecorder(product.connection, sink, ManualClock(NOON))
    )
    try:
        assert cap.admit("chg-7", "candidate.create", NOON)
        # WHEN the second one is dropped
        with caplog.at_level(logging.ERROR, logger="rhumbatron.causal.command_cap"):
            assert not cap.admit("chg-7", "candidate.create", NOON, command_id="cmd_x_2")
        # THEN one ERROR names the Change, the type and the cap
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1
        assert errors[0].getMessage() == (
            "dropped candidate.create command cmd_x_2 of Change chg-7: the cap of 1 commands "
            f"per Change per UTC day is reached for {utc_day(NOON)}; the Change is likely "
            "looping, inspect its events"
        )
        # AND it is counted in the store and as a METRICS point
        assert cap.count("chg-7", utc_day(NOON)).dropped == 1
        points = recent_points(product.connection, DROPPED_METRIC)
        assert [(p.binding, p.dimensions["command_type"], p.event_id) for p in points] == [
            (MetricBinding.METRICS, "candidate.create", "cmd_x_2")
        ]
        assert [p.name for p in sink.points()] == [DROPPED_METRIC]
    finally:
        product.close()


def test_a_repeated_command_id_counts_once(
    make_settings: Callable[..., Settings],
    stores: list[CausalStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A redelivered Event plans the same command IDs: asking again changes no count.
    cap = cap_for(make_settings(change_command_cap_per_day=1), stores)
    assert cap.admit("chg-1", "agent.wake", NOON, command_id="cmd_a")
    assert cap.admit("chg-1", "agent.wake", NOON, command_id="cmd_a")
    with caplog.at_level(logging.ERROR):
        assert not cap.admit("chg-1", "agent.wake", NOON, command_id="cmd_b")
        assert not cap.admit("chg-1", "agent.wake", NOON, command_id="cmd_b")
    assert cap.count("chg-1", utc_day(NOON)) == CommandCount(admitted=1, dropped=1)
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


def test_admit_command_reads_the_envelope(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    cap = cap_for(make_settings(change_command_cap_per_day=1), stores)

    def wake(n: int) -> Command:
        return Command.create(
            command_id=f"cmd_tsk{n}_ready",
            command_type="agent.wake",
            project_id="acme-web",
            change_id="chg-1",
            created_at=NOON,
            payload={"agent_id": "a", "reason": "ready"},
        )

    assert cap.admit_command(wake(1), NOON)
    assert not cap.admit_command(wake(2), NOON)
    # a redelivered envelope is the same command: its first answer again, nothing counted
    assert cap.admit_command(wake(1), NOON)
    assert cap.count("chg-1", utc_day(NOON)) == CommandCount(admitted=1, dropped=1)


def test_a_drop_is_one_data_point_keyed_by_its_command() -> None:
    point = CommandCap.dropped_point("agent.wake", "cmd_tsk1_ready")
    assert (point.name, point.dimensions, point.event_id) == (
        DROPPED_METRIC,
        {"command_type": "agent.wake"},
        "cmd_tsk1_ready",
    )


def test_an_unknown_command_type_is_refused(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    cap = cap_for(make_settings(), stores)
    with pytest.raises(UnknownTypeError, match=r"agent\.sleep"):
        cap.admit("chg-1", "agent.sleep", NOON)


def test_two_concurrent_admitters_never_exceed_the_cap(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    # GIVEN two routers, each with its own connection to the same causal.sqlite
    settings = make_settings(change_command_cap_per_day=50)
    routers = [cap_for(settings, stores), cap_for(settings, stores)]
    # Open both files first: two connections switching a brand-new file to WAL at the same
    # instant can fail with "database is locked" (not the race under test).
    for store in stores:
        assert store.connection is not None
    admitted: list[int] = [0, 0]
    start = threading.Barrier(len(routers))

    failures: list[BaseException] = []

    def run(index: int) -> None:
        start.wait()
        try:
            for _ in range(60):
                if routers[index].admit("chg-1", "agent.wake", NOON):
                    admitted[index] += 1
        except BaseException as exc:  # a thread's error must fail the test, not vanish
            failures.append(exc)

    # WHEN both admit 60 commands of the same Change at once
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(routers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # THEN exactly 50 passed between them, and the other 70 were dropped
    assert failures == []
    assert sum(admitted) == 50
    assert routers[0].count("chg-1", utc_day(NOON)) == CommandCount(admitted=50, dropped=70)


def test_a_drop_without_a_command_id_says_so(
    make_settings: Callable[..., Settings],
    stores: list[CausalStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cap = cap_for(make_settings(change_command_cap_per_day=1), stores)
    assert cap.admit("chg-1", "change.settle", NOON)
    with caplog.at_level(logging.ERROR, logger="rhumbatron.causal.command_cap"):
        assert not cap.admit("chg-1", "change.settle", NOON)
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error.startswith("dropped change.settle command (no id) of Change chg-1:")


def test_a_change_never_counted_has_a_zero_count_in_the_causal_file(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    settings = make_settings()
    cap = cap_for(settings, stores)
    assert cap.count("chg-never", utc_day(NOON)) == CommandCount(admitted=0, dropped=0)
    # the counts live in the causal store's own file, which operators back up by name
    assert (settings.state_dir / "causal.sqlite").is_file()


def test_the_causal_bookkeeping_ages_out_past_the_claims_retention_within_the_limit(
    make_settings: Callable[..., Settings], stores: list[CausalStore]
) -> None:
    # GIVEN a decision, a model call, a counted command and its admission on an old day
    #   and on a fresh one
    store = CausalStore(make_settings())
    stores.append(store)
    old, fresh = NOON - timedelta(days=15), NOON
    for at in (old, fresh):
        tag = utc_day(at)
        store.record_decision(
            StoredDecision(
                f"evt-{tag}", "agent-1", "wake", 0.9, "r", "model", "haiku", None, at.timestamp()
            )
        )
        assert store.reserve_call(tag, "*", 200)
        assert store.admit_command(tag, "chg-1", 1_000, command_id=f"cmd-{tag}") == (True, True)
    # WHEN the rows from before 14 days ago are pruned, with a limit of 1 row a table, twice
    before_s = (NOON - timedelta(days=14)).timestamp()
    first = store.prune(before_s=before_s, limit=1)
    second = store.prune(before_s=before_s, limit=1)
    # THEN the first call took the old row of each of the 4 tables, the second found none,
    #   and every fresh row is kept
    assert (first, second) == (4, 0)
    assert [d.event_id for d in store.decisions()] == [f"evt-{utc_day(fresh)}"]
    assert store.calls(utc_day(old), "*") == 0
    assert store.calls(utc_day(fresh), "*") == 1
    assert store.command_count(utc_day(old), "chg-1") == CommandCount()
    assert store.command_count(utc_day(fresh), "chg-1") == CommandCount(1, 0)
    # AND a repeat of the fresh command still gets its first verdict (its admission is kept)
    assert store.admit_command(
        utc_day(fresh), "chg-1", 1_000, command_id=f"cmd-{utc_day(fresh)}"
    ) == (
        True,
        False,
    )
