"""The operator's ``rhumbatron outbox`` command: status, and requeue of failed rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.storage import write_transaction
from rhumbatron.cli import main
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller


@pytest.fixture
def failed_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProjectRoot:
    """A project root whose only outbox row has failed; the CLI reads this state dir."""
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "state"))
    settings = load_settings(state_dir=tmp_path / "state")
    root = ProjectRoot(ProjectRoot.ref_for("cli-p"), settings, clock=ManualClock())
    root.create_project(Caller("acme", "system:test", "c"), name="CLI")
    with write_transaction(root.connection, root.path) as db:
        db.execute("UPDATE outbox SET state = 'failed', attempts = 10, last_error = 'boom'")
    return root


def test_outbox_status_lists_counts_and_failed_rows_with_their_error(
    failed_root: ProjectRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["outbox", "status"]) == 0
    status = json.loads(capsys.readouterr().out)
    entry = status["project_root:cli-p"]
    assert entry["rows"][RowState.FAILED] == 1
    assert [(r["event_type"], r["last_error"]) for r in entry["failedRows"]] == [
        ("project.created", "boom")
    ]


def test_outbox_requeue_puts_failed_rows_back_to_pending(
    failed_root: ProjectRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["outbox", "requeue"]) == 0
    assert "project_root:cli-p: requeued 1 failed rows" in capsys.readouterr().out
    assert counts_by_state(failed_root.connection)[RowState.PENDING] == 1
