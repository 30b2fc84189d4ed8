"""``make demo``: the write path, the event router and the command plane end to end on the
embedded default.

Starts nats-server and moto's S3 on loopback, creates the streams, runs the sample scenario
through the actors, publishes the outboxes (each publish nudges the router in process), then
runs one sweep tick per stream so the archive and analytics batches run too. Prints what
arrived on each stream, each project view, the archive objects written, the metrics recorded
and every consumer's lag.

Then the dead-letter round trip (issue #4): an ``app.provision`` on the integration queue fails
on every delivery because the registry credentials it needs are missing; after 1 + 3 deliveries
the runtime moves it to the dead-letter queue, whose consumer records the letter. The operator
API (uvicorn on a loopback port, a static bearer token) shows the letter; the demo writes the
credentials, retries the letter through the API, the integration queue runs attempt 2, and the
letter closes as ``succeeded``.

Writes ``.rhumbatron/demo-summary.json``. Exits non-zero if anything published is missing from
its stream or arrived out of order, a consumer is left behind, or the dead-letter round trip
did not end ``succeeded``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rhumbatron import operator
from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.local.stack import LocalStack
from rhumbatron.messaging.commands import DEAD_LETTER_QUEUE, QUEUE_CONSUMERS, consumer_name
from rhumbatron.messaging.queue_consumer import Delivery, PollReport, Retry, queue_row
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.operator import ANY_TENANT, MAX_PAGE
from rhumbatron.product.dead_letters import DeadLetter, command_dead_letter_id
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.queues.dead_letter import run_dead_letter_consumer
from rhumbatron.router.event_router import SweepReport, tick_kind
from rhumbatron.router.nudge import InProcessNudge
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron.runtime.settings import EVENT_STREAM_COUNT, Settings, load_settings
from rhumbatron.scenario import iter_scenario, load_scenario

if TYPE_CHECKING:
    import httpx

    from rhumbatron.messaging.queue_consumer import QueueConsumerRuntime

__all__ = ["DEMO_COMMAND_ID", "main", "run_demo"]


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
    for leftover in ("state", "nats", "registry"):
        shutil.rmtree(root / leftover, ignore_errors=True)
    scenario = load_scenario(scenario_path)
    # A token for this run only: the demo's API client is its one holder.
    api_token = secrets.token_urlsafe(24)
    with LocalStack(root) as stack:
        assert stack.s3 is not None
        settings = load_settings(
            state_dir=root / "state",
            nats_url=stack.nats.url,
            s3_endpoint_url=stack.s3.endpoint_url,
            # The failing command walks its retries at once here; deployed, each waits 30 s.
            queue_retry_delay_s={"integration": 0.0},
            api_auth_mode="static",
            api_tokens={
                api_token: {
                    "tenant": scenario["tenant"],
                    "scopes": ["dead-letters:read", "dead-letters:write"],
                }
            },
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
            streams = await read_streams(stack.nats.url)
            _print_streams(streams, out)
            totals = {
                state.value: sum(c[state.value] for c in outbox.values()) for state in RowState
            }
            print(f"outbox rows by state: {totals}", file=out)
            command_summary = await _run_command_plane(
                app,
                project_id=scenario["projects"][0]["id"],
                api_token=api_token,
                registry=root / "registry",
                out=out,
            )
        finally:
            await app.close()

    problems = _check(streams, publish_order, written)
    problems += [
        f"consumer {c['consumer']} on {c['stream']} is behind: {c['numPending']} pending, "
        f"{c['numAckPending']} unacknowledged"
        for c in router_summary["consumers"]
        if c["numPending"] or c["numAckPending"]
    ]
    problems += command_summary.pop("problems")
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
        **command_summary,
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


# -- the command plane: a command dead-lettered, retried through the API, succeeded ---------

#: The demo's failing command: one ID per run (the state and the streams are wiped first), so
#: its letter's ID is known before it exists.
DEMO_COMMAND_ID = "cmd_demo_app.provision_storefront"
#: PollReport fields as the summary names them.
_COUNTED = {
    "deliveries": "fetched",
    "done": "done",
    "failed": "failed",
    "retried": "retried",
    "deadLettered": "dead_lettered",
}


#: The longest one step of the round trip may take (a redelivery, a letter written).
_STEP_BOUND_S = 10.0


class _RoundTripError(Exception):
    """A step of the dead-letter round trip did not happen as it must; the demo reports it
    as a problem and exits non-zero."""


@dataclass(frozen=True, slots=True)
class _Run:
    """One delivery the demo's integration handler saw."""

    command_id: str
    attempt: int
    delivered: int
    max_deliveries: int
    error: str | None


