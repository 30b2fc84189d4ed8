"""A Change from request to release on the embedded default, driven only by events and
commands: a real nats-server, real SQLite actor files, the in-process workflow engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.changes import TaskPlan
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import UnknownSubjectError
from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.lifecycle.scripted_agent import ScriptLibrary
from rhumbatron.lifecycle.subjects import check_command_subject
from rhumbatron.protocol.envelopes import Command
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.loop import LocalLoop
from rhumbatron_dev.local.stack import LocalStack

SAMPLE = Path(__file__).resolve().parents[2] / "samplefiles" / "lifecycle.json"
FAST = {
    "queue_retry_delay_s": dict.fromkeys(
        ("agent-wakeups", "integration", "verification", "release", "indexing"), 0.05
    ),
    "integration_more_work_delay_s": 0.05,
    "conflict_review_delay_s": 0.05,
}


@asynccontextmanager
async def embedded_runtime(tmp_path: Path, **settings: Any) -> AsyncIterator[Rhumbatron]:
    """The embedded default: nats-server and moto's S3 server on loopback, SQLite files, the
    retry delays short (:data:`FAST`) and ``settings`` on top; its streams and bucket made."""
    with LocalStack(tmp_path / "stack") as stack:
        assert stack.s3 is not None
        loaded = load_settings(
            state_dir=tmp_path / "state",
            nats_url=stack.nats.url,
            s3_endpoint_url=stack.s3.endpoint_url,
            **(FAST | settings),
        )
        stack.s3.client().create_bucket(Bucket=loaded.evidence_bucket)
        runtime = bootstrap(loaded, clock=ManualClock(), alarms=RecordingAlarmSink())
        await runtime.ensure_streams()
        yield runtime
        await runtime.close()


@pytest_asyncio.fixture
async def app(tmp_path: Path) -> AsyncIterator[Rhumbatron]:
    async with embedded_runtime(tmp_path) as runtime:
        yield runtime


def _plans(sample: dict) -> list[TaskPlan]:
    return [
        TaskPlan(
            task_id=t["taskId"],
            title=t["title"],
            agent_id=t["agentId"],
            depends_on=tuple(t.get("dependsOn", ())),
            script=t.get("script"),
        )
        for t in sample["change"]["tasks"]
    ]


async def test_a_change_moves_from_request_to_release_by_events_and_commands(
    app: Rhumbatron,
) -> None:
    # GIVEN the sample project provisioned with a live app, through the integration queue
    sample = json.loads(SAMPLE.read_text())
    project_id, tenant = sample["project"]["id"], sample["tenant"]
    lifecycle = app.lifecycle()
    lifecycle.scripts = ScriptLibrary.from_file(SAMPLE)
    loop = LocalLoop(app)
    now = app.clock.now()
    await lifecycle.sender.send(
        lifecycle_command(
            "project.provision",
            f"cmd_provision_{project_id}",
            project_id=project_id,
            now=now,
            payload={"name": sample["project"]["name"], "tenantId": tenant},
        )
    )
    await lifecycle.sender.send(
        lifecycle_command(
            "app.provision",
            f"cmd_app_{project_id}",
            project_id=project_id,
            now=now,
            payload={"appName": sample["app"]["name"]},
        )
    )
    world = lifecycle.world
    assert await loop.run_until(lambda: world.admin_shard(project_id).live_apps() == ["storefront"])

    # WHEN a Change of four Tasks is requested (twice: the same client request)
    caller = Caller(tenant, "user:dana", "req")
    created = lifecycle.requests.create_change(
        caller,
        project_id=project_id,
        client_request_id=sample["change"]["clientRequestId"],
        title=sample["change"]["title"],
        tasks=_plans(sample),
    )
    again = lifecycle.requests.create_change(
        caller,
        project_id=project_id,
        client_request_id=sample["change"]["clientRequestId"],
        title=sample["change"]["title"],
        tasks=_plans(sample),
    )
    change_id = created.change_id

    def status() -> str:
        change = lifecycle.requests.change(project_id, change_id)
        return change.status if change else "missing"

    # THEN it reaches awaiting_approval with a verified Candidate, by itself
    assert created.created and not again.created and again.change_id == change_id
    assert await loop.run_until(lambda: status() == "awaiting_approval"), status()

    # WHEN an operator approves it
    candidate = lifecycle.requests.approve(caller, project_id=project_id, change_id=change_id)

    # THEN canonical advances, the index is built, and the release completes
    assert await loop.run_until(
        lambda: status() == "completed" and lifecycle.indexer.ready_generation(project_id) == 1
    ), status()
    shard = world.change_shard(project_id, change_id)
    assert [c.status.value for c in shard.candidates(change_id=change_id)] == ["promoted"]
    assert candidate.candidate_id == shard.candidates(change_id=change_id)[0].candidate_id
    assert [r.status.value for r in shard.releases(change_id=change_id)] == ["completed"]
    hits = lifecycle.indexer.project_index(project_id).search("GiftCard")
    assert [h.path for h in hits] == ["src/models/gift_card.py"]
    # Two agents overlapped on the src/checkout/ prefix: Clef-flash was asked (no key:
    # it abstained, and so woke builder-a).
    decisions = [r for r in lifecycle.routed if r.clef_flash]
    assert decisions and all(v == "abstain" for r in decisions for _, v in r.clef_flash)
    live = app.settings.state_dir / "apps" / project_id / "storefront" / "live.txt"
    assert live.read_text() == "1\n"

    # AND the door (POST /commands, the integration module) accepts the workflow starts of
    #   what exists — this Change's Candidate, generation 1 to the live app — and refuses
    #   each reference to what does not, naming its field
    promoted = shard.candidates(change_id=change_id)[0].candidate_id

    def start(kind: str, payload: dict[str, object], change: str | None = change_id) -> Command:
        return lifecycle_command(
            kind,
            f"cmd_door_{kind}",
            project_id=project_id,
            change_id=change,
            now=now,
            payload=payload,
        )

    release = {"releaseId": "rel-door", "generation": 1}
    check_command_subject(world, start("verification.start", {"candidateId": promoted}))
    check_command_subject(
        world,
        start("release.start", {**release, "candidateId": promoted, "appName": "storefront"}),
    )
    refused = {
        "command.payload.candidateId": start("verification.start", {"candidateId": "cand-x"}),
        "command.changeId": start("verification.start", {"candidateId": promoted}, "chg-x"),
        "command.payload.generation": start("release.start", {**release, "generation": 2}),
        "command.payload.appName": start("release.start", {**release, "appName": "no-app"}),
    }
    for field, command in refused.items():
        with pytest.raises(UnknownSubjectError) as raised:
            check_command_subject(world, command)
        assert raised.value.field == field
    no_change = start("release.start", release, change=None)
    with pytest.raises(UnknownSubjectError, match="names no Change"):
        check_command_subject(world, no_change)


async def test_a_promotion_makes_the_other_candidate_stale_and_it_is_recomposed_on_the_new_base(
    app: Rhumbatron,
) -> None:
    # GIVEN two Changes of one project, each with a verified Candidate on generation 0
    lifecycle = app.lifecycle()
    lifecycle.scripts = ScriptLibrary.from_mapping(
        {
            name: [
                {"do": "propose_changeset", "files": {f"src/{name}.py": f"NAME = {name!r}\n"}},
                {"do": "complete"},
            ]
            for name in ("left", "right")
        }
    )
    loop = LocalLoop(app)
    project_id, tenant = "acme-two", "acme"
    await lifecycle.sender.send(
        lifecycle_command(
            "project.provision",
            f"cmd_provision_{project_id}",
            project_id=project_id,
            now=app.clock.now(),
            payload={"name": "Two changes", "tenantId": tenant},
        )
    )
    world = lifecycle.world
    assert await loop.run_until(lambda: world.project_exists(project_id))
    caller = Caller(tenant, "user:dana", "req")
    left, right = (
        lifecycle.requests.create_change(
            caller,
            project_id=project_id,
            client_request_id=f"req-{name}",
            title=name,
            tasks=[TaskPlan("t", name, f"builder-{name}", script=name)],
        ).change_id
        for name in ("left", "right")
    )

    def status(change_id: str) -> str:
        change = lifecycle.requests.change(project_id, change_id)
        return change.status if change else "missing"

    def candidates(change_id: str) -> list[tuple[int, str]]:
        shard = world.change_shard(project_id, change_id)
        return [(c.base_generation, c.status.value) for c in shard.candidates(change_id=change_id)]

    assert await loop.run_until(lambda: status(left) == status(right) == "awaiting_approval"), (
        status(left),
        status(right),
    )
    assert candidates(right) == [(0, "verified")]

    # WHEN the left Change is approved: canonical advances to generation 1
    lifecycle.requests.approve(caller, project_id=project_id, change_id=left)

    # THEN the right Candidate (base 0) went stale, its Change back to verifying, and
    # candidates.recompose composed it again on generation 1 (candidate.create after a
    # rebase, on the verification queue), which verification verified
    assert await loop.run_until(
        lambda: status(left) == "completed" and candidates(right) == [(0, "stale"), (1, "verified")]
    ), (status(left), candidates(right))
    assert status(right) == "awaiting_approval"
    envelopes = [
        json.loads(row[0])
        for row in world.change_shard(project_id, right).connection.execute(
            "SELECT envelope FROM outbox WHERE event_type = 'change.status_changed' ORDER BY seq"
        )
    ]
    moves = [(e["payload"]["fromStatus"], e["payload"]["toStatus"]) for e in envelopes]
    assert ("awaiting_approval", "verifying") in moves
    rebased = [h for h in lifecycle.integration.handled if "_rebase_1" in h.command_id]
    assert [h.command_type for h in rebased] == ["candidate.create"]

    # WHEN the right Change is approved too
    lifecycle.requests.approve(caller, project_id=project_id, change_id=right)

    # THEN canonical is at generation 2 and both Changes completed (no live app: nothing to
    # release)
    assert await loop.run_until(lambda: status(right) == "completed")
    assert world.canonical_generation(project_id) == 2
