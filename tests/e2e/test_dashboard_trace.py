"""The local dashboard's Change trace in a real headless Chromium: a Change requested
through ``rhumbatron up``'s API and driven to its release by ``up``'s own roles shows, at
``/dashboard?project=&change=``, its spans as a timeline in the order they happened — the
API call, the routed Events, the handled Commands, the workflow steps, the release."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.lifecycle.scripted_agent import ScriptLibrary
from rhumbatron_dev.local.up import UpHandle, run_up

from .test_change_lifecycle import SAMPLE
from .test_local_dashboard import WAIT_S, Browser, chromium  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

CALLER_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Bounded polling of the run's own state (``up`` plays its roles on its schedule)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        await asyncio.sleep(0.05)


async def start_up(root: Path) -> tuple[asyncio.Task[Any], UpHandle]:
    ready: asyncio.Future[UpHandle] = asyncio.get_running_loop().create_future()

    def on_ready(handle: UpHandle) -> None:
        handle.app.lifecycle().scripts = ScriptLibrary.from_file(SAMPLE)
        ready.set_result(handle)

    task = asyncio.create_task(run_up(root, duration_s=90, on_ready=on_ready, out=io.StringIO()))
    done, _ = await asyncio.wait({task, ready}, timeout=WAIT_S, return_when="FIRST_COMPLETED")
    if task in done:
        task.result()
    assert ready in done, "run_up did not get ready"
    return task, ready.result()


async def test_the_dashboard_draws_a_changes_spans_as_a_timeline_in_order(
    chromium: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    # GIVEN `up` running, with the sample project provisioned and its app live
    sample = json.loads(SAMPLE.read_text())
    project_id, tenant = sample["project"]["id"], sample["tenant"]
    task, up = await start_up(tmp_path / "up")
    try:
        lifecycle = up.app.lifecycle()
        for kind, command_id, payload in (
            ("project.provision", "cmd_provision", {"name": "Shop", "tenantId": tenant}),
            ("app.provision", "cmd_app", {"appName": sample["app"]["name"]}),
        ):
            await lifecycle.sender.send(
                lifecycle_command(
                    kind,
                    command_id,
                    project_id=project_id,
                    now=up.app.clock.now(),
                    payload=payload,
                )
            )
        await until(
            lambda: lifecycle.world.admin_shard(project_id).live_apps() == ["storefront"],
            "the app going live",
        )
        auth = {"Authorization": f"Bearer {up.token}"}
        async with httpx.AsyncClient(base_url=up.url, headers=auth) as http:
            # WHEN a Change is requested through the API, verified, approved and released
            created = await http.post(
                f"/projects/{project_id}/changes",
                json=sample["change"],
                headers={"traceparent": CALLER_TRACE},
            )
            assert created.status_code == 201, created.text
            change_id = created.json()["changeId"]

            def status() -> str:
                change = lifecycle.requests.change(project_id, change_id)
                return change.status if change else "missing"

            await until(lambda: status() == "awaiting_approval", "verification")
            approved = await http.post(f"/projects/{project_id}/changes/{change_id}/approve")
            assert approved.status_code == 200, approved.text
            await until(lambda: status() == "completed", "the release")

        browser = await Browser.launch(tmp_path / "profile", tmp_path / "chromium.log")
        try:
            # AND the operator opens the dashboard on that Change
            await browser.call(
                "Page.navigate",
                {"url": f"{up.dashboard_url}?project={project_id}&change={change_id}"},
            )
            # THEN the trace panel shows the Change's spans down to the release's last step
            await browser.until(
                "document.querySelector('#trace-rows tr[data-name=\"workflow release finish\"]')"
                " !== null",
                "the release's last workflow step in the timeline",
            )
            rows = await browser.evaluate(
                "[...document.querySelectorAll('#trace-rows tr')].map((r) => ({"
                "name: r.dataset.name, at: Number(r.dataset.offsetMs), "
                "left: parseFloat(r.querySelector('.track div').style.left)}))"
            )
            selected = await browser.evaluate("document.getElementById('trace-change').value")
        finally:
            page_errors = browser.page_errors
            await browser.close()
        assert selected == f"{project_id}/{change_id}"
        assert page_errors == []
        names = [r["name"] for r in rows]
        # ... in the order they happened, each bar placed by its start
        assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
        assert [r["left"] for r in rows] == sorted(r["left"] for r in rows)
        assert names[0] == "api POST /projects/{projectId}/changes"
        milestones = [
            "api POST /projects/{projectId}/changes",
            "route change.planned",
            "handle change.dispatch",
            "handle agent.wake",
            "handle verification.start",
            "api POST /projects/{projectId}/changes/{changeId}/approve",
            "handle release.start",
            "workflow release finish",
        ]
        positions = [names.index(m) for m in milestones]
        assert positions == sorted(positions), list(zip(milestones, positions, strict=True))
    finally:
        up.stop()
        await asyncio.wait_for(task, 20)
