"""`rhumbatron replay`: the CLI over the replay of a subscription, against a real nats-server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhumbatron.cli import EXIT_CANNOT, main
from rhumbatron_dev.local.nats_server import NatsServerProcess


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nats_server: NatsServerProcess) -> None:
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RHUMBATRON_NATS_URL", nats_server.url)


def test_a_dry_run_rewind_prints_its_report_and_changes_nothing(
    env: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # GIVEN an empty deployment whose streams exist
    assert main(["streams"]) == 0
    capsys.readouterr()
    # WHEN the projector of stream 0 is rewound to sequence 1 as a dry run
    status = main(
        [
            *("replay", "--source", "stream", "--subscription", "project-view-projector"),
            *("--stream", "0", "--to-seq", "1", "--dry-run"),
        ]
    )
    # THEN it exits 0 and prints the report: nothing scanned, nothing applied
    report = json.loads(capsys.readouterr().out)
    assert status == 0
    assert report["dry_run"] is True
    assert (report["scanned"], report["applied"], report["would_apply"]) == (0, 0, 0)


def test_an_archive_replay_without_its_range_is_refused_naming_the_option(
    env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # WHEN an archive replay is asked without --start and --end
    status = main(["replay", "--source", "archive", "--subscription", "analytics-projector"])
    # THEN it exits 3 and says what is missing
    assert status == EXIT_CANNOT
    assert "start" in capsys.readouterr().err


def test_a_time_without_a_timezone_is_refused(
    env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            *("replay", "--source", "stream", "--subscription", "causal-router"),
            *("--stream", "1", "--to-time", "2026-11-29T10:00:00"),
        ]
    )
    assert status == EXIT_CANNOT
    assert "needs a timezone" in capsys.readouterr().err
