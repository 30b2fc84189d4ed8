"""The view store against a real nats-server: rebuilt from the log, by the command and after
the faults that lose it (issue #16): a view file deleted under a warm router, a state
directory that lost its views (rebuilt by the operator), and a rebuild while the projector
runs. After each, the views equal a rebuild from the stream."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from project_roots import restore_project_roots
from rhumbatron.cli import main
from rhumbatron.core.clock import ManualClock
from rhumbatron.protocol.ids import stream_index
from rhumbatron.router.view_store import view_store_path
from rhumbatron.router.views import rebuild_views
from rhumbatron.runtime.bootstrap import Rhumbatron

from . import test_router
from .test_router import AppFactory, lifecycle, projects_on_stream, publish

pytestmark = pytest.mark.integration

make_app = test_router.make_app  # the router tests' runtimes, on this test's servers

STREAM = 2


def view_state(app: Rhumbatron, project_id: str) -> dict[str, Any]:
    """What a reader of the project's view sees, the feed's apply times left out."""
    view = app.router().projector.view(project_id)
    snapshot = view.snapshot(latest=100)
    rows = view.connection.execute(
        "SELECT event_id, stream_seq, event_type FROM project_events WHERE project_id = ? "
        "ORDER BY stream_seq",
        (project_id,),
    )
    return {**snapshot, "feed": [tuple(r) for r in rows]}


async def history_on_stream(app: Rhumbatron, clock: ManualClock, count: int = 2) -> list[str]:
    projects = projects_on_stream(STREAM, count)
    for project in projects:
        await publish(app, lifecycle(project, clock.now()))
    return projects


async def rebuilt_elsewhere(
    make_app: AppFactory, tmp_path: Path, app: Rhumbatron, projects: list[str]
) -> dict[str, dict[str, Any]]:
    """The views a fresh state directory rebuilds from the stream: what the views must equal."""
    fresh = await make_app(state_dir=tmp_path / "reference")
    restore_project_roots(app, fresh, projects)
    await rebuild_views(fresh.router(), stream=STREAM)
    return {p: view_state(fresh, p) for p in projects}


async def test_a_view_file_deleted_under_a_warm_router_is_rebuilt_from_the_stream(
    make_app: AppFactory, clock: ManualClock
) -> None:
    # GIVEN two projects' histories applied by a warm router
    app = await make_app()
    projects = await history_on_stream(app, clock)
    await app.router().nudge(STREAM)
    before = {p: view_state(app, p) for p in projects}
    assert all(state["eventsApplied"] == 6 for state in before.values())

    # WHEN the stream's view file is deleted under it, and more events come and are nudged
    view_store_path(app.settings, STREAM).unlink()
    more = lifecycle(projects[0], clock.now(), change="chg-2")[1:3]
    await publish(app, more)
    await app.router().nudge(STREAM)

    # THEN the views were rebuilt from the stream before the new events were applied: every
    # event is in its view once
    after = {p: view_state(app, p) for p in projects}
    assert after[projects[1]] == before[projects[1]]
    assert after[projects[0]]["eventsApplied"] == 8
    assert len(after[projects[0]]["feed"]) == 8
    assert not app.router().projector.views(STREAM).lost


async def test_a_state_directory_that_lost_its_views_gets_them_back_by_a_rebuild(
    make_app: AppFactory, clock: ManualClock, settings: Any
) -> None:
    # GIVEN a router that applied two projects' histories, then stopped
    first = await make_app()
    projects = await history_on_stream(first, clock)
    await first.router().nudge(STREAM)
    before = {p: view_state(first, p) for p in projects}
    await first.close()

    # WHEN the views directory is gone, a new process starts, and the operator rebuilds
    shutil.rmtree(settings.state_dir / "views")
    second = await make_app()
    result = await rebuild_views(second.router())

    # THEN every stream was read, and the views are back as they were
    assert result.streams == list(range(8)) and result.failed == 0
    assert {p: view_state(second, p) for p in projects} == before


async def test_a_rebuild_while_the_projector_runs_applies_each_event_once(
    make_app: AppFactory, clock: ManualClock, tmp_path: Path
) -> None:
    # GIVEN two projects' histories applied, and more events waiting; fetches of 4 records
    app = await make_app(router_fetch_max_records=4)
    projects = await history_on_stream(app, clock)
    await app.router().drain()
    await publish(app, lifecycle(projects[1], clock.now(), change="chg-2"))

    # WHEN one project's view is rebuilt while nudges apply the rest
    rebuild = asyncio.create_task(rebuild_views(app.router(), project_id=projects[1]))
    for _ in range(5):
        await app.router().nudge(STREAM)
    result = await rebuild
    await app.router().nudge(STREAM)

    # THEN the rebuild forgot that project's claims and applied its events again, and both
    # views equal the views a fresh directory rebuilds from the stream
    assert result.forgotten_claims >= 6  # at least the history applied before it started
    assert result.failed == 0
    reference = await rebuilt_elsewhere(make_app, tmp_path, app, projects)
    assert {p: view_state(app, p) for p in projects} == reference


async def test_the_views_rebuild_command_rebuilds_one_project_and_reports_it(
    make_app: AppFactory, clock: ManualClock, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two projects applied, one of whose view rows were damaged by hand
    app = await make_app()
    projects = await history_on_stream(app, clock)
    await app.router().nudge(STREAM)
    before = view_state(app, projects[0])
    app.router().projector.views(STREAM).connection.execute(
        "UPDATE view_tasks SET status = 'garbled' WHERE project_id = ?", (projects[0],)
    )
    await app.close()

    # WHEN the operator runs `rhumbatron views rebuild --project` on the same state
    for name, value in {
        "RHUMBATRON_STATE_DIR": str(settings.state_dir),
        "RHUMBATRON_NATS_URL": settings.nats_url,
        "RHUMBATRON_S3_ENDPOINT_URL": app.settings.s3_endpoint_url or "",
        "RHUMBATRON_EVIDENCE_BUCKET": app.settings.evidence_bucket,
    }.items():
        monkeypatch.setenv(name, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = await asyncio.to_thread(main, ["views", "rebuild", "--project", projects[0]])

    # THEN it succeeded, showed its progress, said what it did, and the view is whole again
    assert status == 0, out.getvalue()
    assert "EVENTS_02 rebuilt (1/1): 6 events applied" in err.getvalue()
    report = json.loads(out.getvalue())
    assert report["projectId"] == projects[0]
    assert (report["forgottenClaims"], report["applied"], report["failed"]) == (6, 6, 0)
    again = await make_app()
    assert view_state(again, projects[0]) == before
    assert stream_index(projects[0]) == STREAM


def test_the_views_rebuild_command_refuses_a_bad_project_id(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["views", "rebuild", "--project", "../etc"]) == 3
    assert "--project '../etc' is not a project ID" in capsys.readouterr().err
