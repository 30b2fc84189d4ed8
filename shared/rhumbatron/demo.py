"""``make demo``: the write path and the event router end to end on the embedded default.

Starts nats-server and moto's S3 on loopback, creates the streams, runs the sample scenario
through the actors, publishes the outboxes (each publish nudges the router in process), then
runs one sweep tick per stream so the archive and analytics batches run too. Prints what
arrived on each stream, each project view, the archive objects written, the metrics recorded
and every consumer's lag. Writes ``.rhumbatron/demo-summary.json``. Exits non-zero if anything
published is missing from its stream or arrived out of order, or a consumer is left behind.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.local.stack import LocalStack
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.router.event_router import SweepReport, tick_kind
from rhumbatron.router.nudge import InProcessNudge
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron.runtime.settings import EVENT_STREAM_COUNT, Settings, load_settings
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
        nudge = InProcessNudge()
        app = bootstrap(settings, nudge=nudge)
        app.router()  # the publisher's nudges now reach the router in this process
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
            await nudge.settle()
            print(f"router: {nudge.runs} nudge runs applied the events to the views", file=out)
            router_summary = await _run_router(app, [p["id"] for p in scenario["projects"]], out)
        finally:
            await app.close()
        streams = await read_streams(stack.nats.url)

    problems = _check(streams, publish_order, written)
    problems += [
        f"consumer {c['consumer']} on {c['stream']} is behind: {c['numPending']} pending, "
        f"{c['numAckPending']} unacknowledged"
        for c in router_summary["consumers"]
        if c["numPending"] or c["numAckPending"]
    ]
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
        **router_summary,
        "problems": problems,
    }
    (root / "demo-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {root / 'demo-summary.json'}", file=out)
    for problem in problems:
        print(f"PROBLEM: {problem}", file=out)
    return summary


def _ordinary_tick(stream: int, day: datetime, settings: Settings) -> datetime:
    """The first minute of ``day`` whose sweep visits ``stream`` and runs every batch."""
    for minute in range(24 * 60):
        when = day + timedelta(minutes=minute)
        if tick_kind(settings, when) == (stream, False, False):
            return when
    raise AssertionError(f"no ordinary tick visits stream {stream}")


async def _run_router(app: Rhumbatron, project_ids: list[str], out: TextIO) -> dict[str, Any]:
    """One sweep tick per stream, then the views, archive, metrics and lag, printed."""
    from rhumbatron.metrics import MetricBinding, metric_counts

    router = app.router()
    today = app.clock.now().replace(hour=0, minute=0, second=0, microsecond=0)
    sweeps: list[SweepReport] = []
    for index in range(EVENT_STREAM_COUNT):
        sweeps.append(await router.sweep(now=_ordinary_tick(index, today, app.settings)))
    archive = [{"key": key, "events": count} for s in sweeps for key, count in s.archive_objects]
    views = {pid: router.projector.view(pid).snapshot(latest=5) for pid in project_ids}
    product = app.product().connection
    metrics = {
        "eventMetrics": metric_counts(product, MetricBinding.EVENT_METRICS),
        "metrics": metric_counts(product, MetricBinding.METRICS),
    }
    consumers = [
        {
            "stream": lag.stream,
            "consumer": lag.consumer,
            "numPending": lag.num_pending,
            "numAckPending": lag.num_ack_pending,
        }
        for lag in await router.consumer_lags()
    ]
    for pid, view in views.items():
        print(
            f"view {pid}: {view['eventsApplied']} events, generation "
            f"{view['canonicalGeneration']}, changes {view['changesByState']}, "
            f"tasks {view['tasksByState']}, latest {view['latestEvents'][0]['eventType']}",
            file=out,
        )
    print(f"archive: {len(archive)} objects", file=out)
    for item in archive:
        print(
            f"  s3://{app.settings.evidence_bucket}/{item['key']}  {item['events']} events",
            file=out,
        )
    print(f"event metrics: {metrics['eventMetrics']}", file=out)
    print(f"metrics: {sum(metrics['metrics'].values())} lag and backlog points", file=out)
    behind = [c for c in consumers if c["numPending"] or c["numAckPending"]]
    print(f"consumers: {len(consumers)}, at lag 0: {len(consumers) - len(behind)}", file=out)
    return {"consumers": consumers, "views": views, "archive": archive, "metricCounts": metrics}


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
