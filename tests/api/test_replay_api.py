"""``POST /replays`` over a real runtime, nats-server and moto S3: a dry run, a replay and the
same replay again, from the stream and from the archive; the scope; invalid requests.

The tests are async and call the API through httpx's ASGI transport on the runtime's event
loop, so a test can publish events and run the router itself between requests.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from project_roots import ensure_project_roots
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_subject, stream_index
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

pytestmark = pytest.mark.integration

PROJECT = "acme-web"
STREAM = stream_index(PROJECT)
AT = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
REPLAYER = "replay-token-ffffffffffffff"
NO_REPLAY = "operator-token-ffffffffffff"
OTHER_SCOPES = [
    "dead-letters:read",
    "dead-letters:write",
    "commands:send",
    "projects:read",
    "projects:write",
    "changes:read",
    "changes:write",
    "agents:write",
]
TOKENS: dict[str, dict[str, Any]] = {
    REPLAYER: {"tenant": "*", "scopes": ["replay:write"]},
    NO_REPLAY: {"tenant": "*", "scopes": OTHER_SCOPES},
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest_asyncio.fixture
async def replay_app(
    tmp_path: Path, nats_server: NatsServerProcess, s3_server: S3ServerProcess
) -> AsyncIterator[Rhumbatron]:
    # moto's servers in one process share their buckets, and a second pytest session in the
    # same process (mutmut's) names its temp dirs as the first did: a name of its own each time.
    bucket = f"evidence-{uuid.uuid4().hex[:16]}"
    settings = load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        api_tokens=TOKENS,
        s3_endpoint_url=s3_server.endpoint_url,
        evidence_bucket=bucket,
    )
    runtime = bootstrap(settings, clock=ManualClock(AT), alarms=RecordingAlarmSink())
    await runtime.ensure_streams()
    runtime.s3().create_bucket(Bucket=bucket)
    yield runtime
    await runtime.close()


@pytest_asyncio.fixture
async def api(replay_app: Rhumbatron) -> AsyncIterator[httpx.AsyncClient]:
    asgi = create_api(
        replay_app, StaticTokenAuth(replay_app.settings.api_tokens), manage_runtime=False
    )
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
        yield client


def history() -> list[Event]:
    ctx = FactContext(Caller("tenant-a", "system:test", correlation_id="corr-1"), PROJECT, AT)
    change_id = f"{PROJECT}-chg-1"
    return [
        ctx.fact("project.created", {"name": "Web"}),
        ctx.fact(
            "change.created",
            {"title": "Add login", "clientRequestId": "req-1", "requestedBy": "user:1"},
            change_id=change_id,
        ),
        ctx.fact("change.planned", {"taskIds": ["t1"]}, change_id=change_id),
    ]


async def publish(app: Rhumbatron, events: list[Event]) -> None:
    """Put events on the stream, their projects created first (the router refuses an event
    whose project has no root, or whose tenant is not its root's)."""
    ensure_project_roots(app, events)
    js = (await app.nats()).jetstream()
    for event in events:
        await js.publish(
            event_stream_subject(STREAM), event.to_json(), headers={"Nats-Msg-Id": event.event_id}
        )


def rewind_body(*, dry_run: bool, **extra: Any) -> dict[str, Any]:
    return {
        "source": "stream",
        "stream": STREAM,
        "subscription": "project-view-projector",
        "toSeq": 1,
        "dryRun": dry_run,
        **extra,
    }


def tally(body: dict[str, Any]) -> dict[str, int]:
    names = ("scanned", "applied", "wouldApply", "alreadyApplied", "inFlight", "retried", "failed")
    return {name: body[name] for name in names if body[name]}


async def test_a_replay_counts_in_a_dry_run_applies_once_and_then_applies_nothing(
    api: httpx.AsyncClient, replay_app: Rhumbatron
) -> None:
    # GIVEN three events on the project's stream that no subscription has read
    await publish(replay_app, history())

    # WHEN the projector is replayed from sequence 1: a dry run, then twice for real
    dry = await api.post("/replays", json=rewind_body(dry_run=True), headers=bearer(REPLAYER))
    first = await api.post("/replays", json=rewind_body(dry_run=False), headers=bearer(REPLAYER))
    second = await api.post("/replays", json=rewind_body(dry_run=False), headers=bearer(REPLAYER))

    # THEN the dry run counts three to apply, the first replay applies them, the second none
    assert dry.status_code == 200, dry.text
    assert tally(dry.json()) == {"scanned": 3, "wouldApply": 3}
    assert dry.json()["errors"] == []
    assert (dry.json()["firstSeq"], dry.json()["lastSeq"]) == (1, 3)
    assert tally(first.json()) == {"scanned": 3, "applied": 3}
    assert tally(second.json()) == {"scanned": 3, "alreadyApplied": 3}
    view = replay_app.router().projector.view(PROJECT).snapshot()
    assert (view["name"], view["eventsApplied"]) == ("Web", 3)
    # AND the live cursor that reaches them later applies nothing
    live = await replay_app.router().nudge(STREAM)
    assert live.subscriptions["project-view-projector"].duplicates == 3
    assert live.subscriptions["project-view-projector"].applied == 0


async def test_an_archive_range_can_be_replayed_through_the_api(
    api: httpx.AsyncClient, replay_app: Rhumbatron
) -> None:
    # GIVEN the events applied and archived by the router
    await publish(replay_app, history())
    await replay_app.router().drain()
    body = {
        "source": "archive",
        "subscription": "analytics-projector",
        "start": AT.isoformat(),
        "end": (AT + timedelta(hours=1)).isoformat(),
        "dryRun": True,
    }

    # WHEN the hour is replayed from the archive into analytics, as a dry run
    answer = await api.post("/replays", json=body, headers=bearer(REPLAYER))

    # THEN every archived event of the range was already applied
    assert answer.status_code == 200, answer.text
    assert tally(answer.json()) == {"scanned": 3, "alreadyApplied": 3}
    assert answer.json()["stream"] is None  # every stream
    assert answer.json()["start"].startswith("2026-03-02T10:00:00")


async def test_a_replay_needs_a_token_with_the_replay_scope(api: httpx.AsyncClient) -> None:
    # GIVEN no token, and a platform token with every scope but replay:write
    # WHEN each asks for a replay
    anonymous = await api.post("/replays", json=rewind_body(dry_run=True))
    other = await api.post("/replays", json=rewind_body(dry_run=True), headers=bearer(NO_REPLAY))
    # THEN the first is not authenticated, the second lacks the scope: replay is its own grant
    assert anonymous.status_code == 401
    assert other.status_code == 403
    assert other.json()["error"]["code"] == "insufficient_scope"
    assert "replay:write" in other.json()["error"]["message"]


#: Requests that do not fit their source, and what the 422 says about each.
INVALID: list[tuple[dict[str, Any], str]] = [
    (rewind_body(dry_run=True, toSeq=None), "exactly one of toSeq and toTime"),
    (rewind_body(dry_run=True, toTime="2026-03-02T10:00:00Z"), "exactly one"),
    (rewind_body(dry_run=True, stream=None), "needs stream"),
    (rewind_body(dry_run=True, stream=8), "less than or equal to 7"),
    (rewind_body(dry_run=True, toSeq=0), "greater than or equal to 1"),
    (
        {"source": "archive", "subscription": "causal-router", "dryRun": True},
        "needs start and end",
    ),
    (
        {
            "source": "archive",
            "subscription": "audit-archiver",
            "start": "2026-03-02T10:00:00Z",
            "end": "2026-03-03T10:00:00Z",
            "dryRun": True,
        },
        "audit-archiver's own output",
    ),
    (
        {
            "source": "archive",
            "subscription": "causal-router",
            "start": "2026-03-02T10:00:00",
            "end": "2026-03-03T10:00:00Z",
            "dryRun": True,
        },
        "timezone",
    ),
    ({**rewind_body(dry_run=True), "subscription": "nope"}, "subscription"),
]


async def test_a_replay_request_that_does_not_fit_its_source_is_invalid(
    api: httpx.AsyncClient,
) -> None:
    # GIVEN requests that do not fit their source (one runtime for every case: each is
    # refused before anything is read)
    for body, says in INVALID:
        # WHEN each is sent; THEN it is a 422 that names what is wrong
        answer = await api.post("/replays", json=body, headers=bearer(REPLAYER))
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"]["code"] == "invalid_request"
        assert says in answer.json()["error"]["message"], (body, answer.text)