@dataclass
class _AppProvisioner:
    """The demo's integration handler for ``app.provision``.

    Provisioning pulls the app's image, so it needs the registry credentials at
    ``credentials``. While they are missing it fails on every delivery, as a real handler
    would until someone fixes the cause: retrying alone cannot help, which is what the
    dead-letter path is for.
    """

    credentials: Path
    runs: list[_Run] = field(default_factory=list)

    async def __call__(self, command: Command, delivery: Delivery) -> Retry | None:
        error: str | None = None
        if command.command_type != "app.provision":
            error = f"the demo's integration worker does not run {command.command_type}"
        elif not self.credentials.exists():
            app_name = getattr(command.payload, "app_name", "?")
            error = (
                f"cannot pull the image of app {app_name!r}: no registry credentials at "
                f"{self.credentials}"
            )
        self.runs.append(
            _Run(
                command.command_id,
                command.attempt,
                delivery.delivered,
                delivery.max_deliveries,
                error,
            )
        )
        if error is not None:
            raise RuntimeError(error)
        return None


@dataclass
class _ApiClient:
    """The demo's HTTP client of the operator API: records every call, and turns an answer
    other than 200 (or no answer) into a :class:`_RoundTripError`."""

    http: httpx.AsyncClient
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def call(
        self, method: str, path: str, *, params: dict[str, str] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``(the line to print, the JSON body)`` of a 200 answer."""
        import httpx

        try:
            response = await self.http.request(method, path, params=params)
        except httpx.HTTPError as exc:
            raise _RoundTripError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        self.calls.append({"method": method, "path": path, "status": response.status_code})
        if response.status_code != 200:
            raise _RoundTripError(
                f"{method} {path} answered {response.status_code}: {response.text[:300]}"
            )
        body = response.json()
        assert isinstance(body, dict)
        query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
        return f"  {method} {path}{query} -> {response.status_code}", body


@asynccontextmanager
async def _serve_api(settings: Settings, token: str) -> AsyncIterator[tuple[str, _ApiClient]]:
    """The operator API under uvicorn on a free loopback port, on this event loop, with a
    runtime of its own (as its own process would have); yields its URL and a client that
    sends ``token``."""
    import httpx
    import uvicorn

    from rhumbatron.api import authenticator_from_settings, create_api

    api_runtime = bootstrap(settings)
    # The API's lifespan ensures the streams at start and closes its runtime at shutdown.
    api = create_api(api_runtime, authenticator_from_settings(settings, api_runtime.clock))
    # The socket listens before uvicorn runs: a request that comes first waits in the backlog
    # until uvicorn accepts it, so nothing has to wait for the server to start.
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(api, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10.0
        ) as http:
            yield url, _ApiClient(http)
    finally:
        server.should_exit = True
        await serving
        listener.close()


@dataclass
class _RoundTrip:
    """The dead-letter round trip of one command, printed step by step to ``out``, with
    the counts per queue and the API calls it made."""

    app: Rhumbatron
    handler: _AppProvisioner
    api_token: str
    out: TextIO
    totals: dict[str, dict[str, int]] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def say(self, text: str) -> None:
        print(text, file=self.out)

    def count(self, report: PollReport) -> None:
        counts = self.totals.setdefault(report.queue, dict.fromkeys(_COUNTED, 0))
        for key, attribute in _COUNTED.items():
            counts[key] += getattr(report, attribute)

    async def poll_until(
        self,
        poll: Callable[[], Awaitable[PollReport]],
        finished: Callable[[], bool],
        what: str,
    ) -> None:
        """Poll until ``finished()``, counting each poll.

        A nak without delay makes a message available again a moment later, not at once:
        JetStream handles the nak and the next no-wait pull on separate paths, so the pull
        right behind it can come back empty. Polling again until the step happened (bounded)
        waits for exactly that, and no longer.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + _STEP_BOUND_S
        while True:
            self.count(await poll())
            if finished():
                return
            if loop.time() > give_up_at:
                raise _RoundTripError(f"no {what} within {_STEP_BOUND_S:g} s")

    async def run(self, command: Command) -> None:
        """Fail ``command`` into the dead-letter queue, record its letter, then retry it
        through the API once the cause is fixed; raises :class:`_RoundTripError`."""
        app, handler = self.app, self.handler
        queue = command.spec.queue
        sent = await (await app.command_bus()).send(queue, command)
        self.say(
            f"command: {command.command_type} {command.command_id} for {command.project_id} "
            f"on {queue} (message {sent.message_id})"
        )
        self.say(
            f"  its handler needs registry credentials at {handler.credentials}: missing, so "
            "every delivery fails"
        )
        row = queue_row(queue, app.settings)
        self.say(
            f"  {queue}: {row.max_deliveries} deliveries (1 + {row.retries} retries), "
            f"{row.retry_delay_s:g} s apart in this demo (queue_retry_delay_s); deployed "
            f"{QUEUE_CONSUMERS[queue].retry_delay_s:g} s apart (QUEUE_CONSUMERS)"
        )
        runtime = await app.queue_runtime()
        await self.poll_until(
            lambda: runtime.poll(queue, handler),
            lambda: self.totals[queue]["deadLettered"] > 0,
            f"{queue} moving the command to the dead-letter queue",
        )
        for index, run in enumerate(handler.runs):
            then = (
                "to the dead-letter queue, terminated here"
                if run.delivered >= run.max_deliveries
                else f"nak, delivered again in {row.retry_delay_s:g} s"
            )
            earlier = [r.error for r in handler.runs[:index]]
            error = "the same error" if run.error in earlier else f"RuntimeError: {run.error}"
            self.say(
                f"  delivery {run.delivered}/{run.max_deliveries} (attempt {run.attempt}): "
                f"{error} -> {then}"
            )

        await self.poll_until(
            lambda: run_dead_letter_consumer(app),
            lambda: self.totals[DEAD_LETTER_QUEUE]["done"] > 0,
            "the dead-letter consumer recording the letter",
        )
        letter_id = command_dead_letter_id(command.command_id)
        recorded = self.totals[DEAD_LETTER_QUEUE]["done"]
        self.say(f"dead-letter consumer: {recorded} letter recorded, {letter_id}")

        async with _serve_api(app.settings, self.api_token) as (url, api):
            tenant = next(iter(app.settings.api_tokens.values())).tenant
            self.say(
                f"operator API: uvicorn on {url}, a static bearer token of tenant {tenant} "
                "(api_tokens)"
            )
            try:
                await self._through_the_api(runtime, queue, letter_id, api)
            finally:
                self.calls += api.calls

    async def _through_the_api(
        self, runtime: QueueConsumerRuntime, queue: str, letter_id: str, api: _ApiClient
    ) -> None:
        """List and inspect the letter, fix the cause, Retry (twice: exactly one send), run
        the retried command, and read the letter closed."""
        handler = self.handler
        line, page = await api.call("GET", "/dead-letters", params={"queue": queue})
        self.say(f"{line}: {len(page['items'])} open letter(s)")
        line, letter = await api.call("GET", f"/dead-letters/{letter_id}")
        self.say(line)
        deliveries = sum(1 for r in handler.runs if r.attempt == letter["attempt"])
        for label, value in (
            ("id", letter["id"]),
            ("command", f"{letter['commandType']} {letter['commandId']}"),
            ("project", f"{letter['projectId']} (tenant {letter['tenantId']})"),
            ("payload", json.dumps((letter["command"] or {}).get("payload"))),
            ("attempt", f"{letter['attempt']}, delivered {deliveries} times"),
            ("reason", letter["lastError"]),
            ("status", letter["status"]),
        ):
            self.say(f"    {label:<9}{value}")

        handler.credentials.parent.mkdir(parents=True, exist_ok=True)
        handler.credentials.write_text(json.dumps({"registry": "registry.demo.local"}) + "\n")
        self.say(f"fix: wrote the registry credentials to {handler.credentials}")

        line, retry = await api.call("POST", f"/dead-letters/{letter_id}/retry")
        self.say(
            f"{line}: sent={str(retry['sent']).lower()}, attempt {retry['attempt']} on "
            f"{retry['queue']} as message {retry['messageId']}"
        )
        line, again = await api.call("POST", f"/dead-letters/{letter_id}/retry")
        self.say(
            f"{line} (a double click): sent={str(again['sent']).lower()}, already retried "
            f"as attempt {again['alreadyRetriedAs']}"
        )
        if not retry["sent"] or again["sent"]:
            raise _RoundTripError(
                f"Retry must send exactly once; the two Retries sent {retry['sent']} and "
                f"{again['sent']}"
            )

        runs_before = len(handler.runs)
        await self.poll_until(
            lambda: runtime.poll(queue, handler),
            lambda: len(handler.runs) > runs_before,
            f"{queue} delivering the retried command",
        )
        run = handler.runs[-1]
        if run.error is not None:
            raise _RoundTripError(f"the retried command did not succeed on {queue}: {run.error}")
        self.say(
            f"  delivery {run.delivered}/{run.max_deliveries} (attempt {run.attempt}) on "
            f"{queue}: done -> ack; the runtime's success hook closes the letter"
        )
        line, closed = await api.call("GET", f"/dead-letters/{letter_id}")
        self.say(f"{line}: {closed['status']}, resolution {closed['resolution']}")


async def _run_command_plane(
    app: Rhumbatron, *, project_id: str, api_token: str, registry: Path, out: TextIO
) -> dict[str, Any]:
    """The dead-letter round trip, then the queues' state; returns the summary's
    ``commands`` (per queue), ``deadLetters``, ``apiCalls`` and the ``problems`` found."""
    trip = _RoundTrip(app, _AppProvisioner(registry / "credentials.json"), api_token, out)
    command = Command.create(
        command_id=DEMO_COMMAND_ID,
        command_type="app.provision",
        project_id=project_id,
        created_at=app.clock.now(),
        payload={"appName": "storefront"},
    )
    problems: list[str] = []
    try:
        await trip.run(command)
    except _RoundTripError as exc:
        problems.append(f"dead-letter round trip: {exc}")

    js = (await app.nats()).jetstream()
    for queue, counts in trip.totals.items():
        info = await js.consumer_info(COMMAND_STREAM, consumer_name(queue))
        counts["numPending"] = info.num_pending or 0
        counts["numAckPending"] = info.num_ack_pending or 0
        if counts["numPending"] or counts["numAckPending"]:
            problems.append(
                f"queue {queue} is left with {counts['numPending']} pending and "
                f"{counts['numAckPending']} unacknowledged commands"
            )
        trip.say(
            f"queue {queue}: {counts['deliveries']} deliveries, {counts['done']} done, "
            f"{counts['retried']} retried, {counts['deadLettered']} dead-lettered, "
            f"{counts['numPending']} pending"
        )
    held = (await js.stream_info(COMMAND_STREAM)).state.messages
    trip.say(f"{COMMAND_STREAM} stream: {held} messages left (work-queue retention)")

    page = operator.list_dead_letters(app, tenant_id=ANY_TENANT, status=None, limit=MAX_PAGE)
    letters = [_letter_summary(letter, trip.handler.runs) for letter in page.letters]
    mine = [x for x in letters if x["commandId"] == command.command_id]
    outcome = f"{mine[0]['status']} ({mine[0]['resolution']})" if mine else "without a letter"
    if not (mine and mine[0]["status"] == "closed" and mine[0]["resolution"] == "succeeded"):
        problems.append(f"the dead-letter round trip ended {outcome}, not closed as succeeded")
    trip.say(f"dead-letter round trip: {outcome}")
    return {
        "commands": trip.totals,
        "deadLetters": letters,
        "apiCalls": trip.calls,
        "problems": problems,
    }


def _letter_summary(letter: DeadLetter, runs: list[_Run]) -> dict[str, Any]:
    """A letter as the summary shows it, with the attempts the demo saw its command make."""
    mine = [r for r in runs if r.command_id == letter.command_id]
    attempts = []
    for attempt in sorted({r.attempt for r in mine}):
        of_attempt = [r for r in mine if r.attempt == attempt]
        last = of_attempt[-1]
        if last.error is None:
            outcome = "succeeded"
        elif last.delivered >= last.max_deliveries:
            outcome = "dead-lettered"
        else:
            outcome = "failed"
        attempts.append({"attempt": attempt, "deliveries": len(of_attempt), "outcome": outcome})
    return {
        "id": letter.dead_letter_id,
        "kind": letter.kind.value,
        "commandId": letter.command_id,
        "commandType": letter.command_type,
        "queue": letter.queue,
        "attempt": letter.attempt,
        "retriedAttempt": letter.retried_attempt,
        "attempts": attempts,
        "status": letter.status.value,
        "resolution": letter.resolution,
        "reason": letter.reason,
    }


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
    # The demo prints every step itself; the runtime's warnings about the command it fails on
    # purpose would only repeat them. Errors still show.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    summary = asyncio.run(run_demo(args.root, args.scenario))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
