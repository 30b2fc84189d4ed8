"""At start-up the windows are checked against each other, and every misfit is named with its
settings, their values and what to change (issue #7; seed 002 "Delivery semantics", EO4)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.core.retention import (
    check_retention,
    command_wait_s,
    publish_resend_span_s,
    retention_misfits,
)
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import ConfigurationError, RetentionMisfitError
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS, QueueConsumer
from rhumbatron.runtime.bootstrap import bootstrap

_DAY_S = 86_400
#: "field=value (RHUMBATRON_FIELD)": how the message names each setting a rule reads.
_NAMED = re.compile(r"(\w+)=(.+?) \((RHUMBATRON_\w+)\)")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RHUMBATRON_* variable from the caller's shell leaks into the settings."""
    for name in list(os.environ):
        if name.startswith("RHUMBATRON_"):
            monkeypatch.delenv(name)


def _refusal(**overrides: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**overrides)
    return str(caught.value)


def _named(message: str) -> dict[str, str]:
    """The settings a message names: field -> the value it shows."""
    named = {}
    for field, value, env_name in _NAMED.findall(message):
        assert env_name == f"RHUMBATRON_{field.upper()}"
        named[field] = value
    return named


def _effective(field: str, overrides: dict[str, Any]) -> Any:
    return overrides[field] if field in overrides else Settings.model_fields[field].default


#: One rule broken alone: the overrides that break it, and exactly the settings it names.
_ONE_RULE = {
    "lag shorter than the sweep's round": (
        {"max_consumer_lag_s": 60},
        {"max_consumer_lag_s"},
    ),
    "lag plus replay window equal to the event stream": (
        {"replay_window_days": 6},
        {"event_stream_max_age_days", "max_consumer_lag_s", "replay_window_days"},
    ),
    "event stream shorter than lag plus replay": (
        {"event_stream_max_age_days": 5.5},
        {"event_stream_max_age_days", "max_consumer_lag_s", "replay_window_days"},
    ),
    "claims deleted before their events": (
        {"processed_events_retention_days": 6},
        {"processed_events_retention_days", "event_stream_max_age_days"},
    ),
    "published rows deleted before their events": (
        {"outbox_published_retention_days": 6, "reconcile_window_days": 5},
        {"outbox_published_retention_days", "event_stream_max_age_days"},
    ),
    "published rows deleted inside the reconciliation window": (
        {"reconcile_window_days": 8},
        {"outbox_published_retention_days", "reconcile_window_days"},
    ),
    "duplicate window longer than the event stream": (
        {"duplicate_window_s": 8 * _DAY_S},
        {"duplicate_window_s", "event_stream_max_age_days"},
    ),
    "duplicate window longer than both streams": (
        {"duplicate_window_s": 15 * _DAY_S},
        {"duplicate_window_s", "event_stream_max_age_days", "command_stream_max_age_days"},
    ),
    "duplicate window shorter than the publisher's backoff": (
        {"duplicate_window_s": 600},
        {
            "duplicate_window_s",
            "outbox_max_attempts",
            "outbox_backoff_initial_s",
            "outbox_backoff_max_s",
            "outbox_backoff_jitter",
            "publish_ack_timeout_s",
        },
    ),
    "an operator Retry resent only after the duplicate window": (
        {"api_retry_resend_after_s": 2 * 3600},
        {"api_retry_resend_after_s", "duplicate_window_s"},
    ),
    "archive expiring inside the replay window": (
        {"archive_max_age_days": 4},
        {"archive_max_age_days", "replay_window_days"},
    ),
    "command stream shorter than a command's longest wait": (
        {"command_stream_max_age_days": 1},
        {
            "command_stream_max_age_days",
            "max_consumer_lag_s",
            "command_max_hold_s",
            "command_ack_wait_s",
        },
    ),
    "command stream shorter than a wait stretched by a retry-delay override": (
        {"command_stream_max_age_days": 2, "queue_retry_delay_s": {"dead-letter": 6 * 3600}},
        {
            "command_stream_max_age_days",
            "max_consumer_lag_s",
            "command_max_hold_s",
            "command_ack_wait_s",
            "queue_retry_delay_s",
        },
    ),
    "in-progress marks no more often than the ack wait": (
        {"command_in_progress_s": 60},
        {"command_in_progress_s", "command_ack_wait_s"},
    ),
    "router ack wait no longer than a fetch": (
        {"router_ack_wait_s": 2},
        {"router_ack_wait_s", "router_fetch_timeout_s"},
    ),
}


def test_the_defaults_fit() -> None:
    # GIVEN no configuration at all
    settings = load_settings()
    # WHEN the windows are checked against each other
    misfits = retention_misfits(settings)
    # THEN none is broken: the 7-day stream exceeds the 1-day lag plus the 5-day replay window
    assert misfits == ()
    assert settings.max_consumer_lag_s == _DAY_S
    assert settings.replay_window_days == 5
    lag_and_replay_s = settings.max_consumer_lag_s + settings.replay_window_days * _DAY_S
    assert settings.event_stream_max_age_days * _DAY_S > lag_and_replay_s


