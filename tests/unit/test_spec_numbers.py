"""docs/spec-numbers.md: every number of the specification is a default, and none drifts.

Tests shrink numbers for speed (a 15-call cap of 2, a 5-minute ack wait of 1 s); nothing
but this module would notice a default set to 1,000 instead of 15. It reads the table row by
row, looks each setting up, and compares it with the value the spec gives.
"""

from __future__ import annotations

import importlib
import itertools
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.router.ticks import tick_kind

TABLE = Path(__file__).resolve().parents[2] / "docs" / "spec-numbers.md"
_ROW = re.compile(r"^\| (S[02]-\d{3}) \| (.+?) \| `([^`]+)` \| (.+?) \|$")
_SECONDS = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_IN_UNIT = {"_s": 1.0, "_ms": 0.001, "_min": 60.0, "_days": 86400.0}

#: The numbers issue #14 names; each must have its row (a deleted row fails here).
REQUIRED = {
    "const.rhumbatron.protocol.ids.EVENT_STREAM_COUNT",
    "settings.publish_max_rows_per_project",
    "settings.router_fetch_max_records",
    "settings.router_consumes_per_run",
    "settings.router_apply_calls_per_run",
    "settings.router_nak_delay_s",
    "settings.router_ack_wait_s",
    "settings.router_max_failures",
    "settings.duplicate_window_s",
    "settings.event_stream_max_age_days",
    "settings.command_stream_max_age_days",
    "settings.processed_events_retention_days",
    "settings.archive_max_age_days",
    "settings.alarm_max_fires_per_day",
    "settings.clef_flash_max_calls_per_day",
    "settings.change_command_cap_per_day",
    "settings.max_active_agents_per_change",
    "settings.clef_flash_threshold",
    "settings.outbox_max_attempts",
    "settings.outbox_backoff_initial_s",
    "settings.outbox_backoff_max_s",
    "queue.integration.max_deliveries",
    "settings.integration_more_work_delay_s",
    "settings.conflict_review_delay_s",
    "settings.command_max_hold_s",
    "settings.command_in_progress_s",
    "settings.maintenance_time_utc",
    "tick.release_sweep_minutes_of_the_hour",
    "settings.release_recover_after_s",
    "settings.settle_quiet_min_s",
    "settings.settle_quiet_max_s",
    "settings.housekeeping_batch_cap",
    "settings.processed_events_prune_cap",
}


def _rows() -> list[tuple[str, str, str, str]]:
    rows = [m.groups() for line in TABLE.read_text().splitlines() if (m := _ROW.match(line))]
    assert rows, f"{TABLE} has no rows"
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def _tick_minutes(settings: Settings, which: str) -> Any:
    """What tick_kind decides, read off a whole day of minutes (the behaviour, not a field)."""
    midnight = datetime(2026, 3, 2, tzinfo=UTC)
    minutes = [midnight + timedelta(minutes=m) for m in range(24 * 60)]
    kinds = [(m, *tick_kind(settings, m)) for m in minutes]
    match which:
        case "release_sweep_minutes_of_the_hour":
            return sorted({m.minute for m, _, _, release in kinds if release})
        case "maintenance_minutes_of_the_day":
            (only,) = [m.hour * 60 + m.minute for m, _, daily, _ in kinds if daily]
            return only
        case "minutes_between_visits_of_a_stream":
            visits = [m for m, stream, _, _ in kinds if stream == 0]
            (gap,) = {int((b - a).total_seconds() // 60) for a, b in itertools.pairwise(visits)}
            return gap
    raise AssertionError(f"no tick probe {which!r}")


def _actual(name: str, settings: Settings, reactions: ReactionSettings) -> Any:
    kind, _, rest = name.partition(".")
    match kind:
        case "settings":
            return getattr(settings, rest)
        case "reactions":
            return getattr(reactions, rest)
        case "queue":
            queue, _, attribute = rest.rpartition(".")
            return getattr(QUEUE_CONSUMERS[queue], attribute)
        case "const":
            module, _, constant = rest.rpartition(".")
            return getattr(importlib.import_module(module), constant)
        case "tick":
            return _tick_minutes(settings, rest)
    raise AssertionError(f"unknown kind of setting {name!r}")


def _expected(name: str, text: str) -> Any:
    """The spec's value in the setting's own unit: ``5 min`` for a ``_s`` field is 300."""
    if "," in text:
        return [_expected(name, part.strip()) for part in text.split(",")]
    number = re.fullmatch(r"(\d+(?:\.\d+)?) (s|min|h|d)", text)
    if number:
        seconds = float(number.group(1)) * _SECONDS[number.group(2)]
        unit = next((v for suffix, v in _IN_UNIT.items() if name.endswith(suffix)), None)
        assert unit is not None, f"{name} has no unit in its name for {text!r}"
        return seconds / unit
    if re.fullmatch(r"\d+", text):
        return int(text)
    if re.fullmatch(r"\d+\.\d+", text):
        return float(text)
    return text


def test_every_number_of_the_specification_is_the_default() -> None:
    # GIVEN no configuration at all
    settings, reactions = load_settings(), ReactionSettings()
    # THEN each row's setting has the spec's value
    wrong = []
    for rule, said, name, value in _rows():
        actual = _actual(name, settings, reactions)
        if isinstance(actual, tuple):
            actual = list(actual)
        if actual != _expected(name, value):
            wrong.append(f"{rule} ({said}): {name} is {actual!r}, the spec says {value}")
    assert wrong == []


def test_every_number_the_issue_names_has_its_row() -> None:
    named = {name for _, _, name, _ in _rows()}
    assert REQUIRED - named == set()


@pytest.mark.parametrize(
    ("overrides", "row"),
    [
        ({"router_apply_calls_per_run": 1000}, "settings.router_apply_calls_per_run"),
        ({"processed_events_retention_days": 10}, "settings.processed_events_retention_days"),
        ({"processed_events_prune_cap": 50_000}, "settings.processed_events_prune_cap"),
        ({"release_sweep_every_min": 6}, "tick.release_sweep_minutes_of_the_hour"),
        ({"maintenance_time_utc": "04:18"}, "tick.maintenance_minutes_of_the_day"),
    ],
)
def test_a_changed_default_is_caught_by_its_row(overrides: dict[str, Any], row: str) -> None:
    # GIVEN a default that drifted (the review's examples: 15 calls set to 1,000, ...)
    settings = load_settings(**overrides)
    # THEN the row of that number no longer agrees
    value = next(v for _, _, name, v in _rows() if name == row)
    assert _actual(row, settings, ReactionSettings()) != _expected(row, value)
