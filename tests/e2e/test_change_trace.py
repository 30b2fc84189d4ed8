"""One trace per Change, followed through the headers: a Change requested through the API
with a caller's ``traceparent``, driven to its release on the embedded default (a real
nats-server, SQLite actor files, the in-process workflow engine), carries its Change's trace
on every Event of it on its stream and on every Command sent for it; and the spans recorded
locally link each Command back, parent by parent, to the API call that caused it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest_asyncio
from nats.aio.msg import Msg

from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.lifecycle.scripted_agent import ScriptLibrary
from rhumbatron.metrics.trace_spans import install_span_store
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.protocol.tracecontext import TraceContext, change_trace_id
from rhumbatron.runtime.bootstrap import Rhumbatron
from rhumbatron_dev.local.loop import LocalLoop

from .test_change_lifecycle import SAMPLE, embedded_runtime

TOKEN = "trace-test-token-0123456789"
#: The caller's position (the W3C specification's example).
CALLER_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest_asyncio.fixture
async def app(tmp_path: Path) -> AsyncIterator[Rhumbatron]:
    """The embedded default with spans recorded, as `rhumbatron up` runs it."""
    async with embedded_runtime(
        tmp_path,
        trace_spans=True,
        api_tokens={TOKEN: {"tenant": "*", "scopes": ["changes:read", "changes:write"]}},
    ) as runtime:
        yield runtime


async def test_one_change_is_one_trace_from_the_api_call_to_its_release(app: Rhumbatron) -> None:
    # GIVEN the sample project provisioned with a live app, and every Command sent watched
    sample = json.loads(SAMPLE.read_text())
    project_id, tenant = sample["project"]["id"], sample["tenant"]
    lifecycle = app.lifecycle()
    lifecycle.scripts = ScriptLibrary.from_file(SAMPLE)
    loop = LocalLoop(app)
    commands: list[Msg] = []

    async def watch(msg: Msg) -> None:
        commands.append(msg)

    watcher = await (await app.nats()).subscribe("cmd.>", cb=watch)
    for kind, command_id, payload in (
        ("project.provision", "cmd_provision", {"name": "Shop", "tenantId": tenant}),
        ("app.provision", "cmd_app", {"appName": sample["app"]["name"]}),
    ):
        await lifecycle.sender.send(
            lifecycle_command(
                kind, command_id, project_id=project_id, now=app.clock.now(), payload=payload
            )
        )
    world = lifecycle.world
    assert await loop.run_until(lambda: world.admin_shard(project_id).live_apps() == ["storefront"])
    api = create_api(app, StaticTokenAuth(app.settings.api_tokens), manage_runtime=False)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://api"
    ) as http:
        # WHEN a Change is requested through the API by a caller in a trace of its own
        created = await http.post(
            f"/projects/{project_id}/changes",
            json=sample["change"],
            headers={**auth, "traceparent": CALLER_TRACE},
        )
        assert created.status_code == 201, created.text
        change_id = created.json()["changeId"]

        def status() -> str:
            change = lifecycle.requests.change(project_id, change_id)
            return change.status if change else "missing"

        # AND it is driven to its release: verified, approved (no header), released
        assert await loop.run_until(lambda: status() == "awaiting_approval"), status()
        approved = await http.post(
            f"/projects/{project_id}/changes/{change_id}/approve", headers=auth
        )
        assert approved.status_code == 200, approved.text
        assert await loop.run_until(
            lambda: status() == "completed" and lifecycle.indexer.ready_generation(project_id) == 1
        ), status()
    await watcher.unsubscribe()
    trace = change_trace_id(project_id, change_id)

    # THEN every Event of the Change on its stream carries the Change's trace
    js = (await app.nats()).jetstream()
    stream = event_stream_name(stream_index(project_id))
    info = await js.stream_info(stream)
    events = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await js.get_msg(stream, seq)
        if json.loads(raw.data or b"{}").get("changeId") == change_id:
            events.append(
                (json.loads(raw.data)["eventType"], (raw.headers or {}).get("traceparent"))
            )
    assert {"change.created", "candidate.verified", "promotion.completed"} <= {
        kind for kind, _ in events
    }
    event_traces = {kind: TraceContext.parse(header) for kind, header in events}
    assert {kind: c.trace_id if c else None for kind, c in event_traces.items()} == dict.fromkeys(
        event_traces, trace
    )
    # AND every Command sent for it, on every queue, carries the Change's trace too
    ours = [m for m in commands if json.loads(m.data).get("changeId") == change_id]
    kinds = {json.loads(m.data)["commandType"] for m in ours}
    assert {"agent.wake", "release.start"} <= kinds, kinds
    command_traces = [TraceContext.parse((m.headers or {}).get("traceparent")) for m in ours]
    assert [c.trace_id if c else None for c in command_traces] == [trace] * len(ours)

    # AND the spans link each Command back to an API call: the request that created the
    # Change (whose parent is the caller's span) or the one that approved it
    spans = install_span_store(app.settings).change(project_id, change_id)
    by_id = {s.span_id: s for s in spans}
    create = next(s for s in spans if s.name == "api POST /projects/{projectId}/changes")
    approve = next(s for s in spans if s.name.endswith("/approve"))
    assert (create.parent_id, create.link) == ("00f067aa0ba902b7", CALLER_TRACE)

    def root(span_id: str | None) -> str:
        """The API call an unbroken chain of recorded parents leads to from ``span_id``."""
        for _ in range(len(by_id) + 1):
            if span_id not in by_id:
                return f"a span never recorded: {span_id}"
            if by_id[span_id].name.startswith("api "):
                return by_id[span_id].name
            span_id = by_id[span_id].parent_id
        return "a cycle"

    roots = {root(c.span_id) for c in command_traces if c is not None}
    assert roots <= {create.name, approve.name}, roots
    wake_roots = {
        root(c.span_id)
        for m, c in zip(ours, command_traces, strict=True)
        if c is not None and json.loads(m.data)["commandType"] == "agent.wake"
    }
    assert wake_roots == {create.name}
    # AND the timeline holds the hops in between: routed Events, handled Commands, workflow
    # steps and publishes, every one in the Change's trace
    names = {s.name.split(" ")[0] for s in spans}
    assert {"api", "route", "handle", "workflow", "publish"} <= names, names
    assert {s.trace_id for s in spans} == {trace}