@pytest.mark.parametrize(("overrides", "involved"), _ONE_RULE.values(), ids=list(_ONE_RULE))
def test_a_rule_broken_alone_names_exactly_its_settings_with_their_values(
    overrides: dict[str, Any], involved: set[str]
) -> None:
    # GIVEN settings that break one rule
    # WHEN start-up builds the settings
    message = _refusal(**overrides)
    # THEN one rule is refused, naming each setting it reads by its variable, with its value
    assert "(1 rule broken)" in message
    named = _named(message)
    assert set(named) == involved
    for field, shown in named.items():
        assert ast.literal_eval(shown) == _effective(field, overrides), field
    # ... and what to change names only those settings
    assert set(re.findall(r"RHUMBATRON_\w+", message)) == {
        f"RHUMBATRON_{field.upper()}" for field in involved
    }
    assert re.search(r"; (raise|lower) RHUMBATRON_", message)


def test_every_broken_rule_is_listed_at_once() -> None:
    # GIVEN a replay window longer than the stream and the archive keep, and an in-progress
    # mark slower than the ack wait
    overrides = {"replay_window_days": 400, "command_in_progress_s": 90}
    # WHEN start-up builds the settings
    message = _refusal(**overrides)
    # THEN all three broken rules are listed, numbered, in one error
    assert "(3 rules broken)" in message
    assert all(f"({n}) " in message for n in (1, 2, 3))
    assert "the event stream keeps events longer than" in message
    assert "the archive keeps objects at least as long as the replay window" in message
    assert "in-progress marks come more often than its ack wait" in message


def test_check_retention_raises_every_misfit_as_a_configuration_error() -> None:
    # GIVEN a table with a queue retried 2,000 times, and the spec's settings
    settings = load_settings()
    slow = QueueConsumer("slow", "agents", 1, 1, 2_000, 30.0, None, "logged")
    # WHEN the windows are checked against that table
    with pytest.raises(RetentionMisfitError) as caught:
        check_retention(settings, queues={**QUEUE_CONSUMERS, "slow": slow})
    # THEN the command stream's rule is the one broken, for that queue, and it is both a
    # ConfigurationError and the ValueError pydantic reports from a validator
    (misfit,) = caught.value.misfits
    assert misfit.env_names[0] == "RHUMBATRON_COMMAND_STREAM_MAX_AGE_DAYS"
    assert "a command on slow may wait" in str(misfit)
    assert isinstance(caught.value, ConfigurationError)
    assert isinstance(caught.value, ValueError)


def test_the_windows_the_rules_compute_at_the_spec_values() -> None:
    # GIVEN the spec's settings
    settings = load_settings()
    # THEN a row's last resend comes at most 9 ack timeouts of 5 s plus backoffs of
    # 1 + 2 + ... + 256 s stretched by 20 % jitter after its first send: inside 2 hours
    assert publish_resend_span_s(settings) == pytest.approx(9 * 5 + 511 * 1.2)
    # ... and the longest wait of a command is a dead letter's: a day's lag, 6 deliveries
    # held 15 minutes plus a 60 s ack wait, 5 retry delays of 60 s: inside 14 days
    waits = {queue: command_wait_s(settings, row) for queue, row in QUEUE_CONSUMERS.items()}
    assert max(waits, key=waits.__getitem__) == "dead-letter"
    assert waits["dead-letter"] == _DAY_S + 6 * (900 + 60) + 5 * 60


def test_the_resend_span_of_a_huge_attempt_count_is_computed_at_once() -> None:
    # GIVEN a million attempts (no validation: the span is what is under test)
    settings = Settings.model_construct(outbox_max_attempts=1_000_000)
    # WHEN the span is computed
    span_s = publish_resend_span_s(settings)
    # THEN every backoff past the ninth is the 5-minute cap (+20 %), after a 5 s ack timeout
    assert span_s == pytest.approx(9 * 5 + 511 * 1.2 + (1_000_000 - 10) * (5 + 300 * 1.2))


def test_start_up_refuses_before_anything_opens_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # GIVEN an environment whose event streams keep events 5 days, under a 1-day lag plus a
    # 5-day replay window, and a state directory that does not exist yet
    state_dir = tmp_path / "state"
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(state_dir))
    monkeypatch.setenv("RHUMBATRON_EVENT_STREAM_MAX_AGE_DAYS", "5")
    # WHEN the runtime is built from the environment
    with pytest.raises(ConfigurationError) as caught:
        bootstrap()
    # THEN it refuses, naming the variable the operator set with its value and what to do
    message = str(caught.value)
    assert "event_stream_max_age_days=5.0 (RHUMBATRON_EVENT_STREAM_MAX_AGE_DAYS)" in message
    assert "raise RHUMBATRON_EVENT_STREAM_MAX_AGE_DAYS above 6" in message
    # ... before anything was opened or created
    assert list(tmp_path.iterdir()) == []
