"""ProjectView.apply_delta: claim, feed row and view change in one transaction per project;
one bad event rolls back alone; an older event never moves a row back."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from rhumbatron.core.settings import Settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.protocol.envelopes import Event
from rhumbatron.router.project_view import PROJECTOR, ProjectView
from rhumbatron.router.records import Outcome, Record

CALLER = Caller("acme", "system:test", correlation_id="corr-view")
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def record(event: Event, seq: int) -> Record:
    # apply_delta reads only the event, its key and its stream sequence
    return Record(cast(Any, None), seq, 1, event.event_id, event, None)


def task_events(project: str) -> list[Event]:
    ctx = FactContext(CALLER, project, NOW)
    return [
        ctx.fact("task.ready", {}, change_id="c1", task_id="t1"),
        ctx.fact("task.assigned", {"agentId": "a1"}, change_id="c1", task_id="t1"),
        ctx.fact("task.completed", {"agentId": "a1"}, change_id="c1", task_id="t1"),
    ]


def test_claims_feed_rows_and_view_commit_together(offline_settings: Settings) -> None:
    view = ProjectView(offline_settings, "acme-web")
    ready, assigned, _ = task_events("acme-web")
    outcomes = view.apply_delta([record(ready, 1), record(assigned, 2)], now_s=1.0)
    assert {o.outcome for o in outcomes.values()} == {Outcome.APPLIED}
    db = view.connection
    claims = db.execute("SELECT COUNT(*) FROM processed_events WHERE consumer = ?", (PROJECTOR,))
    assert claims.fetchone()[0] == 2
    assert db.execute("SELECT COUNT(*) FROM project_events").fetchone()[0] == 2
    assert view.snapshot()["activeAgents"] == [{"agentId": "a1", "changeId": "c1", "taskId": "t1"}]
    # the same events again: duplicates, nothing changes
    again = view.apply_delta([record(ready, 1)], now_s=2.0)
    assert again[ready.event_id].outcome is Outcome.DUPLICATE
    assert view.snapshot()["eventsApplied"] == 2


def test_one_event_that_cannot_be_applied_rolls_back_alone(offline_settings: Settings) -> None:
    # GIVEN a view whose task table refuses task t-bad (a stand-in for any apply error)
    view = ProjectView(offline_settings, "acme-web")
    view.connection.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON view_tasks WHEN NEW.task_id = 't-bad' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    ctx = FactContext(CALLER, "acme-web", NOW)
    good = ctx.fact("task.ready", {}, change_id="c1", task_id="t-good")
    bad = ctx.fact("task.ready", {}, change_id="c1", task_id="t-bad")
    # WHEN both are applied in one call
    outcomes = view.apply_delta([record(bad, 1), record(good, 2)], now_s=1.0)
    # THEN the bad one failed with its claim and feed row rolled back; the good one applied
    assert outcomes[bad.event_id].outcome is Outcome.FAILED
    assert "refused" in outcomes[bad.event_id].reason
    assert outcomes[good.event_id].outcome is Outcome.APPLIED
    ids = {row[0] for row in view.connection.execute("SELECT event_id FROM processed_events")}
    assert ids == {good.event_id}


def test_an_event_redelivered_late_never_moves_a_row_back(offline_settings: Settings) -> None:
    # GIVEN task t1 completed (seq 3) before its earlier 'ready' (seq 1) came back from a nack
    view = ProjectView(offline_settings, "acme-web")
    ready, assigned, completed = task_events("acme-web")
    view.apply_delta([record(assigned, 2), record(completed, 3)], now_s=1.0)
    view.apply_delta([record(ready, 1)], now_s=2.0)
    # THEN the task stays completed and no agent is left active
    snapshot = view.snapshot()
    assert snapshot["tasksByState"] == {"completed": 1}
    assert snapshot["activeAgents"] == []
    assert snapshot["eventsApplied"] == 3


def test_the_projector_keeps_at_most_the_configured_views_open(tmp_path: Path) -> None:
    from rhumbatron.core.settings import load_settings
    from rhumbatron.router.handlers import ProjectViewProjector

    settings = load_settings(state_dir=tmp_path, router_max_open_views=2)
    projector = ProjectViewProjector(settings)
    first = projector.view("p-one")
    first.connection  # noqa: B018 - open it
    projector.view("p-two").connection  # noqa: B018
    projector.view("p-one")  # used again: now the most recent
    projector.view("p-three").connection  # noqa: B018
    # the least recently used view (p-two) was closed and dropped; p-one stayed open
    assert list(projector._views) == ["p-one", "p-three"]
    assert first._connection is not None
