"""``make demo``: the write path end to end on the embedded default.

Starts nats-server and moto's S3 on loopback, creates the streams, runs the sample scenario
through the actors, publishes the outboxes, then reads every stream back with a second client
and prints, per stream, what arrived. Writes ``.rhumbatron/demo-summary.json``. Exits non-zero
if anything published is missing from its stream or arrived out of order.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any, TextIO

from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.local.stack import LocalStack
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron.runtime.settings import EVENT_STREAM_COUNT, load_settings
from rhumbatron.scenario import iter_scenario, load_scenario

__all__ = ["main", "run_demo"]


async def read_streams(nats_url: str) -> dict[str, dict[str, Any]]:
    """Every event stream as JetStream reports it, read with a client of its own."""
    import nats

    nc = await nats.connect(nats_url, name="rhumbatron-demo-reader")
    try:
        js = nc.jetstream()
        streams: dict[str, dict[str, Any]] = {}
        for index in range(EVENT_STREAM_COUNT):
            name = event_stream_name(index)
            info = await js.stream_info(name)
            events = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                if info.state.messages == 0:
                    break
                raw = await js.get_msg(name, seq)
                event = Event.parse(raw.data or b"")
                events.append(
                    {
                        "seq": seq,
                        "eventId": event.event_id,
                        "eventType": event.event_type,
                        "projectId": event.project_id,
                        "msgId": (raw.headers or {}).get("Nats-Msg-Id"),
                    }
                )
            config = info.config
            streams[name] = {
                "settings": {
                    "subjects": config.subjects,
                    "retention": getattr(config.retention, "value", config.retention),
                    "storage": getattr(config.storage, "value", config.storage),
                    "maxAgeSeconds": config.max_age,
                    "duplicateWindowSeconds": config.duplicate_window,
                    "replicas": config.num_replicas,
                    "allowAtomic": bool(config.allow_atomic),
                },
                "messages": info.state.messages,
                "events": events,
            }
        return streams
    finally:
        await nc.close()


async def run_demo(root: Path, scenario_path: Path, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Run the demo under ``root`` (wiped first) and return the summary it writes."""
    for leftover in ("state", "nats"):
        shutil.rmtree(root / leftover, ignore_errors=True)
    scenario = load_scenario(scenario_path)
    with LocalStack(root) as stack:
        assert stack.s3 is not None
        settings = load_settings(
            state_dir=root / "state", nats_url=stack.nats.url, s3_endpoint_url=stack.s3.endpoint_url
        )
        app = bootstrap(settings)
        try:
            streams_report = await app.ensure_streams()
            stack.s3.client().create_bucket(Bucket=settings.evidence_bucket)
            print(f"local stack: nats {stack.nats.url}  s3 {stack.s3.endpoint_url}", file=out)
            print(f"streams created: {', '.join(streams_report.created)}", file=out)

            # Fire the alarms after each transaction, as the deployed alarm would.
            results, reports = [], []
            for result in iter_scenario(app, scenario):
                results.append(result)
                reports += await app.drain_alarms()
            written = sum(r.events_added for r in results)
            print(f"scenario: {len(results)} actor transactions wrote {written} events", file=out)
            published = sum(r.published for r in reports)
            print(f"publisher: {len(reports)} alarm fires published {published} events", file=out)

            outbox: dict[str, dict[str, int]] = {}
            publish_order: dict[str, list[str]] = {}
            for ref in app.actor_refs():
                actor = app.actor(ref)
                outbox[ref.key] = counts_by_state(actor.connection)
                for row in actor.connection.execute(
                    "SELECT project_id, event_id FROM outbox WHERE state = 'published' ORDER BY seq"
                ):
                    publish_order.setdefault(ref.key, []).append(row["event_id"])
        finally:
            await app.close()
        streams = await read_streams(stack.nats.url)

    problems = _check(streams, publish_order, written)
    _print_streams(streams, out)
    totals = {state.value: sum(c[state.value] for c in outbox.values()) for state in RowState}
    print(f"outbox rows by state: {totals}", file=out)
    summary = {
        "projects": {
            p["id"]: {"stream": event_stream_name(stream_index(p["id"]))}
            for p in scenario["projects"]
        },
        "eventsWritten": written,
        "eventsPublished": published,
        "outbox": {"total": totals, "byActor": outbox},
        "streams": streams,
        "problems": problems,
    }
    (root / "demo-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {root / 'demo-summary.json'}", file=out)
    for problem in problems:
        print(f"PROBLEM: {problem}", file=out)
    return summary


def _check(
    streams: dict[str, dict[str, Any]], publish_order: dict[str, list[str]], written: int
) -> list[str]:
    problems = []
    position = {e["eventId"]: (name, e["seq"]) for name, s in streams.items() for e in s["events"]}
    if len(position) != written:
        problems.append(f"{written} events written but {len(position)} on the streams")
    for actor_key, event_ids in publish_order.items():
        seqs = [position[e][1] for e in event_ids if e in position]
        missing = [e for e in event_ids if e not in position]
        if missing:
            problems.append(f"{actor_key}: {len(missing)} published events missing from streams")
        if seqs != sorted(seqs):
            problems.append(f"{actor_key}: events out of outbox order on their stream")
    return problems


def _print_streams(streams: dict[str, dict[str, Any]], out: TextIO) -> None:
    for name, stream in streams.items():
        if not stream["events"]:
            print(f"{name}: empty", file=out)
            continue
        print(f"{name}: {stream['messages']} events", file=out)
        for event in stream["events"]:
            print(
                f"  #{event['seq']:<3} {event['projectId']:<14} {event['eventType']:<20} "
                f"{event['eventId']}",
                file=out,
            )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rhumbatron demo``."""
    import argparse

    parser = argparse.ArgumentParser(prog="rhumbatron demo", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path(".rhumbatron"))
    parser.add_argument("--scenario", type=Path, default=Path("samplefiles/scenario.json"))
    args = parser.parse_args(argv)
    summary = asyncio.run(run_demo(args.root, args.scenario))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
