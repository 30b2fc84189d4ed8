"""``make demo``: the whole Change lifecycle of the sample project on the embedded default
(nats-server and moto's S3 on loopback, SQLite actor files), run once for this module.

Provisioning through the HTTP API with a dead-letter round trip through it, a Change of four
Tasks requested and approved through it, where two agents overlap on a resource prefix
(Clef-flash abstains without a key, and wakes), a verified Candidate, promotion, canonical
advanced, the index built, the release completed, the Change read back over HTTP; the
reactions (signed webhooks verified by a local receiver, a self-caused loop the guard stops, a
replay dry run from the archive) — then the summary it prints and writes."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.product.dead_letters import command_dead_letter_id
from rhumbatron_dev.demo import (
    EXPECTED_STATES,
    app_command_id,
    check_summary,
    project_command_id,
    run_demo,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_PATH = REPO_ROOT / "samplefiles" / "lifecycle.json"
SAMPLE = json.loads(SAMPLE_PATH.read_text())
APP_COMMAND = app_command_id("acme-shop", "storefront")
LETTER_ID = command_dead_letter_id(APP_COMMAND)
# fnv1a32("acme-shop") mod 8, computed by hand from the FNV-1a constants.
PROJECT_STREAM = "EVENTS_02"

Demo = tuple[dict[str, Any], Path, str]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """Run the demo once for this module (it starts its own nats-server and S3)."""
    import asyncio

    root = tmp_path_factory.mktemp("demo") / "root"
    out = io.StringIO()
    summary = asyncio.run(run_demo(root, SAMPLE_PATH, out))
    return summary, root, out.getvalue()


def _task_id(change_id: str, task_id: str) -> str:
    return task_id.removeprefix(f"{change_id}.")


# --------------------------------------------------------------------------- the whole run


def test_the_demo_runs_the_whole_lifecycle_without_problems_in_under_a_minute(
    demo: Demo,
) -> None:
    # GIVEN the demo ran once  WHEN its summary is read
    summary, _, printed = demo
    # THEN nothing expected is missing, and it took well under a minute
    assert summary["problems"] == []
    assert "PROBLEM" not in printed and "STOPPED" not in printed
    assert summary["timingsS"]["total"] < 60
    assert set(summary["timingsS"]) == {
        "provision",
        "deadLetterRoundTrip",
        "toAwaitingApproval",
        "toCompleted",
        "reactions",
        "replay",
        "total",
    }


def test_the_demo_writes_its_summary_file(demo: Demo) -> None:
    summary, root, printed = demo
    written = json.loads((root / "demo-summary.json").read_text())
    assert written == summary
    assert f"summary: {root / 'demo-summary.json'}" in printed


# --------------------------------------------------------------------------- the Change


def test_the_change_moves_through_its_states_in_order(demo: Demo) -> None:
    summary, _, printed = demo
    change = summary["change"]
    # THEN open -> verifying -> awaiting_approval -> releasing -> completed, in time order
    assert [s["state"] for s in change["states"]] == list(EXPECTED_STATES)
    times = [s["atMs"] for s in change["states"]]
    assert times[0] == 0 and times == sorted(times)
    assert change["status"] == "completed"
    assert "states: open (+0 ms) -> verifying (+" in printed
    assert "-> completed (+" in printed


def test_a_repeated_change_request_returns_the_first_change(demo: Demo) -> None:
    summary, _, printed = demo
    change = summary["change"]
    path = "/projects/acme-shop/changes"
    # THEN the first request created the Change (201); the repeat answered it again (200)
    assert change["clientRequestId"] == SAMPLE["change"]["clientRequestId"]
    assert change["repeat"] == {"changeId": change["id"], "created": False}
    requests = [c for c in summary["apiCalls"] if c["path"] == path]
    assert requests == [
        {"method": "POST", "path": path, "status": 201},
        {"method": "POST", "path": path, "status": 200},
    ]
    assert (
        f"POST {path} -> 201: created {change['id']} (client request "
        f"{SAMPLE['change']['clientRequestId']}), open, 4 tasks"
    ) in printed
    assert f"POST {path} -> 200 (the same request again): {change['id']}, created=false" in printed


def test_the_change_timeline_holds_its_facts_in_time_order_with_timings(demo: Demo) -> None:
    summary, _, printed = demo
    change = summary["change"]
    timeline = change["timeline"]
    types = [f["eventType"] for f in timeline]
    # THEN it starts at its creation and ends completed, each fact timed from the creation
    assert timeline[0] == {"eventType": "change.created", "taskId": None, "atMs": 0}
    assert types[-1] == "change.completed"
    assert [f["atMs"] for f in timeline] == sorted(f["atMs"] for f in timeline)
    for kind in ("task.ready", "task.assigned", "task.started", "task.completed"):
        assert types.count(kind) == 4, kind
    order = [
        "change.planned",
        "verification.started",
        "candidate.created",
        "candidate.verified",
        "promotion.completed",
        "candidate.promoted",
        "release.started",
        "release.completed",
    ]
    assert [t for t in types if t in order] == order
    assert f"change {change['id']} 'Gift cards at checkout': {len(timeline)} facts" in printed
    assert "ms  task.completed tsk-docs" in printed


def test_the_change_has_four_tasks_with_dependencies_all_completed(demo: Demo) -> None:
    summary, _, _ = demo
    change = summary["change"]
    # The API (read back at the end) names each Task, and each it depends on, qualified by
    # its Change; as the sample names them, they are the sample's graph.
    qualified = [t["taskId"] for t in change["tasks"]] + [
        d for t in change["tasks"] for d in t["dependsOn"]
    ]
    assert all(i.startswith(f"{change['id']}.") for i in qualified)
    tasks = {
        _task_id(change["id"], t["taskId"]): (
            t["agent"],
            sorted(_task_id(change["id"], d) for d in t["dependsOn"]),
            t["status"],
        )
        for t in change["tasks"]
    }
    assert tasks == {
        t["taskId"]: (t["agentId"], sorted(t.get("dependsOn", [])), "completed")
        for t in SAMPLE["change"]["tasks"]
    }


def test_two_agents_overlapping_on_a_prefix_ask_clef_flash_which_abstains_and_wakes(
    demo: Demo,
) -> None:
    summary, _, printed = demo
    decisions = summary["change"]["clefFlash"]
    # THEN builder-b's work under src/checkout/ overlaps builder-a's prefix: without a key
    # Clef-flash abstains, and the abstention sends builder-a a wake
    assert decisions
    for decision in decisions:
        assert decision["by"] == "agent:builder-b"
        assert (decision["agent"], decision["verdict"]) == ("builder-a", "abstain")
        assert (decision["source"], decision["reason"]) == ("no_key", "no API key")
        assert decision["woke"] and all(c.endswith("tsk-checkout") for c in decision["woke"])
    assert "overlaps builder-a by prefix: abstain (no API key) -> woke cmd_evt_" in printed


def test_the_promoted_candidate_advances_canonical_builds_the_index_and_releases(
    demo: Demo,
) -> None:
    summary, _, printed = demo
    change = summary["change"]
    written = sorted(
        path
        for steps in SAMPLE["scripts"].values()
        for step in steps
        if step["do"] == "propose_changeset"
        for path in step["files"]
    )
    (candidate,) = change["candidates"]
    assert (candidate["status"], candidate["baseGeneration"]) == ("promoted", 0)
    assert sorted(candidate["paths"]) == written
    assert change["canonicalGeneration"] == 1
    assert change["index"]["readyGeneration"] == 1
    assert [h["path"] for h in change["index"]["hits"]] == ["src/models/gift_card.py"]
    assert "[GiftCard]" in change["index"]["hits"][0]["snippet"]
    assert change["releases"] == [
        {
            "id": "rel_acme-shop_1",
            "status": "completed",
            "generation": 1,
            "app": "storefront",
            "deployedFiles": written,
            "liveGeneration": "1",
        }
    ]
    assert "index: generation 1; search 'GiftCard': src/models/gift_card.py" in printed
    assert "release rel_acme-shop_1: completed, generation 1 live on storefront: " in printed


# --------------------------------------------------------------------------- the dead letter


def test_the_demo_dead_letter_closes_as_succeeded_after_the_retry(demo: Demo) -> None:
    summary, _, _ = demo
    # The command failed its 4 deliveries as attempt 1, was retried as attempt 2, succeeded.
    (letter,) = summary["deadLetters"]
    assert letter["id"] == LETTER_ID
    assert (letter["commandId"], letter["commandType"]) == (APP_COMMAND, "app.provision")
    assert letter["queue"] == "integration"
    assert (letter["attempt"], letter["retriedAttempt"]) == (1, 2)
    assert letter["attempts"] == [
        {"attempt": 1, "deliveries": 4, "outcome": "dead-lettered"},
        {"attempt": 2, "deliveries": 1, "outcome": "succeeded"},
    ]
    assert (letter["status"], letter["resolution"]) == ("closed", "succeeded")
    assert "failed on integration after 4 deliveries" in letter["reason"]
    assert "AppProvisioningError" in letter["reason"]


def test_the_demo_retries_through_the_http_api_and_a_double_click_sends_nothing(
    demo: Demo,
) -> None:
    summary, _, printed = demo
    assert [c for c in summary["apiCalls"] if c["path"].startswith("/dead-letters")] == [
        {"method": "GET", "path": "/dead-letters", "status": 200},
        {"method": "GET", "path": f"/dead-letters/{LETTER_ID}", "status": 200},
        {"method": "POST", "path": f"/dead-letters/{LETTER_ID}/retry", "status": 200},
        {"method": "POST", "path": f"/dead-letters/{LETTER_ID}/retry", "status": 200},
        {"method": "GET", "path": f"/dead-letters/{LETTER_ID}", "status": 200},
    ]
    assert (
        f"POST /dead-letters/{LETTER_ID}/retry -> 200: sent=true, attempt 2 on integration as "
        f"message integration:{APP_COMMAND}:2"
    ) in printed
    assert (
        f"POST /dead-letters/{LETTER_ID}/retry -> 200 (a double click): sent=false, already "
        "retried as attempt 2"
    ) in printed


# --------------------------------------------------------------------------- the HTTP API


def test_the_demo_drives_the_whole_lifecycle_through_the_http_api(demo: Demo) -> None:
    summary, _, printed = demo
    change_id = summary["change"]["id"]
    change = f"/projects/acme-shop/changes/{change_id}"
    # THEN every user action is an HTTP call, in the lifecycle's order, each answered as the
    # API documents it: queued commands 202, the Change created 201 then found again 200
    assert summary["apiCalls"] == [
        {"method": "POST", "path": "/projects", "status": 202},
        {"method": "POST", "path": "/projects/acme-shop/apps", "status": 202},
        {"method": "GET", "path": "/dead-letters", "status": 200},
        {"method": "GET", "path": f"/dead-letters/{LETTER_ID}", "status": 200},
        {"method": "POST", "path": f"/dead-letters/{LETTER_ID}/retry", "status": 200},
        {"method": "POST", "path": f"/dead-letters/{LETTER_ID}/retry", "status": 200},
        {"method": "GET", "path": f"/dead-letters/{LETTER_ID}", "status": 200},
        {"method": "POST", "path": "/projects/acme-shop/changes", "status": 201},
        {"method": "POST", "path": "/projects/acme-shop/changes", "status": 200},
        {"method": "POST", "path": f"{change}/approve", "status": 200},
        {"method": "GET", "path": change, "status": 200},
    ]
    # AND the commands the API queued are the ones the demo follows (and resends)
    assert (
        "POST /projects -> 202: project.provision "
        f"{project_command_id('acme-shop')} on integration, duplicate=false"
    ) in printed
    assert (
        f"POST /projects/acme-shop/apps -> 202: app.provision {APP_COMMAND} on integration, "
        "duplicate=false"
    ) in printed
    # AND the approval promoted the verified Candidate; the read-back is the summary's Change
    (candidate,) = summary["change"]["candidates"]
    assert (
        f"POST {change}/approve -> 200: candidate {candidate['id']} (base generation 0) promoted"
    ) in printed
    assert (
        f"GET {change} -> 200: completed; tasks completed 4; candidates promoted 1; "
        "releases completed 1"
    ) in printed


# --------------------------------------------------------------------------- the counts


def test_the_demo_counts_commands_per_queue(demo: Demo) -> None:
    summary, _, printed = demo
    commands = summary["commands"]
    queues = commands["queues"]
    # THEN every queue is drained, and JetStream's deliveries cover what the handlers did
    assert commands["stream"]["left"] == 0
    assert all(q["numPending"] == 0 and q["numAckPending"] == 0 for q in queues.values())
    integration = queues["integration"]["handled"]
    assert integration["project.provision"] == {"done": 1}
    assert integration["app.provision"] == {"done": 1}  # attempt 2; attempt 1 raised 4 times
    assert integration["candidate.create"] == {"done": 1}
    assert integration["change.dispatch"]["done"] >= 1
    # 1 project + 4 failed and 1 retried app deliveries, at least
    assert queues["integration"]["deliveries"] >= 6 + integration["change.dispatch"]["done"]
    assert queues["verification"]["handled"] == {"verification.start": {"done": 1}}
    assert queues["release"]["handled"] == {"release.start": {"done": 1}}
    assert queues["agent-wakeups"]["handled"]["agent.wake"]["delivered"] >= 4
    assert queues["indexing"]["deliveries"] >= 1
    assert queues["dead-letter"]["deliveries"] == 1
    assert "commands: the COMMANDS stream stored " in printed
    assert "handled: app.provision done 1; " in printed


def test_the_demo_counts_the_duplicates_it_dropped(demo: Demo) -> None:
    summary, _, printed = demo
    dropped = summary["duplicatesDropped"]
    assert dropped["changeRequests"] == 1
    assert dropped["commandResends"] == 1
    assert dropped["operatorRetries"] == 1
    # artifact.promoted and canonical.advanced both send the index build of generation 1
    assert dropped["routerCommandSends"] >= 1
    assert dropped["total"] == sum(v for k, v in dropped.items() if k != "total")
    assert f"resent {project_command_id('acme-shop')} with the same ID: duplicate" in printed


# --------------------------------------------------------------------------- streams, archive


def test_every_event_lands_on_the_projects_stream_in_outbox_order(demo: Demo) -> None:
    summary, _, printed = demo
    streams = summary["streams"]
    assert summary["project"] == {"id": "acme-shop", "tenant": "acme", "stream": PROJECT_STREAM}
    events = streams[PROJECT_STREAM]["events"]
    assert {e["projectId"] for e in events} == {"acme-shop"}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(e["msgId"] == e["eventId"] for e in events)
    assert all(s["events"] == [] for name, s in streams.items() if name != PROJECT_STREAM)
    total = summary["outbox"]["total"]
    assert total == {"pending": 0, "retry_wait": 0, "published": len(events), "failed": 0}
    by_type = streams[PROJECT_STREAM]["byType"]
    assert sum(by_type.values()) == len(events)
    for kind, count in {
        "project.created": 1,
        "app.provisioned": 1,
        "change.created": 1,
        "task.completed": 4,
        "artifact.promoted": 1,
        "canonical.advanced": 1,
        "release.completed": 1,
        "change.completed": 1,
    }.items():
        assert by_type[kind] == count, kind
    woke = by_type["agent.woke"]
    assert f"  {PROJECT_STREAM}: {len(events)} events: agent.woke {woke}, app.provisioned 1, " in (
        printed
    )
    assert "  EVENTS_07: empty" in printed


def test_the_demo_reports_stream_settings_as_jetstream_has_them(demo: Demo) -> None:
    summary, _, _ = demo
    for index in range(8):
        assert summary["streams"][f"EVENTS_0{index}"]["settings"] == {
            "subjects": [f"events.0{index}"],
            "retention": "limits",
            "storage": "file",
            "maxAgeSeconds": 7 * 86_400,
            "duplicateWindowSeconds": 2 * 3600,
            "replicas": 1,
            "allowAtomic": True,
            "allowBatched": True,
        }


def test_every_event_is_in_the_audit_archive(demo: Demo) -> None:
    summary, _, printed = demo
    archive = summary["archive"]
    on_stream = {e["eventId"] for e in summary["streams"][PROJECT_STREAM]["events"]}
    assert {i for item in archive for i in item["eventIds"]} == on_stream
    assert all(item["key"].split("/")[4] == "stream-02" for item in archive)
    assert all(item["key"].endswith(".ndjson.gz") for item in archive)
    assert f"archive: {len(archive)} objects" in printed


def test_the_router_applies_every_event_and_leaves_every_consumer_at_lag_0(demo: Demo) -> None:
    summary, _, printed = demo
    view = summary["view"]
    assert view["eventsApplied"] == summary["streams"][PROJECT_STREAM]["messages"]
    assert view["canonicalGeneration"] == 1
    assert view["changesByState"] == {"completed": 1}
    assert view["tasksByState"] == {"completed": 4}
    assert len(summary["consumers"]) == 40
    assert all(c["numPending"] == 0 and c["numAckPending"] == 0 for c in summary["consumers"])
    assert summary["metricCounts"]["eventMetrics"]["task_completed"] == 4
    assert "router consumers: 40, at lag 0: 40" in printed


def test_the_demo_prints_each_step_in_order(demo: Demo) -> None:
    _, _, printed = demo
    steps = [
        "API: uvicorn on http://127.0.0.1:",
        "reactions: webhook receiver on http://127.0.0.1:",
        "== 1. provision project acme-shop (tenant acme) and app storefront",
        "POST /projects -> 202: project.provision ",
        "project acme-shop created; tenant acme",
        f"POST /projects/acme-shop/apps -> 202: app.provision {APP_COMMAND}",
        "integration: 4 deliveries (1 + 3 retries), 0 s apart in this demo "
        "(queue_retry_delay_s); deployed 30 s apart (QUEUE_CONSUMERS)",
        f"dead-letter consumer: letter {LETTER_ID} recorded",
        "== 2. dead-letter round trip through the operator API",
        "GET /dead-letters?queue=integration -> 200: 1 open letter(s)",
        f"    id       {LETTER_ID}",
        '    payload  {"appName": "storefront"}',
        f"POST /dead-letters/{LETTER_ID}/retry -> 200: sent=true",
        "attempt 2 on integration: done; app storefront is live",
        f"GET /dead-letters/{LETTER_ID} -> 200: closed, resolution succeeded",
        "== 3. a Change of 4 Tasks: 'Gift cards at checkout'",
        "  tsk-docs       builder-b  Document gift cards after tsk-checkout, tsk-payments",
        "POST /projects/acme-shop/changes -> 201: created ",
        "POST /projects/acme-shop/changes -> 200 (the same request again): ",
        ": awaiting_approval",
        "== 4. approve, promote, index, release",
        "/approve -> 200: candidate ",
        "canonical generation 1; index ready at generation 1",
        ": completed",
        "== 5. reactions: signed webhooks, and a loop the guard stopped",
        "receiver: 8 deliveries answered 204, 8 with a verified signature; 0 rejected (401)",
        "ci-bot answers evt_",
        "loop guard: intent.declared evt_",
        "  cause chain: intent.declared evt_",
        "== 6. sweep: archive, analytics, lag; the Change read back",
        "GET /projects/acme-shop/changes/",
        "== 7. replay the reactions subscription from the S3 archive (dry run)",
        "rhumbatron replay --source archive --subscription reactions --stream 2 --start ",
        "== summary",
        "events per stream and type:",
        "duplicates dropped: changeRequests 1, commandResends 1, ",
        f"dead letter {LETTER_ID}: app.provision {APP_COMMAND} on integration; attempt 1: 4 "
        "deliveries, dead-lettered, attempt 2: 1 deliveries, succeeded; closed (succeeded)",
        "reactions: 8 webhooks delivered, 8 verified, 0 rejected; suppressed: self_cause 1; ",
        "timings: provision ",
    ]
    missing = [step for step in steps if step not in printed]
    assert missing == []
    positions = [printed.find(step) for step in steps]
    assert positions == sorted(positions)


# --------------------------------------------------------------------------- the checks


def test_the_checks_name_each_missing_outcome(demo: Demo) -> None:
    # GIVEN the real summary with its outcomes taken away one by one
    summary, _, _ = demo
    broken = copy.deepcopy(summary)
    broken["change"]["states"] = broken["change"]["states"][:-1]
    broken["change"]["clefFlash"] = []
    broken["change"]["releases"] = []
    broken["deadLetters"][0]["resolution"] = None
    broken["outbox"]["total"]["pending"] = 2
    broken["archive"] = broken["archive"][1:]
    broken["timingsS"]["total"] = 61.0
    broken["reactions"]["deliveries"] = []
    broken["reactions"]["suppressions"] = []
    broken["reactions"]["replay"]["wouldApply"] = 3
    # WHEN it is checked
    problems = "\n".join(check_summary(broken))
    # THEN each miss is named
    assert (
        "the Change moved through ['open', 'verifying', 'awaiting_approval', 'releasing']"
        in problems
    )
    assert "Clef-flash was never asked" in problems
    assert "expected one completed release live at generation 1; found []" in problems
    assert "expected one letter closed as succeeded by attempt 2" in problems
    assert "outbox rows written but" in problems
    assert "events on the streams are not archived" in problems
    assert "over its 60 s budget" in problems
    assert "the webhook receiver verified no delivery" in problems
    assert "the loop guard recorded no self_cause or depth suppression" in problems
    assert "3 would apply" in problems
    assert check_summary(summary) == []


def test_the_checks_report_a_run_that_never_created_the_change(demo: Demo) -> None:
    summary, _, _ = demo
    broken = copy.deepcopy(summary)
    broken["change"] = None
    assert "no Change was created" in check_summary(broken)


# --------------------------------------------------------------------------- the reactions


def test_the_local_receiver_verified_a_signed_delivery_of_every_subscribed_fact(
    demo: Demo,
) -> None:
    summary, _, printed = demo
    reactions = summary["reactions"]
    subscriptions = {s["name"]: s for s in reactions["subscriptions"]}
    on_stream = {e["eventId"]: e for e in summary["streams"][PROJECT_STREAM]["events"]}
    deliveries = reactions["deliveries"]
    # THEN every subscribed fact of the lifecycle reached the receiver once, signed and
    # verified, under the webhook-id <eventId>:<subscriptionId>; nothing was rejected
    assert deliveries and all(d["signatureVerified"] is True for d in deliveries)
    assert reactions["rejected"] == []
    by_subscription = {
        name: sorted(d["kind"] for d in deliveries if d["subscription"] == name)
        for name in subscriptions
    }
    assert by_subscription == {
        "notify": ["change.completed"] + ["task.completed"] * 4,
        "ci-intents": ["intent.declared"] * 3,
    }
    for delivery in deliveries:
        sub = subscriptions[delivery["subscription"]]
        assert delivery["webhookId"] == f"{delivery['eventId']}:{sub['id']}"
        assert on_stream[delivery["eventId"]]["eventType"] == delivery["kind"]
    assert len({d["webhookId"] for d in deliveries}) == len(deliveries)
    assert reactions["receiver"].startswith("http://127.0.0.1:")
    assert "  notify      change.completed 1, task.completed 4" in printed
    assert "  ci-intents  intent.declared 3" in printed


def test_a_self_caused_intent_is_suppressed_with_its_cause_chain(demo: Demo) -> None:
    summary, _, printed = demo
    reactions = summary["reactions"]
    echo = reactions["echo"]
    answered_event = echo["answers"].split(":")[0]
    ci_intents = next(s["id"] for s in reactions["subscriptions"] if s["name"] == "ci-intents")
    # THEN the CI bot's intent, written in the correlation of a ci-intents delivery, is on
    # the stream but was held back from ci-intents as self-caused, one hop deep
    assert (echo["kind"], echo["actor"]) == ("intent.declared", "agent:ci-bot")
    assert echo["correlationId"] == echo["answers"] == f"{answered_event}:{ci_intents}"
    on_stream = {e["eventId"] for e in summary["streams"][PROJECT_STREAM]["events"]}
    assert echo["eventId"] in on_stream
    assert echo["eventId"] not in {d["eventId"] for d in reactions["deliveries"]}
    (held,) = reactions["suppressions"]
    assert (held["eventId"], held["reason"], held["subscription"], held["depth"]) == (
        echo["eventId"],
        "self_cause",
        "ci-intents",
        1,
    )
    assert held["causeChain"] == [
        {
            "eventId": answered_event,
            "eventType": "intent.declared",
            "subscriptionId": ci_intents,
            "subscription": "ci-intents",
        }
    ]
    assert (
        f"loop guard: intent.declared {echo['eventId']} not delivered to ci-intents: self_cause"
    ) in printed
    assert (
        f"  cause chain: intent.declared {answered_event} fired ci-intents -> {echo['eventId']}"
    ) in printed


def test_a_replay_dry_run_from_the_archive_finds_every_event_already_applied(
    demo: Demo,
) -> None:
    summary, _, printed = demo
    replay = summary["reactions"]["replay"]
    events = summary["streams"][PROJECT_STREAM]["messages"]
    # THEN the archive holds every event of the project's stream, and each was already
    # applied by the reactions subscription: a replay would change nothing
    assert (replay["source"], replay["subscription"], replay["stream"], replay["dryRun"]) == (
        "archive",
        "reactions",
        2,
        True,
    )
    assert (replay["scanned"], replay["wouldApply"], replay["alreadyApplied"]) == (
        events,
        0,
        events,
    )
    assert (replay["inFlight"], replay["failed"]) == (0, 0)
    assert (
        f"  {events} archived events: would apply 0, already applied {events}, in flight 0; "
        "nothing changed"
    ) in printed


def test_an_ops_agent_triages_the_dead_letter_and_reads_the_audit_over_mcp(demo: Demo) -> None:
    # GIVEN the demo's run, WHEN its ops agent uses the MCP tools (the SDK's own client)
    summary, _, printed = demo
    # THEN it found the dead letter's group, inspected it, and read the two Retries the
    #   operator clicked in the audit; every tool call is printed
    assert "an ops agent triages it over MCP (" in printed
    assert "  mcp tool list_dead_letter_groups() -> ok" in printed
    assert '  mcp tool inspect_dead_letter({"id": "dl_' in printed
    assert "retryable=true: app.provision <id> failed on integration" in printed
    assert '  mcp tool read_audit({"limit": 200}) -> ok' in printed
    assert summary["auditedRetries"] == 2
