"""``rhumbatron capacity``: the router's ceilings against the volume sized for and observed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from rhumbatron.cli import main
from rhumbatron.core.settings import load_settings
from rhumbatron.router.capacity import ceilings
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nats_server: NatsServerProcess) -> None:
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RHUMBATRON_NATS_URL", nats_server.url)


def test_the_report_shows_every_ceiling_the_sizing_and_what_the_streams_carry(
    env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the streams, empty
    assert main(["streams"]) == 0
    capsys.readouterr()
    # WHEN the capacity is asked for
    assert main(["capacity"]) == 0
    report = json.loads(capsys.readouterr().out)
    # THEN it shows the spec's ceilings, the default sizing, no chunked prune and no warning;
    #   empty streams carry nothing
    assert report["ceilings"]["archiveEventsPerDay"] == 144_000
    assert report["ceilings"]["sweepApplyCallsPerDay"] == 21_600
    assert len(report["ceilings"]) == len(ceilings(load_settings()).as_dict())
    assert (report["expectedEventsPerDay"], report["observedEventsPerDay"]) == (1_000, 0)
    assert (report["tickPruneRows"], report["warnings"]) == (0, [])


def test_a_deployment_sized_above_a_ceiling_is_warned_of_by_name(
    env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RHUMBATRON_EXPECTED_EVENTS_PER_DAY", "1000000")
    assert main(["capacity"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tickPruneRows"] == 6_945
    # sized above what the sweep alone archives, the archiver drains: only the projector's
    # sweep-only ceilings (nudges off) are left below the volume, and they are named
    assert report["drainMode"] is True
    named = sorted(w.split(" but ")[1].split(" is ")[0] for w in report["warnings"])
    assert named == ["sweep_apply_calls_per_day", "sweep_apply_events_per_day"]
    assert all("sized for 1,000,000 events a day" in w for w in report["warnings"])
    # with drain mode off, the archive's ceiling is named too
    monkeypatch.setenv("RHUMBATRON_ROUTER_DRAIN_MODE", "false")
    assert main(["capacity"]) == 0
    sweep_only = json.loads(capsys.readouterr().out)
    assert sweep_only["drainMode"] is False
    assert any("archive_events_per_day is 144,000" in w for w in sweep_only["warnings"])


def test_without_nats_the_report_comes_from_the_settings_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RHUMBATRON_NATS_URL", f"nats://127.0.0.1:{port}")
    monkeypatch.setenv("RHUMBATRON_NATS_CONNECT_TIMEOUT_S", "0.5")
    assert main(["capacity"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["observedEventsPerDay"] is None
    assert "the report is from the settings alone" in captured.err
