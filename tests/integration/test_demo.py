"""``make demo`` at this stage (issue item 10): the local stack, the sample scenario through the
actors, the outboxes published, every stream read back with a second client, and a
machine-readable summary. Then the command plane (issue #4 item 7): a command failing into the
dead-letter queue, retried through the HTTP API once its cause is fixed, closing as
``succeeded``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.demo import DEMO_COMMAND_ID, run_demo
from rhumbatron.product.dead_letters import command_dead_letter_id

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIO = REPO_ROOT / "samplefiles" / "scenario.json"
# Per project, in the order its actors commit them (scenario steps: create, plan a change with
# two tasks, intent, claim, task 1 done, release, task 2 done, promote).
EXPECTED_TYPES = [
    "project.created",
    "change.created",
    "change.planned",
    "task.ready",
    "task.ready",
    "intent.declared",
    "claim.acquired",
    "task.completed",
    "claim.released",
    "task.completed",
    "artifact.promoted",
    "canonical.advanced",
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    """Run the demo once for this module (it starts its own nats-server and S3)."""
    import asyncio

    root = tmp_path_factory.mktemp("demo") / "root"
    out = io.StringIO()
    summary = asyncio.run(run_demo(root, SCENARIO, out))
    return summary, root, out.getvalue()


def test_the_demo_runs_without_problems(demo: tuple[dict[str, Any], Path, str]) -> None:
    summary, _, printed = demo
    assert summary["problems"] == []
    assert "PROBLEM" not in printed
    assert summary["eventsWritten"] == summary["eventsPublished"] == 24


def test_the_demo_writes_its_summary_file(demo: tuple[dict[str, Any], Path, str]) -> None:
    summary, root, _ = demo
    written = json.loads((root / "demo-summary.json").read_text())
    assert written == summary


def test_each_project_lands_on_its_own_stream_in_commit_order(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    summary, _, _ = demo
    # fnv1a32 mod 8 computed with bash: acme-web -> 0, acme-billing -> 1
    assert summary["projects"] == {
        "acme-web": {"stream": "EVENTS_00"},
        "acme-billing": {"stream": "EVENTS_01"},
    }
    for project, stream in (("acme-web", "EVENTS_00"), ("acme-billing", "EVENTS_01")):
        events = summary["streams"][stream]["events"]
        assert {e["projectId"] for e in events} == {project}
        assert [e["eventType"] for e in events] == EXPECTED_TYPES
        assert [e["seq"] for e in events] == list(range(1, 13))
        assert all(e["msgId"] == e["eventId"] for e in events)
    for index in range(2, 8):
        assert summary["streams"][f"EVENTS_0{index}"]["events"] == []


def test_demo_change_events_carry_their_stable_ids(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    # sha256sum of "acme-web-chg-001␟task.ready␟tsk-001␟", computed with the shell
    summary, _, _ = demo
    ids = [e["eventId"] for e in summary["streams"]["EVENTS_00"]["events"]]
    assert ids[3] == "evt_cc95f70bcd299611f4080a1f5b354c23"


def test_the_demo_outbox_rows_are_all_published(demo: tuple[dict[str, Any], Path, str]) -> None:
    summary, _, _ = demo
    assert summary["outbox"]["total"] == {
        "pending": 0,
        "retry_wait": 0,
        "published": 24,
        "failed": 0,
    }
    # a root and at least one shard per project own an outbox
    assert any(k.startswith("project_root:acme-web") for k in summary["outbox"]["byActor"])
    assert any(k.startswith("resource_shard:acme-billing") for k in summary["outbox"]["byActor"])


def test_the_demo_reports_stream_settings_as_jetstream_has_them(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    summary, _, _ = demo
    for index in range(8):
        settings = summary["streams"][f"EVENTS_0{index}"]["settings"]
        assert settings == {
            "subjects": [f"events.0{index}"],
            "retention": "limits",
            "storage": "file",
            "maxAgeSeconds": 7 * 86_400,
            "duplicateWindowSeconds": 2 * 3600,
            "replicas": 1,
            "allowAtomic": True,
        }


def test_the_demo_prints_what_arrived_per_stream(demo: tuple[dict[str, Any], Path, str]) -> None:
    _, _, printed = demo
    assert "EVENTS_00: 12 events" in printed
    assert "EVENTS_01: 12 events" in printed
    assert "EVENTS_07: empty" in printed


def test_the_demo_router_applies_every_event_to_the_project_views(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    summary, _, printed = demo
    for project in ("acme-web", "acme-billing"):
        view = summary["views"][project]
        assert view["eventsApplied"] == 12
        assert view["canonicalGeneration"] == 1
        assert view["tasksByState"] == {"completed": 2}
        assert view["latestEvents"][0]["eventType"] == "canonical.advanced"
        assert f"view {project}: 12 events" in printed


def test_the_demo_archives_each_streams_events_in_one_object(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    summary, _, _ = demo
    archive = summary["archive"]
    assert [item["events"] for item in archive] == [12, 12]
    assert [item["key"].split("/")[4] for item in archive] == ["stream-00", "stream-01"]
    assert all(item["key"].endswith(".ndjson.gz") for item in archive)


def test_the_demo_records_metrics_and_leaves_every_consumer_at_lag_0(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    summary, _, printed = demo
    assert summary["metricCounts"]["eventMetrics"]["task_completed"] == 4
    assert summary["metricCounts"]["eventMetrics"]["change_created"] == 2
    assert summary["metricCounts"]["metrics"]["consumer_num_pending"] == 8 * 32
    consumers = summary["consumers"]
    assert len(consumers) == 32
    assert all(c["numPending"] == 0 and c["numAckPending"] == 0 for c in consumers)
    assert "consumers: 32, at lag 0: 32" in printed


# --------------------------------------------------------------------------- the command plane

LETTER_ID = command_dead_letter_id(DEMO_COMMAND_ID)


def test_the_demo_dead_letter_closes_as_succeeded_after_the_retry(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    summary, _, _ = demo
    # The command failed its 4 deliveries as attempt 1, was retried as attempt 2, succeeded.
    (letter,) = summary["deadLetters"]
    assert letter["id"] == LETTER_ID
    assert letter["commandId"] == DEMO_COMMAND_ID
    assert letter["commandType"] == "app.provision"
    assert letter["queue"] == "integration"
    assert (letter["attempt"], letter["retriedAttempt"]) == (1, 2)
    assert letter["attempts"] == [
        {"attempt": 1, "deliveries": 4, "outcome": "dead-lettered"},
        {"attempt": 2, "deliveries": 1, "outcome": "succeeded"},
    ]
    assert (letter["status"], letter["resolution"]) == ("closed", "succeeded")
    assert "failed on integration after 4 deliveries" in letter["reason"]
    assert "no registry credentials" in letter["reason"]


def test_the_demo_counts_the_commands_of_each_queue(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    summary, _, _ = demo
    # integration: 4 failing deliveries (3 naks, then the dead-letter queue) + the retry's 1.
    assert summary["commands"] == {
        "integration": {
            "deliveries": 5,
            "done": 1,
            "failed": 4,
            "retried": 3,
            "deadLettered": 1,
            "numPending": 0,
            "numAckPending": 0,
        },
        "dead-letter": {
            "deliveries": 1,
            "done": 1,
            "failed": 0,
            "retried": 0,
            "deadLettered": 0,
            "numPending": 0,
            "numAckPending": 0,
        },
    }


def test_the_demo_retries_through_the_http_api_and_a_double_click_sends_nothing(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    summary, _, printed = demo
    assert summary["apiCalls"] == [
        {"method": "GET", "path": "/dead-letters", "status": 200},
        {"method": "GET", "path": f"/dead-letters/{LETTER_ID}", "status": 200},
        {"method": "POST", "path": f"/dead-letters/{LETTER_ID}/retry", "status": 200},
        {"method": "POST", "path": f"/dead-letters/{LETTER_ID}/retry", "status": 200},
        {"method": "GET", "path": f"/dead-letters/{LETTER_ID}", "status": 200},
    ]
    assert (
        f"POST /dead-letters/{LETTER_ID}/retry -> 200: sent=true, attempt 2 on integration as "
        f"message integration:{DEMO_COMMAND_ID}:2"
    ) in printed
    assert (
        f"POST /dead-letters/{LETTER_ID}/retry -> 200 (a double click): sent=false, already "
        "retried as attempt 2"
    ) in printed


def test_the_demo_prints_each_step_of_the_dead_letter_round_trip(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    _, _, printed = demo
    steps = [
        f"command: app.provision {DEMO_COMMAND_ID} for acme-web on integration",
        "integration: 4 deliveries (1 + 3 retries), 0 s apart in this demo "
        "(queue_retry_delay_s); deployed 30 s apart (QUEUE_CONSUMERS)",
        "delivery 1/4 (attempt 1): RuntimeError: cannot pull the image of app 'storefront'",
        "delivery 2/4 (attempt 1): the same error -> nak, delivered again in 0 s",
        "delivery 3/4 (attempt 1): the same error -> nak, delivered again in 0 s",
        "delivery 4/4 (attempt 1): the same error -> to the dead-letter queue",
        f"dead-letter consumer: 1 letter recorded, {LETTER_ID}",
        "operator API: uvicorn on http://127.0.0.1:",
        "GET /dead-letters?queue=integration -> 200: 1 open letter(s)",
        f"    id       {LETTER_ID}",
        '    payload  {"appName": "storefront"}',
        "    attempt  1, delivered 4 times",
        "fix: wrote the registry credentials to ",
        f"POST /dead-letters/{LETTER_ID}/retry -> 200: sent=true",
        "delivery 1/4 (attempt 2) on integration: done -> ack",
        f"GET /dead-letters/{LETTER_ID} -> 200: closed, resolution succeeded",
        "queue integration: 5 deliveries, 1 done, 3 retried, 1 dead-lettered, 0 pending",
        "COMMANDS stream: 0 messages left (work-queue retention)",
        "dead-letter round trip: closed (succeeded)",
    ]
    # Each step is printed, in this order.
    missing = [step for step in steps if step not in printed]
    assert missing == []
    positions = [printed.find(step) for step in steps]
    assert positions == sorted(positions)
