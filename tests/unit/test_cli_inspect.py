"""``rhumbatron inspect`` (issue #20 item 7): what the state's SQLite files hold, read through
sqlite-utils on read-only connections."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.cli import main
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.testing import MemorySender

CALLER = Caller("acme", "system:test", "corr-inspect")


@pytest.fixture
async def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: ManualClock) -> Path:
    """Two projects: p-1 published, p-2 written and not yet published."""
    state = tmp_path / "state"
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(state))
    settings = load_settings(state_dir=state, nats_url="nats://127.0.0.1:1")
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink(), sender=MemorySender())
    app.project_root("p-1").create_project(CALLER, name="one")
    await app.drain_alarms()
    app.project_root("p-2").create_project(CALLER, name="two")
    app.alarms.drain()  # p-2's alarm is left unfired
    await app.close()
    return state


def test_the_state_is_summed_by_kind_with_rows_per_table(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["files"]["actor"] == 2
    assert report["rows"]["actor.outbox"] == 2
    assert report["rows"]["actor.project"] == 2
    assert report["usedBytes"]["actor"] > 0


def test_an_actor_file_shows_its_outbox_by_state(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = sorted((state_dir / "projects").glob("*/root.sqlite"))
    before = [(p.stat().st_mtime_ns, p.stat().st_size) for p in files]
    assert main(["inspect", "--json", *map(str, files)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["kind"], e["outbox"]["published"], e["outbox"]["pending"]) for e in listed] == [
        ("actor", 1, 0),
        ("actor", 0, 1),
    ]
    # read only: the files are as they were
    assert [(p.stat().st_mtime_ns, p.stat().st_size) for p in files] == before


def test_the_table_form_lists_each_kind_and_its_tables(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect"]) == 0
    out = capsys.readouterr().out
    assert f"{state_dir}: " in out and "actor: 2 files" in out
    assert "  outbox " in out


def test_a_missing_file_is_named_and_nothing_is_created(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = state_dir / "projects" / "p-9" / "root.sqlite"
    assert main(["inspect", str(missing)]) != 0
    assert f"no file at {missing}" in capsys.readouterr().err
    assert not missing.parent.exists()
