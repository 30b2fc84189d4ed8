"""``make demo``: the whole Change lifecycle of the sample project on the embedded default.

One process, everything on loopback: nats-server and moto's S3 server
(:class:`~rhumbatron_dev.local.stack.LocalStack`), SQLite actor files, the in-process workflow
engine, and every role played in rounds by :class:`~rhumbatron_dev.local.loop.LocalLoop`
(the outbox publisher, the event router, each queue's consumer). The sample is
``samplefiles/lifecycle.json``. The API (operator and lifecycle routes) runs under uvicorn on
a loopback port for the whole run, with a static bearer token, and the demo calls it where a
user would:

1. **Provision.** ``POST /projects`` queues ``project.provision`` on the integration queue;
   once the project exists, ``POST /projects/{id}/apps`` queues ``app.provision``. The
   sample's app fails its first attempt (``failUntilAttempt``): 1 + 3 deliveries, then the
   dead-letter queue, whose consumer records the letter.
2. **Dead-letter round trip.** The demo lists and inspects the letter over HTTP and Retries
   it twice (the second sends nothing). Attempt 2 succeeds, the letter closes ``succeeded``,
   the app is live.
3. **A Change of four Tasks** with dependencies, requested twice with
   ``POST /projects/{id}/changes`` and one client request ID (201, then 200 with the first
   Change). Scripted agents play the Tasks; two of them overlap on a resource prefix, the one
   question the deterministic rules leave to Clef-flash, which abstains without an API key,
   and an abstention wakes. When every Task completed, a Candidate is composed and verified:
   the Change awaits approval.
4. **Approval.** ``POST /projects/{id}/changes/{changeId}/approve`` promotes the Candidate,
   canonical advances to generation 1, the index is built and the release deploys the
   canonical files to the app.
5. **Reactions.** Before step 1 the demo starts a
   :class:`~rhumbatron.reactions.local_webhook_receiver.LocalWebhookReceiver` on loopback
   (allowed by ``webhook_allowed_hosts``) and registers two webhook subscriptions through the
   registry, cooldown 0: ``notify`` (``task.completed``, ``change.completed``) and ``ci-intents``
   (``intent.declared``). The reactions consumer delivers every match of the lifecycle,
   signed; the receiver verifies each signature. Then the receiver's CI bot answers one
   ``intent.declared`` delivery with an intent of its own, in the delivery's correlation
   (its ``webhook-id``): it matches ``ci-intents`` again, and the self-cause guard holds it
   back, recording the suppression with its cause chain.
6. **Audit.** One sweep tick per stream runs the archiver and the analytics; the demo reads
   every stream back with a second client, lists the archive objects and reads the Change
   back with ``GET /projects/{id}/changes/{changeId}``.
7. **Replay.** A dry run of the ``reactions`` subscription from the S3 archive: how many
   archived events would take effect (none: each was applied once) and how many already did.

It prints each step, then a summary: events per stream and type, commands per queue, the
duplicates dropped, the dead letters, the archive objects, the reactions (deliveries,
suppressions, the replay), the Change's timeline with timings, its states in order, the
Clef-flash decisions, the index search and the release. It writes the same to
``.rhumbatron/demo/demo-summary.json`` and exits non-zero, naming each miss, when an expected
outcome is missing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from rhumbatron import operator
from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.actors.shard_commands import DeclareIntent
from rhumbatron.agents.signing import generate_secret
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import TaskPlan
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import ConfigurationError, RhumbatronError
from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.lifecycle.requests import CreatedChange
from rhumbatron.lifecycle.scripted_agent import ScriptLibrary
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.queue_consumer import queue_row
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.operator import ANY_TENANT, MAX_PAGE
from rhumbatron.product.dead_letters import DeadLetter
from rhumbatron.protocol.command_types import COMMAND_TYPES
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name, stream_index
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS, consumer_name
from rhumbatron.reactions.guards import suppressions
from rhumbatron.reactions.local_webhook_receiver import LocalWebhookReceiver
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import Governance, WebhookReaction
from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
from rhumbatron.reactions.webhook_verification import WebhookReceiver
from rhumbatron.router.replay import replay_archive
from rhumbatron.router.ticks import tick_kind
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.loop import LocalLoop

if TYPE_CHECKING:
    from collections.abc import Awaitable

    import httpx

    from rhumbatron.actors.alarms import AlarmSink
    from rhumbatron.runtime.lifecycle_assembly import Lifecycle

__all__ = [
    "EXPECTED_STATES",
    "SEARCH_WORD",
    "app_command_id",
    "check_summary",
    "main",
    "project_command_id",
    "read_streams",
    "run_demo",
]

#: The states the sample's Change passes through, in order.
EXPECTED_STATES = ("open", "verifying", "awaiting_approval", "releasing", "completed")
#: The word the demo searches the built index for (the sample's schema Task writes it).
SEARCH_WORD = "GiftCard"
#: The acceptance's bound on one run; a slower run is reported as a problem.
_DEMO_BUDGET_S = 60.0
#: Change events whose type names the state the Change ended in.
_ENDED = frozenset(
    f"change.{state}" for state in ("completed", "failed", "cancelled", "not_selected", "declined")
)
#: Scopes of the demo's one API token: what its calls need and no more — the operator's
#: dead-letter actions, provisioning the project and its app, requesting, approving and
#: reading the Change. (No agent registers over HTTP: the sample's agents are scripted.)
#: The demo's folder: it wipes its state and NATS store at each run, so it is never the
#: folder `rhumbatron up` keeps its state in (``.rhumbatron``).
DEFAULT_ROOT = Path(".rhumbatron/demo")
_API_SCOPES = [
    "dead-letters:read",
    "dead-letters:write",
    "projects:write",
    "changes:read",
    "changes:write",
    "audit:read",
]
#: The demo's ``clientRequestId`` of its app provisioning: the API makes the command ID of it,
#: so the demo knows the ID of the command it expects to be dead-lettered.
_APP_REQUEST_ID = "demo-provision-1"
#: How long the demo runs rounds at the end, at most, for the system to go quiet.
_SETTLE_BOUND_S = 10.0

_T = TypeVar("_T")


def project_command_id(project_id: str) -> str:
    """The ``project.provision`` command ``POST /projects`` queues: one ID per project, so a
    resend is a duplicate inside JetStream's window. The demo checks the API answers it."""
    return f"cmd_provision_{project_id}"


def app_command_id(project_id: str, app_name: str) -> str:
    """The ``app.provision`` command the demo's ``POST /projects/{id}/apps`` queues (its
    ``clientRequestId`` makes the ID), the one that is dead-lettered and retried. The demo
    checks the API answers it."""
    return f"cmd_app_{project_id}.{app_name}.provision.{_APP_REQUEST_ID}"


async def read_streams(nats_url: str) -> dict[str, dict[str, Any]]:
    """Every event stream as JetStream reports it, read with a client of its own: settings,
    message count, events by type, and each event (with its Change, Task, timestamp and, for
    a Change's state change, the state it moved to)."""
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
                entry = {
                    "seq": seq,
                    "eventId": event.event_id,
                    "eventType": event.event_type,
                    "projectId": event.project_id,
                    "changeId": event.change_id,
                    "taskId": event.task_id,
                    "actor": event.actor,
                    "timestamp": event.timestamp.isoformat(),
                    "msgId": (raw.headers or {}).get("Nats-Msg-Id"),
                }
                to_status = getattr(event.payload, "to_status", None)
                if to_status is not None:
                    entry["toStatus"] = to_status
                events.append(entry)
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
                    "allowBatched": bool(config.allow_batched),
                },
                "messages": info.state.messages,
                "byType": dict(sorted(Counter(e["eventType"] for e in events).items())),
                "events": events,
            }
        return streams
    finally:
        await nc.close()


class _StepError(Exception):
    """A step of the lifecycle did not happen as it must; the demo stops the lifecycle there,
    still reports what happened, and exits non-zero."""


@dataclass(frozen=True, slots=True)
class _Sample:
    """What the demo reads from the sample file."""

    path: Path
    tenant: str
    project_id: str
    project_name: str
    app_name: str
    fail_until_attempt: int
    client_request_id: str
    title: str
    tasks: tuple[TaskPlan, ...]

    @classmethod
    def load(cls, path: Path) -> _Sample:
        data = json.loads(path.read_text(encoding="utf-8"))
        try:
            change = data["change"]
            return cls(
                path=path,
                tenant=data["tenant"],
                project_id=data["project"]["id"],
                project_name=data["project"]["name"],
                app_name=data["app"]["name"],
                fail_until_attempt=int(data["app"].get("failUntilAttempt", 1)),
                client_request_id=change["clientRequestId"],
                title=change["title"],
                tasks=tuple(
                    TaskPlan(
                        task_id=t["taskId"],
                        title=t["title"],
                        agent_id=t["agentId"],
                        depends_on=tuple(t.get("dependsOn", ())),
                        script=t.get("script"),
                    )
                    for t in change["tasks"]
                ),
            )
        except (KeyError, TypeError) as exc:
            raise ConfigurationError(
                f"sample {path} lacks {exc}; it needs tenant, project (id, name), app (name) "
                "and change (clientRequestId, title, tasks), as samplefiles/lifecycle.json has"
            ) from exc


@dataclass(frozen=True, slots=True)
class _Answer:
    """An API answer the demo expected: the line to print (with its status) and its JSON
    body."""

    line: str
    body: dict[str, Any]


@dataclass
class _ApiClient:
    """The demo's HTTP client of the API: records every call, and turns an answer it did not
    expect (or no answer) into a :class:`_StepError`."""

    http: httpx.AsyncClient
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        expect: tuple[int, ...] = (200,),
    ) -> _Answer:
        """Send ``body`` (if any) as JSON; the answer, when its status is one of ``expect``
        (a queued command is 202, a created Change 201, the same Change found again 200)."""
        import httpx

        try:
            response = await self.http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise _StepError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        self.calls.append({"method": method, "path": path, "status": response.status_code})
        if response.status_code not in expect:
            raise _StepError(
                f"{method} {path} answered {response.status_code}, not "
                f"{' or '.join(map(str, expect))}: {response.text[:300]}"
            )
        answer = response.json()
        assert isinstance(answer, dict)
        query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
        return _Answer(f"  {method} {path}{query} -> {response.status_code}", answer)


@asynccontextmanager
async def _serve_api(
    settings: Settings, token: str, alarms: AlarmSink
) -> AsyncIterator[tuple[str, _ApiClient]]:
    """The API under uvicorn on a free loopback port, on this event loop, with a runtime of
    its own (as its own process would have); yields its URL and a client that sends
    ``token``.

    The API's actors announce their alarms to ``alarms``, the demo's local invoker: what a
    request writes (a Change created, a promotion) is published by the demo's loop, as the
    API's function invokes the outbox publisher in the cloud. With a sink of its own, nothing
    here would fire them: the demo runs no every-minute scan of due alarms.
    """
    import httpx
    import uvicorn

    from rhumbatron.api import authenticator_from_settings, create_api

    api_runtime = bootstrap(settings, alarms=alarms)
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


# -- reactions: signed webhooks, a loop the guard stops, a replay dry run -------------------

#: The demo's webhook subscriptions (name, kinds), every match delivered (cooldown 0): a CI
#: system told of finished work, and told of every intent declared — one of which its bot
#: answers with an intent of its own, the loop the guard stops.
_SUBSCRIPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("notify", ("task.completed", "change.completed")),
    ("ci-intents", ("intent.declared",)),
)
#: The CI system's bot, and the path of the intent it declares in answer to a delivery.
_CI_AGENT = "ci-bot"
_CI_PATH = "ci/pipeline.yml"
#: A replay's range starts this long before the demo, so no event is cut off by rounding.
_REPLAY_MARGIN = timedelta(minutes=1)


@dataclass
class _Reactions:
    """The reactions part: a :class:`LocalWebhookReceiver` on loopback and the webhook
    subscriptions that point at it, registered before the lifecycle (the reactions cursor
    consumes every fact as it comes, so a subscription sees only what comes after it);
    then a fact the receiving side writes back in a delivery's correlation (a self-caused
    loop), and a replay dry run from the S3 archive."""

    app: Rhumbatron
    tenant: str
    project_id: str
    secret: str
    endpoint: LocalWebhookReceiver
    names: dict[str, str] = field(default_factory=dict)  # subscription ID -> name
    echo: dict[str, Any] | None = None
    replay: dict[str, Any] | None = None

    @classmethod
    def start(cls, app: Rhumbatron, sample: _Sample) -> _Reactions:
        """A receiver holding a new secret, listening on 127.0.0.1 (allowed by
        ``webhook_allowed_hosts``: loopback is refused otherwise, at registration and send)."""
        secret = generate_secret()
        receiver = WebhookReceiver(
            [secret], clock=app.clock, tolerance_s=app.settings.webhook_tolerance_s
        )
        endpoint = LocalWebhookReceiver(receiver).start()
        return cls(app, sample.tenant, sample.project_id, secret, endpoint)

    def subscribe(self, say: Callable[[str], None]) -> None:
        """Register the webhook subscriptions through the registry (the API's path)."""
        app = self.app
        registry = SubscriptionRegistry(app.product(), app.settings, app.clock)
        for name, kinds in _SUBSCRIPTIONS:
            created = registry.create(
                self.tenant,
                name,
                Selector.create(kinds),
                WebhookReaction(url=self.endpoint.url, secrets=(self.secret,)),
                Governance(cooldown_s=0),
            )
            self.names[created.record.subscription_id] = name
        subscribed = ", ".join(f"{name} ({', '.join(kinds)})" for name, kinds in _SUBSCRIPTIONS)
        say(
            f"reactions: webhook receiver on {self.endpoint.url} (signatures checked, "
            f"{self.endpoint.receiver.tolerance_s} s tolerance, replayed IDs refused); "
            f"subscriptions {subscribed}, cooldown 0 s"
        )

    def _subscription_id(self, name: str) -> str:
        return next(sub_id for sub_id, known in self.names.items() if known == name)

    async def deliveries_and_loop(self, demo: _Demo) -> None:
        """Report what the receiver verified; then its CI bot answers an intent.declared
        delivery with an intent of its own, in the delivery's correlation, and the reactions
        consumer holds that fact back from the subscription that caused it."""
        say = demo.say
        say("\n== 5. reactions: signed webhooks, and a loop the guard stopped")
        accepted, rejected = self.endpoint.accepted, self.endpoint.rejected
        verified = sum(d.signature_verified for d in accepted)
        say(
            f"receiver: {len(accepted)} deliveries answered 204, {verified} with a verified "
            f"signature; {len(rejected)} rejected (401)"
        )
        for sub_id, name in self.names.items():
            kinds = Counter(d.webhook.kind for d in accepted if d.webhook.subscription_id == sub_id)
            delivered = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "nothing"
            say(f"  {name:<11} {delivered}")
        if accepted:
            say(f"  webhook-id {accepted[-1].webhook.webhook_id}: {accepted[-1].body.decode()}")
        ci = self._subscription_id("ci-intents")
        answered = next((d.webhook for d in accepted if d.webhook.subscription_id == ci), None)
        if answered is None:
            raise _StepError("no intent.declared reached ci-intents: the CI bot has no delivery")
        caller = Caller(self.tenant, f"agent:{_CI_AGENT}", correlation_id=answered.webhook_id)
        shard = self.app.resource_shard(self.project_id, _CI_PATH)
        intent = DeclareIntent(
            intent_id=f"int-{_CI_AGENT}-1",
            agent_id=_CI_AGENT,
            paths=(_CI_PATH,),
            summary=f"run the pipeline for {answered.event_id}",
        )
        written = await asyncio.to_thread(shard.apply, caller, intent)
        fact = written.transition.facts[0]
        self.echo = {
            "eventId": fact.event_id,
            "kind": fact.event_type,
            "actor": fact.actor,
            "correlationId": fact.correlation_id,
            "answers": answered.webhook_id,
        }
        say(
            f"{_CI_AGENT} answers {answered.webhook_id} with {fact.event_type} {fact.event_id} "
            "(correlationId = that webhook-id): it matches ci-intents again"
        )
        await demo.settle()
        found = self.suppressions(only=fact.event_id)
        if not found:
            raise _StepError(f"the loop guard recorded nothing for {fact.event_id}")
        for held in found:
            say(
                f"loop guard: {held['eventType']} {held['eventId']} not delivered to "
                f"{held['subscription']}: {held['reason']} ({held['detail']})"
            )
            hops = " -> ".join(
                f"{hop['eventType']} {hop['eventId']} fired {hop['subscription']}"
                for hop in held["causeChain"]
            )
            say(f"  cause chain: {hops} -> {held['eventId']}")

    def suppressions(self, only: str | None = None) -> list[dict[str, Any]]:
        """The tenant's recorded suppressions (of event ``only``), each hop of its chain
        named by its subscription and the kind of its event."""
        kinds = {d.webhook.event_id: d.webhook.kind for d in self.endpoint.accepted}
        recorded = suppressions(self.app.product().connection, tenant_id=self.tenant)
        return [
            {
                "eventId": s.event_id,
                "eventType": s.event_type,
                "subscription": self.names.get(s.subscription_id, s.subscription_id),
                "reason": s.reason.value,
                "detail": s.detail,
                "depth": s.depth,
                "causeChain": [
                    {
                        "eventId": hop.event_id,
                        "eventType": kinds.get(hop.event_id),
                        "subscriptionId": hop.subscription_id,
                        "subscription": self.names.get(hop.subscription_id, hop.subscription_id),
                    }
                    for hop in s.cause_chain.hops
                ],
            }
            for s in recorded
            if only in (None, s.event_id)
        ]

    async def replay_dry_run(self, say: Callable[[str], None], start: datetime) -> None:
        """Replay the reactions subscription from the S3 archive as a dry run: how many of
        the archived events would take effect, and how many already did."""
        say("\n== 7. replay the reactions subscription from the S3 archive (dry run)")
        stream = stream_index(self.project_id)
        end = self.app.clock.now() + _REPLAY_MARGIN
        report = await replay_archive(
            self.app,
            stream_index=stream,
            subscription=Subscription.REACTIONS,
            start=start,
            end=end,
            dry_run=True,
        )
        self.replay = {
            "source": report.source.value,
            "subscription": report.subscription.value,
            "stream": stream,
            "dryRun": report.dry_run,
            "start": start.isoformat(),
            "end": end.isoformat(),
            "scanned": report.scanned,
            "wouldApply": report.would_apply,
            "alreadyApplied": report.already_applied,
            "inFlight": report.in_flight,
            "failed": report.failed,
        }
        say(
            f"rhumbatron replay --source archive --subscription reactions --stream {stream} "
            f"--start {start.isoformat(timespec='seconds')} "
            f"--end {end.isoformat(timespec='seconds')} --dry-run"
        )
        say(
            f"  {report.scanned} archived events: would apply {report.would_apply}, already "
            f"applied {report.already_applied}, in flight {report.in_flight}; nothing changed"
        )

    def summary(self) -> dict[str, Any]:
        """What the receiver saw, the loop's suppression and the replay's report."""
        return {
            "receiver": self.endpoint.url,
            "subscriptions": [
                {"id": sub_id, "name": name, "kinds": list(dict(_SUBSCRIPTIONS)[name])}
                for sub_id, name in self.names.items()
            ],
            "deliveries": [
                {
                    "webhookId": d.webhook.webhook_id,
                    "eventId": d.webhook.event_id,
                    "kind": d.webhook.kind,
                    "subject": {"type": d.webhook.subject.type, "id": d.webhook.subject.id},
                    "subscription": self.names.get(d.webhook.subscription_id),
                    "signatureVerified": d.signature_verified,
                }
                for d in self.endpoint.accepted
            ],
            "rejected": [
                {
                    "status": r.status,
                    "reason": r.reason.value if r.reason else None,
                    "message": r.message,
                    "webhookId": r.webhook_id,
                }
                for r in self.endpoint.rejected
            ],
            "echo": self.echo,
            "suppressions": self.suppressions(),
            "replay": self.replay,
        }


@dataclass
class _Demo:
    """The lifecycle of the sample, step by step, printed to ``out``; what each step saw is
    kept for the summary."""

    app: Rhumbatron
    sample: _Sample
    out: TextIO
    problems: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    retries_sent: list[bool] = field(default_factory=list)
    #: The operator's Retries the audit holds, read over MCP at the end.
    audited_retries: int | None = None
    resend_outcome: str | None = None
    change: CreatedChange | None = None
    repeat: CreatedChange | None = None
    loop: LocalLoop = field(init=False)

    def __post_init__(self) -> None:
        self.loop = LocalLoop(self.app)

    def say(self, text: str) -> None:
        print(text, file=self.out)

    @property
    def lifecycle(self) -> Lifecycle:
        return self.app.lifecycle()

    async def until(self, done: Callable[[], bool], what: str) -> None:
        """Run the roles in rounds until ``done()``; raise :class:`_StepError` if the system
        went quiet first (the loop bounds the rounds and the quiet waits)."""
        rounds_before = len(self.loop.rounds)
        if not await self.loop.run_until(done):
            raise _StepError(f"the system went quiet before {what}")
        self.say(f"  ... {len(self.loop.rounds) - rounds_before} round(s) of the local loop")

    async def settle(self) -> None:
        """Run rounds until the system is quiet: what the last step wrote is published,
        routed and handled before the demo reads the streams.

        A round that moves nothing is not proof: a message nak'd or published a moment ago
        can miss the no-wait pull right behind it. So quiet means no outbox row waiting, no
        router consumer and no queue behind, asked of SQLite and JetStream themselves.
        """
        clock = asyncio.get_running_loop()
        give_up_at = clock.time() + _SETTLE_BOUND_S
        while True:
            moved = (await self.loop.one_round()).moved
            if not moved and await self._quiet():
                return
            if clock.time() > give_up_at:
                raise _StepError(f"the system was not quiet within {_SETTLE_BOUND_S:g} s")

    async def _quiet(self) -> bool:
        backlog = self.app.outbox_backlog()
        if backlog.get("pending", 0) or backlog.get("retry_wait", 0):
            return False
        lags = await self.app.router().consumer_lags()
        if any(lag.num_pending or lag.num_ack_pending for lag in lags):
            return False
        js = (await self.app.nats()).jetstream()
        for queue in QUEUE_CONSUMERS:
            info = await js.consumer_info(COMMAND_STREAM, consumer_name(queue))
            if info.num_pending or info.num_ack_pending:
                return False
        return True

    def letter(self, command_id: str) -> DeadLetter | None:
        page = operator.list_dead_letters(
            self.app, tenant_id=ANY_TENANT, status=None, limit=MAX_PAGE
        )
        return next((x for x in page.letters if x.command_id == command_id), None)

    async def run(self, api: _ApiClient) -> None:
        """Every step in order; a step that does not happen raises :class:`_StepError`."""
        lifecycle = self.lifecycle
        # Both are read at first use of the scripted agent and the app provisioner.
        lifecycle.scripts = ScriptLibrary.from_file(self.sample.path)
        lifecycle.failing_apps = {self.sample.app_name: self.sample.fail_until_attempt}
        letter_id = await self._timed("provision", self.provision(api))
        await self._timed("deadLetterRoundTrip", self.round_trip(letter_id, api))
        await self.resend()
        await self._timed("toAwaitingApproval", self.request_change(api))
        await self._timed("toCompleted", self.approve(api))
        await self.settle()

    async def attempt(self, step: Awaitable[None]) -> None:
        """Run ``step``; a step that did not happen is a problem, and the demo goes on to
        report what did."""
        try:
            await step
        except (_StepError, RhumbatronError) as exc:
            self.problems.append(f"{type(exc).__name__}: {exc}")
            self.say(f"STOPPED: {exc}")

    async def _timed(self, name: str, step: Awaitable[_T]) -> _T:
        started = time.monotonic()
        try:
            return await step
        finally:
            self.timings_s[name] = round(time.monotonic() - started, 3)

    # -- 1. provision ----------------------------------------------------------------------
    async def provision(self, api: _ApiClient) -> str:
        """Provision the project, then (once it exists: the API refuses an app of an unknown
        project) its app, through the API; run until the app's letter is recorded. Returns
        the letter's ID."""
        s, app = self.sample, self.app
        self.say(
            f"\n== 1. provision project {s.project_id} (tenant {s.tenant}) and app {s.app_name}"
        )
        queued = await api.call(
            "POST",
            "/projects",
            body={"projectId": s.project_id, "name": s.project_name},
            expect=(202,),
        )
        self._say_queued(queued, "project.provision", project_command_id(s.project_id))
        world = self.lifecycle.world
        await self.until(
            lambda: world.project_exists(s.project_id), f"project {s.project_id} was created"
        )
        self.say(f"project {s.project_id} created; tenant {app.project_tenant(s.project_id)}")
        command_id = app_command_id(s.project_id, s.app_name)
        queued = await api.call(
            "POST",
            f"/projects/{s.project_id}/apps",
            body={"appName": s.app_name, "clientRequestId": _APP_REQUEST_ID},
            expect=(202,),
        )
        self._say_queued(queued, "app.provision", command_id)
        row = queue_row("integration", app.settings)
        self.say(
            f"  the sample's app fails until attempt {s.fail_until_attempt} (failUntilAttempt); "
            f"integration: {row.max_deliveries} deliveries (1 + {row.retries} retries), "
            f"{row.retry_delay_s:g} s apart in this demo (queue_retry_delay_s); deployed "
            f"{QUEUE_CONSUMERS['integration'].retry_delay_s:g} s apart (QUEUE_CONSUMERS)"
        )
        await self.until(
            lambda: self.letter(command_id) is not None, f"{command_id} was dead-lettered"
        )
        letter = self.letter(command_id)
        assert letter is not None
        self.say(f"dead-letter consumer: letter {letter.dead_letter_id} recorded")
        self.say(f"  reason: {letter.reason}")
        return letter.dead_letter_id

    def _say_queued(self, queued: _Answer, command_type: str, command_id: str) -> None:
        """Print what the API queued; the rest of the demo follows the command by the ID it
        expects, so another ID (or a first send that was a duplicate) stops it."""
        body = queued.body
        self.say(
            f"{queued.line}: {command_type} {body['commandId']} on {body['queue']}, "
            f"duplicate={str(body['duplicate']).lower()}"
        )
        if body["commandId"] != command_id or body["duplicate"]:
            raise _StepError(
                f"the API queued {command_type} as {body['commandId']} (duplicate="
                f"{body['duplicate']}); the demo expects a first send of {command_id}"
            )

    # -- 2. the dead-letter round trip -----------------------------------------------------
    async def round_trip(self, letter_id: str, api: _ApiClient) -> None:
        """List, inspect and Retry the letter through the HTTP API (twice: exactly one
        send); run until the retried command succeeded and the letter closed."""
        self.say("\n== 2. dead-letter round trip through the operator API")
        page = await api.call("GET", "/dead-letters", params={"queue": "integration"})
        self.say(f"{page.line}: {len(page.body['items'])} open letter(s)")
        inspected = await api.call("GET", f"/dead-letters/{letter_id}")
        self.say(inspected.line)
        letter = inspected.body
        for label, value in (
            ("id", letter["id"]),
            ("command", f"{letter['commandType']} {letter['commandId']}"),
            ("project", f"{letter['projectId']} (tenant {letter['tenantId']})"),
            ("payload", json.dumps((letter["command"] or {}).get("payload"))),
            ("attempt", letter["attempt"]),
            ("status", letter["status"]),
        ):
            self.say(f"    {label:<9}{value}")
        await self._triage_over_mcp(api, letter_id)
        first = await api.call("POST", f"/dead-letters/{letter_id}/retry")
        retry = first.body
        self.say(
            f"{first.line}: sent={str(retry['sent']).lower()}, attempt {retry['attempt']} on "
            f"{retry['queue']} as message {retry['messageId']}"
        )
        second = await api.call("POST", f"/dead-letters/{letter_id}/retry")
        again = second.body
        self.say(
            f"{second.line} (a double click): sent={str(again['sent']).lower()}, already "
            f"retried as attempt {again['alreadyRetriedAs']}"
        )
        self.retries_sent = [bool(retry["sent"]), bool(again["sent"])]
        if self.retries_sent != [True, False]:
            raise _StepError(
                f"Retry must send exactly once; the two Retries sent {self.retries_sent}"
            )
        s, world = self.sample, self.lifecycle.world
        command_id = app_command_id(s.project_id, s.app_name)

        def closed_and_live() -> bool:
            closed = self.letter(command_id)
            return (
                closed is not None
                and closed.status.value == "closed"
                and world.admin_shard(s.project_id).live_apps() == [s.app_name]
            )

        await self.until(closed_and_live, f"the retried {command_id} succeeded")
        self.say(f"  attempt {retry['attempt']} on integration: done; app {s.app_name} is live")
        closed = await api.call("GET", f"/dead-letters/{letter_id}")
        self.say(f"{closed.line}: {closed.body['status']}, resolution {closed.body['resolution']}")

    async def _triage_over_mcp(self, api: _ApiClient, letter_id: str) -> None:
        """An ops agent's view of the same letter, through the MCP tools (the MCP SDK's own
        client, in process): the failure groups, then the group holding this letter."""
        from rhumbatron_dev.mcp_agent import McpAgent

        async with McpAgent.connect(api.http, self.say) as agent:
            self.say(f"an ops agent triages it over MCP ({agent.tools} tools, one per operation):")
            try:
                groups = (await agent.call("list_dead_letter_groups", {}))["groups"]
                await agent.call("inspect_dead_letter", {"id": letter_id})
            except RuntimeError as exc:
                raise _StepError(str(exc)) from exc
            mine = next((g for g in groups if letter_id in g["letterIds"]), None)
            if mine is None:
                raise _StepError(f"no dead-letter group holds {letter_id}: {groups}")
            self.say(
                f"    group {mine['id']}: {mine['count']} letter(s), {mine['commandType']} on "
                f"{mine['queue']}, retryable={str(mine['retryable']).lower()}: {mine['reason']}"
            )

    async def audit_over_mcp(self, api: _ApiClient) -> None:
        """The audit of the run's mutations, read by the ops agent over MCP."""
        from rhumbatron_dev.mcp_agent import McpAgent

        async with McpAgent.connect(api.http, self.say) as agent:
            try:
                items = (await agent.call("read_audit", {"limit": 200}))["items"]
            except RuntimeError as exc:
                raise _StepError(str(exc)) from exc
        retries = [e for e in items if e["operation"] == "retry_dead_letter"]
        self.say(
            f"    {len(items)} audited mutation(s); the Retries: "
            + ", ".join(f"{e['status']} {e['outcome']}" for e in reversed(retries))
        )
        self.audited_retries = len(retries)

    async def resend(self) -> None:
        """A producer repeating a command inside the duplicate window: JetStream drops it.
        The command is the one ``POST /projects`` queued (its ID and payload)."""
        s = self.sample
        again = lifecycle_command(
            "project.provision",
            project_command_id(s.project_id),
            project_id=s.project_id,
            now=self.app.clock.now(),
            payload={"name": s.project_name, "tenantId": s.tenant},
        )
        sent = await self.lifecycle.sender.send(again)
        self.resend_outcome = sent.outcome
        self.say(f"resent {again.command_id} with the same ID: {sent.outcome}")

    # -- 3. the Change ---------------------------------------------------------------------
    def _change_path(self, change_id: str = "") -> str:
        changes = f"/projects/{self.sample.project_id}/changes"
        return f"{changes}/{change_id}" if change_id else changes

    async def request_change(self, api: _ApiClient) -> None:
        """Request the Change (twice: the same client request, 201 then 200 with the first
        Change); run until it awaits approval."""
        s = self.sample
        self.say(f"\n== 3. a Change of {len(s.tasks)} Tasks: {s.title!r}")
        for task in s.tasks:
            after = f" after {', '.join(task.depends_on)}" if task.depends_on else ""
            self.say(f"  {task.task_id:<14} {task.agent_id:<10} {task.title}{after}")
        request = {
            "clientRequestId": s.client_request_id,
            "title": s.title,
            "tasks": [
                {
                    "taskId": t.task_id,
                    "title": t.title,
                    "agentId": t.agent_id,
                    "dependsOn": list(t.depends_on),
                    "script": t.script,
                }
                for t in s.tasks
            ],
        }
        first = await api.call("POST", self._change_path(), body=request, expect=(201,))
        change_id = first.body["changeId"]
        self.change = CreatedChange(change_id, created=True)
        self.say(
            f"{first.line}: created {change_id} (client request {s.client_request_id}), "
            f"{first.body['status']}, {len(first.body['tasks'])} tasks"
        )
        # 200, not 201: the API found the client request and answers the first Change.
        repeat = await api.call("POST", self._change_path(), body=request, expect=(200,))
        self.repeat = CreatedChange(repeat.body["changeId"], created=False)
        self.say(
            f"{repeat.line} (the same request again): {self.repeat.change_id}, "
            f"created={str(self.repeat.created).lower()}"
        )
        await self.until(
            lambda: self._status() == "awaiting_approval", f"{change_id} awaited approval"
        )
        shard = self.lifecycle.world.change_shard(s.project_id, change_id)
        for state in shard.tasks_of_change(change_id):
            task_id = state.task_id.removeprefix(f"{change_id}.")
            self.say(f"  task {task_id:<14} {state.status.value:<10} by {state.agent_id}")
        for candidate in shard.candidates(change_id=change_id):
            self.say(
                f"  candidate {candidate.candidate_id} on base generation "
                f"{candidate.base_generation}: {candidate.status.value}, "
                f"{len(candidate.paths)} paths"
            )
        self.say(f"{change_id}: awaiting_approval")

    def _status(self) -> str:
        assert self.change is not None
        change = self.lifecycle.requests.change(self.sample.project_id, self.change.change_id)
        return change.status if change else "missing"

    # -- 4. approval and release -----------------------------------------------------------
    async def approve(self, api: _ApiClient) -> None:
        """Approve through the API; run until the Change completed and the index is ready at
        generation 1."""
        assert self.change is not None
        s, change_id = self.sample, self.change.change_id
        self.say("\n== 4. approve, promote, index, release")
        approved = await api.call("POST", f"{self._change_path(change_id)}/approve")
        candidate = approved.body
        self.say(
            f"{approved.line}: candidate {candidate['candidateId']} (base generation "
            f"{candidate['baseGeneration']}) promoted"
        )
        indexer = self.lifecycle.indexer
        await self.until(
            lambda: self._status() == "completed" and indexer.ready_generation(s.project_id) == 1,
            f"{change_id} completed and the index was ready at generation 1",
        )
        generation = self.lifecycle.world.canonical_generation(s.project_id)
        self.say(f"canonical generation {generation}; index ready at generation 1")
        self.say(f"{change_id}: completed")

    # -- 5. the Change read back -----------------------------------------------------------
    async def read_back(self, api: _ApiClient) -> dict[str, Any] | None:
        """The Change as ``GET /projects/{id}/changes/{changeId}`` answers it (its status
        and its Tasks', Candidates' and releases'), or None when there is none to read or
        the API did not answer it (a problem, then)."""
        if self.change is None:
            return None
        try:
            answer = await api.call("GET", self._change_path(self.change.change_id))
        except _StepError as exc:
            self.problems.append(f"reading the Change back: {exc}")
            self.say(f"could not read the Change back: {exc}")
            return None
        body = answer.body

        def by_status(items: list[dict[str, Any]]) -> str:
            counts = Counter(str(item["status"]) for item in items)
            return ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) or "none"

        self.say(
            f"{answer.line}: {body['status']}; tasks {by_status(body['tasks'])}; candidates "
            f"{by_status(body['candidates'])}; releases {by_status(body['releases'])}"
        )
        return body


# -- the summary's parts --------------------------------------------------------------------


def _ordinary_tick(stream: int, day: datetime, settings: Settings) -> datetime:
    """The first minute of ``day`` whose sweep visits ``stream`` and runs every batch."""
    for minute in range(24 * 60):
        when = day + timedelta(minutes=minute)
        if tick_kind(settings, when) == (stream, False, False):
            return when
    raise AssertionError(f"no ordinary tick visits stream {stream}")


def _fresh_bucket(s3: Any, bucket: str) -> None:
    """The evidence bucket, empty. moto keeps its S3 state per process, not per server: in a
    process that ran another local stack before (the test suite), the bucket would still hold
    that stack's archive objects, and the demo's archive must be its own."""
    s3.create_bucket(Bucket=bucket)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})


async def _sweep(app: Rhumbatron, project_id: str) -> dict[str, Any]:
    """One sweep tick per stream (the archiver, the analytics, the lag metrics), then the
    project view, the archive objects, the metrics and every consumer's lag."""
    from rhumbatron.archive import ArchiveReader
    from rhumbatron.metrics import MetricBinding, metric_counts

    router = app.router()
    today = app.clock.now().replace(hour=0, minute=0, second=0, microsecond=0)
    for index in range(EVENT_STREAM_COUNT):
        await router.sweep(now=_ordinary_tick(index, today, app.settings))
    reader = ArchiveReader(app.s3(), app.settings.evidence_bucket)
    archive = [
        {"key": listed.key, "eventIds": [e.event_id for e in reader.read_object(listed.key)]}
        for listed in reader.list_objects()
    ]
    product = app.product().connection
    return {
        "view": router.projector.view(project_id).snapshot(latest=5),
        "archive": archive,
        "metricCounts": {
            "eventMetrics": metric_counts(product, MetricBinding.EVENT_METRICS),
            "metrics": metric_counts(product, MetricBinding.METRICS),
        },
        "consumers": [
            {
                "stream": lag.stream,
                "consumer": lag.consumer,
                "numPending": lag.num_pending,
                "numAckPending": lag.num_ack_pending,
            }
            for lag in await router.consumer_lags()
        ],
    }


async def _commands(app: Rhumbatron) -> dict[str, Any]:
    """Commands per queue: JetStream's deliveries of each queue's consumer (redeliveries
    included) and what is left, and what the handlers that keep a record handled: the
    integration module per command type and outcome, the wake consumer per outcome."""
    lifecycle = app.lifecycle()
    js = (await app.nats()).jetstream()
    handled: dict[str, dict[str, dict[str, int]]] = {}
    for item in lifecycle.integration.handled:
        queue = COMMAND_TYPES[item.command_type].queue
        by_type = handled.setdefault(queue, {}).setdefault(item.command_type, {})
        by_type[item.outcome] = by_type.get(item.outcome, 0) + 1
    wakes = Counter(outcome.value for _, outcome in lifecycle.wake_consumer.outcomes)
    if wakes:
        handled["agent-wakeups"] = {"agent.wake": dict(sorted(wakes.items()))}
    queues: dict[str, dict[str, Any]] = {}
    for queue in QUEUE_CONSUMERS:
        info = await js.consumer_info(COMMAND_STREAM, consumer_name(queue))
        queues[queue] = {
            "deliveries": info.delivered.consumer_seq if info.delivered else 0,
            "numPending": info.num_pending or 0,
            "numAckPending": info.num_ack_pending or 0,
            "handled": dict(sorted(handled.get(queue, {}).items())),
        }
    state = (await js.stream_info(COMMAND_STREAM)).state
    return {"stream": {"stored": state.last_seq, "left": state.messages}, "queues": queues}


def _dead_letters(app: Rhumbatron) -> list[dict[str, Any]]:
    """Every letter, with its attempts: a letter is written once its attempt used every
    delivery of its queue; a Retry's attempt is the one the integration module handled."""
    page = operator.list_dead_letters(app, tenant_id=ANY_TENANT, status=None, limit=MAX_PAGE)
    handled = app.lifecycle().integration.handled
    letters = []
    for letter in page.letters:
        attempts = [
            {
                "attempt": letter.attempt,
                "deliveries": queue_row(letter.queue, app.settings).max_deliveries
                if letter.queue
                else None,
                "outcome": "dead-lettered",
            }
        ]
        done = [h for h in handled if h.command_id == letter.command_id and h.outcome == "done"]
        if letter.retried_attempt is not None:
            attempts.append(
                {
                    "attempt": letter.retried_attempt,
                    "deliveries": done[-1].delivered if done else None,
                    "outcome": letter.resolution or "open",
                }
            )
        letters.append(
            {
                "id": letter.dead_letter_id,
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
        )
    return letters


def _timeline(streams: dict[str, dict[str, Any]], change_id: str) -> list[dict[str, Any]]:
    """The Change's facts from every stream, in time order (ties in stream order), each with
    the milliseconds since the Change was created."""
    facts = [e for s in streams.values() for e in s["events"] if e["changeId"] == change_id]
    facts.sort(key=lambda e: datetime.fromisoformat(e["timestamp"]))
    created = next((e for e in facts if e["eventType"] == "change.created"), None)
    if created is None:
        return []
    start = datetime.fromisoformat(created["timestamp"])
    return [
        {
            "eventType": e["eventType"],
            "taskId": e["taskId"],
            "atMs": round((datetime.fromisoformat(e["timestamp"]) - start).total_seconds() * 1000),
            **({"toStatus": e["toStatus"]} if "toStatus" in e else {}),
        }
        for e in facts
    ]


def _states(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The states the Change's facts moved it through, in order."""
    states: list[dict[str, Any]] = []
    for fact in timeline:
        if fact["eventType"] == "change.created":
            state = "open"
        elif "toStatus" in fact:
            state = fact["toStatus"]
        elif fact["eventType"] in _ENDED:
            state = fact["eventType"].removeprefix("change.")
        else:
            continue
        if not states or states[-1]["state"] != state:
            states.append({"state": state, "atMs": fact["atMs"]})
    return states


def _change_report(
    demo: _Demo, streams: dict[str, dict[str, Any]], body: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The Change: its states and timeline from the streams; its status, Tasks, Candidates
    and releases as the API read it back (``body``: none when it could not); the
    Clef-flash decisions, the index search and the files each release deployed.

    Task IDs stay as the API and the events have them, qualified by the Change
    (``<changeId>.<taskId>``); the printed lines name them as the sample does."""
    if demo.change is None:
        return None
    lifecycle, s = demo.lifecycle, demo.sample
    change_id = demo.change.change_id
    read: dict[str, Any] = body or {}
    timeline = _timeline(streams, change_id)
    events = {e["eventId"]: e for st in streams.values() for e in st["events"]}
    decisions = []
    for routed in lifecycle.routed:
        for agent_id, verdict in routed.clef_flash:
            stored = lifecycle.causal_store.decision(routed.event_id, agent_id)
            decisions.append(
                {
                    "eventId": routed.event_id,
                    "eventType": events.get(routed.event_id, {}).get("eventType"),
                    "by": events.get(routed.event_id, {}).get("actor"),
                    "rule": routed.rule,
                    "agent": agent_id,
                    "verdict": verdict,
                    "source": stored.source if stored else None,
                    "reason": stored.reason if stored else None,
                    "woke": list(routed.sent),
                }
            )
    releases = []
    for release in read.get("releases", []):
        deployed = lifecycle.apps.root / s.project_id / release["appName"]
        generation_file = deployed / f"generation-{release['generation']}.json"
        files = (
            sorted(json.loads(generation_file.read_text(encoding="utf-8")))
            if generation_file.exists()
            else []
        )
        live = deployed / "live.txt"
        releases.append(
            {
                "id": release["releaseId"],
                "status": release["status"],
                "generation": release["generation"],
                "app": release["appName"],
                "deployedFiles": files,
                "liveGeneration": live.read_text().strip() if live.exists() else None,
            }
        )
    hits = lifecycle.indexer.project_index(s.project_id).search(SEARCH_WORD)
    return {
        "id": change_id,
        "title": read.get("title"),
        "status": read.get("status"),
        "clientRequestId": s.client_request_id,
        "repeat": (
            {"changeId": demo.repeat.change_id, "created": demo.repeat.created}
            if demo.repeat
            else None
        ),
        "states": _states(timeline),
        "timeline": timeline,
        "tasks": [
            {
                "taskId": t["taskId"],
                "agent": t["agentId"],
                "dependsOn": t["dependsOn"],
                "status": t["status"],
            }
            for t in read.get("tasks", [])
        ],
        "candidates": [
            {
                "id": c["candidateId"],
                "baseGeneration": c["baseGeneration"],
                "status": c["status"],
                "paths": c["paths"],
            }
            for c in read.get("candidates", [])
        ],
        "clefFlash": decisions,
        "canonicalGeneration": lifecycle.world.canonical_generation(s.project_id),
        "index": {
            "readyGeneration": lifecycle.indexer.ready_generation(s.project_id),
            "search": SEARCH_WORD,
            "hits": [{"path": h.path, "snippet": h.snippet} for h in hits],
        },
        "releases": releases,
    }


def _duplicates(demo: _Demo) -> dict[str, int]:
    """The repeats the system dropped in this run, each where it was measured: the repeated
    Change request, the resent command (JetStream's duplicate window), the router's command
    sends JetStream reported as duplicates, ready wakes for a Task its Agent already held,
    and the operator's second Retry."""
    lifecycle = demo.lifecycle
    counts = {
        "changeRequests": int(
            demo.repeat is not None
            and demo.change is not None
            and not demo.repeat.created
            and demo.repeat.change_id == demo.change.change_id
        ),
        "commandResends": int(demo.resend_outcome == "duplicate"),
        "routerCommandSends": sum(len(r.duplicates) for r in lifecycle.routed),
        "agentWakes": sum(1 for _, o in lifecycle.wake_consumer.outcomes if o.value == "duplicate"),
        "operatorRetries": demo.retries_sent.count(False),
    }
    return {**counts, "total": sum(counts.values())}


def _outbox(app: Rhumbatron) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Outbox rows by state (total and per actor) and each actor's published events in
    outbox order."""
    by_actor: dict[str, dict[str, int]] = {}
    order: dict[str, list[str]] = {}
    for ref in app.actor_refs():
        actor = app.actor(ref)
        by_actor[ref.key] = counts_by_state(actor.connection)
        order[ref.key] = [
            row["event_id"]
            for row in actor.connection.execute(
                "SELECT event_id FROM outbox WHERE state = 'published' ORDER BY seq"
            )
        ]
    total = {
        state.value: sum(c.get(state.value, 0) for c in by_actor.values()) for state in RowState
    }
    return {"total": total, "byActor": by_actor}, order


# -- the checks -----------------------------------------------------------------------------


def _order_problems(
    streams: dict[str, dict[str, Any]], publish_order: dict[str, list[str]]
) -> list[str]:
    """Each actor's published events must be on the streams, in outbox order."""
    position = {e["eventId"]: e["seq"] for s in streams.values() for e in s["events"]}
    problems = []
    for actor_key, event_ids in publish_order.items():
        missing = [e for e in event_ids if e not in position]
        if missing:
            problems.append(f"{actor_key}: {len(missing)} published events missing from streams")
        seqs = [position[e] for e in event_ids if e in position]
        if seqs != sorted(seqs):
            problems.append(f"{actor_key}: events out of outbox order on their stream")
    return problems


def check_summary(summary: dict[str, Any]) -> list[str]:
    """Every outcome the acceptance expects that ``summary`` lacks, each named with what was
    found instead (empty when the whole lifecycle happened)."""
    problems: list[str] = []
    streams = summary["streams"]
    position = {e["eventId"]: e["seq"] for s in streams.values() for e in s["events"]}
    total = summary["outbox"]["total"]
    written = sum(total.values())
    if total["published"] != written:
        problems.append(f"{written} outbox rows written but {total['published']} published")
    if len(position) != written:
        problems.append(f"{written} events written but {len(position)} on the streams")
    archived = {i for item in summary["archive"] for i in item["eventIds"]}
    if set(position) - archived:
        problems.append(f"{len(set(position) - archived)} events on the streams are not archived")
    problems += [
        f"consumer {c['consumer']} on {c['stream']} is behind: {c['numPending']} pending, "
        f"{c['numAckPending']} unacknowledged"
        for c in summary["consumers"]
        if c["numPending"] or c["numAckPending"]
    ]
    for queue, counts in summary["commands"]["queues"].items():
        if counts["numPending"] or counts["numAckPending"]:
            problems.append(
                f"queue {queue} is left with {counts['numPending']} pending and "
                f"{counts['numAckPending']} unacknowledged commands"
            )
    letters = summary["deadLetters"]
    if not (
        len(letters) == 1
        and letters[0]["status"] == "closed"
        and letters[0]["resolution"] == "succeeded"
        and letters[0]["retriedAttempt"] == 2
    ):
        outcome = [(x["commandId"], x["status"], x["resolution"]) for x in letters]
        problems.append(f"expected one letter closed as succeeded by attempt 2; found {outcome}")
    if summary.get("auditedRetries") != 2:
        problems.append(
            f"the audit read over MCP holds {summary.get('auditedRetries')} Retries, not the 2 "
            "the operator clicked"
        )
    problems += _check_change(summary["change"])
    problems += _check_reactions(summary["reactions"])
    if summary["duplicatesDropped"]["commandResends"] != 1:
        problems.append("the resent provision command was not dropped as a duplicate")
    if summary["timingsS"]["total"] >= _DEMO_BUDGET_S:
        problems.append(
            f"the demo took {summary['timingsS']['total']:.1f} s, over its "
            f"{_DEMO_BUDGET_S:g} s budget"
        )
    return problems


def _check_reactions(reactions: dict[str, Any]) -> list[str]:
    problems = []
    deliveries = reactions["deliveries"]
    if not deliveries:
        problems.append("the webhook receiver verified no delivery")
    elif not all(d["signatureVerified"] for d in deliveries):
        problems.append("a webhook delivery was accepted without a verified signature")
    if reactions["rejected"]:
        reasons = [r["reason"] for r in reactions["rejected"]]
        problems.append(f"the webhook receiver rejected {len(reasons)} deliveries: {reasons}")
    if not any(
        s["reason"] in ("self_cause", "depth") and s["causeChain"]
        for s in reactions["suppressions"]
    ):
        problems.append("the loop guard recorded no self_cause or depth suppression with its chain")
    replay = reactions["replay"]
    if replay is None:
        problems.append("the replay dry run from the archive did not run")
    elif not (
        replay["scanned"] > 0
        and replay["wouldApply"] == 0
        and replay["alreadyApplied"] == replay["scanned"]
    ):
        problems.append(
            f"a replay of the archive into reactions scanned {replay['scanned']} events: "
            f"{replay['wouldApply']} would apply, {replay['alreadyApplied']} already applied; "
            "every archived event must have been applied once already"
        )
    return problems


def _check_change(change: dict[str, Any] | None) -> list[str]:
    if change is None:
        return ["no Change was created"]
    problems = []
    states = [s["state"] for s in change["states"]]
    if states != list(EXPECTED_STATES):
        problems.append(f"the Change moved through {states}, not {list(EXPECTED_STATES)}")
    if change["repeat"] != {"changeId": change["id"], "created": False}:
        problems.append(f"the repeated request gave {change['repeat']}, not the first Change")
    tasks = change["tasks"]
    if len(tasks) < 4 or not any(t["dependsOn"] for t in tasks):
        problems.append(f"expected at least 4 Tasks with dependencies; found {len(tasks)}")
    if any(t["status"] != "completed" for t in tasks):
        problems.append(
            f"Tasks not completed: {[t['taskId'] for t in tasks if t['status'] != 'completed']}"
        )
    decisions = change["clefFlash"]
    if not decisions:
        problems.append("Clef-flash was never asked: no two agents overlapped on a prefix")
    elif any(d["verdict"] != "abstain" or not d["woke"] for d in decisions):
        problems.append(f"without a key Clef-flash must abstain and wake; it decided {decisions}")
    if [c["status"] for c in change["candidates"]] != ["promoted"]:
        problems.append(f"expected one promoted Candidate; found {change['candidates']}")
    if change["canonicalGeneration"] != 1:
        problems.append(f"canonical is at generation {change['canonicalGeneration']}, not 1")
    index = change["index"]
    if index["readyGeneration"] != 1 or not index["hits"]:
        problems.append(f"the index is not ready at generation 1 with a hit for {SEARCH_WORD}")
    releases = change["releases"]
    if not (
        len(releases) == 1
        and releases[0]["status"] == "completed"
        and releases[0]["deployedFiles"]
        and releases[0]["liveGeneration"] == "1"
    ):
        problems.append(f"expected one completed release live at generation 1; found {releases}")
    return problems


# -- printing -------------------------------------------------------------------------------


def _print_summary(summary: dict[str, Any], out: TextIO) -> None:
    def say(text: str) -> None:
        print(text, file=out)

    say("\n== summary")
    say("events per stream and type:")
    for name, stream in summary["streams"].items():
        if not stream["messages"]:
            say(f"  {name}: empty")
            continue
        types = ", ".join(f"{t} {n}" for t, n in stream["byType"].items())
        say(f"  {name}: {stream['messages']} events: {types}")
    say(f"outbox rows by state: {summary['outbox']['total']}")
    commands = summary["commands"]
    say(
        f"commands: the {COMMAND_STREAM} stream stored {commands['stream']['stored']}, "
        f"{commands['stream']['left']} left (work-queue retention)"
    )
    for queue, counts in commands["queues"].items():
        handled = "; ".join(
            f"{kind} " + ", ".join(f"{o} {n}" for o, n in outcomes.items())
            for kind, outcomes in counts["handled"].items()
        )
        say(
            f"  {queue:<14} deliveries {counts['deliveries']:>2}, pending {counts['numPending']}"
            + (f"; handled: {handled}" if handled else "")
        )
    dupes = summary["duplicatesDropped"]
    say(
        "duplicates dropped: "
        + ", ".join(f"{k} {v}" for k, v in dupes.items() if k != "total")
        + f" (total {dupes['total']})"
    )
    for letter in summary["deadLetters"]:
        attempts = ", ".join(
            f"attempt {a['attempt']}: {a['deliveries']} deliveries, {a['outcome']}"
            for a in letter["attempts"]
        )
        say(
            f"dead letter {letter['id']}: {letter['commandType']} {letter['commandId']} on "
            f"{letter['queue']}; {attempts}; {letter['status']} ({letter['resolution']})"
        )
    say(f"archive: {len(summary['archive'])} objects")
    for item in summary["archive"]:
        say(f"  s3://{summary['bucket']}/{item['key']}  {len(item['eventIds'])} events")
    view = summary["view"]
    say(
        f"view {view['projectId']}: {view['eventsApplied']} events, generation "
        f"{view['canonicalGeneration']}, changes {view['changesByState']}, "
        f"tasks {view['tasksByState']}"
    )
    behind = [c for c in summary["consumers"] if c["numPending"] or c["numAckPending"]]
    consumers = len(summary["consumers"])
    say(f"router consumers: {consumers}, at lag 0: {consumers - len(behind)}")
    _print_reactions(summary["reactions"], say)
    change = summary["change"]
    if change is not None:
        _print_change(change, say)
    timings = ", ".join(f"{k} {v:.2f} s" for k, v in summary["timingsS"].items())
    say(f"timings: {timings}")


def _print_reactions(reactions: dict[str, Any], say: Callable[[str], None]) -> None:
    deliveries = reactions["deliveries"]
    verified = sum(1 for d in deliveries if d["signatureVerified"])
    held = Counter(s["reason"] for s in reactions["suppressions"])
    line = (
        f"reactions: {len(deliveries)} webhooks delivered, {verified} verified, "
        f"{len(reactions['rejected'])} rejected; suppressed: "
        + (", ".join(f"{reason} {n}" for reason, n in sorted(held.items())) or "none")
    )
    replay = reactions["replay"]
    if replay is not None:
        line += (
            f"; archive replay (dry run): would apply {replay['wouldApply']}, already applied "
            f"{replay['alreadyApplied']}"
        )
    say(line)


def _print_change(change: dict[str, Any], say: Callable[[str], None]) -> None:
    say(f"change {change['id']} {change['title']!r}: {len(change['timeline'])} facts")
    for fact in change["timeline"]:
        task = f" {fact['taskId'].removeprefix(change['id'] + '.')}" if fact["taskId"] else ""
        moved = f" -> {fact['toStatus']}" if "toStatus" in fact else ""
        say(f"  +{fact['atMs']:>5} ms  {fact['eventType']}{task}{moved}")
    say("states: " + " -> ".join(f"{s['state']} (+{s['atMs']} ms)" for s in change["states"]))
    for d in change["clefFlash"]:
        say(
            f"Clef-flash: {d['eventType']} by {d['by']} overlaps {d['agent']} by prefix: "
            f"{d['verdict']} ({d['reason']}) -> woke {', '.join(d['woke']) or 'nobody'}"
        )
    index = change["index"]
    paths = ", ".join(h["path"] for h in index["hits"]) or "no hits"
    say(f"index: generation {index['readyGeneration']}; search {index['search']!r}: {paths}")
    for release in change["releases"]:
        say(
            f"release {release['id']}: {release['status']}, generation {release['generation']} "
            f"live on {release['app']}: {', '.join(release['deployedFiles'])}"
        )


# -- the entry points -----------------------------------------------------------------------


async def run_demo(root: Path, sample_path: Path, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Run the demo under ``root`` (its state and NATS store wiped first), print each step
    to ``out``, and return the summary it writes to ``root / "demo-summary.json"``."""
    started = time.monotonic()
    for leftover in ("state", "nats"):
        shutil.rmtree(root / leftover, ignore_errors=True)
    sample = _Sample.load(sample_path)
    # A token for this run only: the demo's API client is its one holder.
    api_token = secrets.token_urlsafe(24)
    from rhumbatron_dev.local.stack import LocalStack

    with LocalStack(root) as stack:
        assert stack.s3 is not None
        settings = load_settings(
            state_dir=root / "state",
            nats_url=stack.nats.url,
            s3_endpoint_url=stack.s3.endpoint_url,
            # The failing command walks its retries at once here; deployed, each waits 30 s.
            queue_retry_delay_s={"integration": 0.0},
            # Spans for `rhumbatron up`'s Change timeline, should it serve this state later.
            trace_spans=True,
            # No key: Clef-flash abstains (and so wakes) without calling a model.
            clef_flash_api_key=None,
            # The demo's webhook receiver listens on loopback, refused unless allow-listed.
            webhook_allowed_hosts=("127.0.0.1",),
            api_auth_mode="static",
            api_tokens={api_token: {"tenant": sample.tenant, "scopes": _API_SCOPES}},
        )
        app = bootstrap(settings)
        demo = _Demo(app, sample, out)
        started_at = app.clock.now()
        reactions: _Reactions | None = None
        try:
            reactions = _Reactions.start(app, sample)
            streams_report = await app.ensure_streams()
            _fresh_bucket(stack.s3.client(), settings.evidence_bucket)
            demo.say(f"local stack: nats {stack.nats.url}  s3 {stack.s3.endpoint_url}")
            demo.say(f"streams created: {', '.join(streams_report.created)}")
            async with _serve_api(settings, api_token, app.alarms) as (url, api):
                demo.say(
                    f"API: uvicorn on {url}, a static bearer token of tenant {sample.tenant} "
                    f"with {', '.join(_API_SCOPES)} (api_tokens)"
                )
                reactions.subscribe(demo.say)
                await demo.attempt(demo.run(api))
                await demo.attempt(demo._timed("reactions", reactions.deliveries_and_loop(demo)))
                demo.say("\n== 6. sweep: archive, analytics, lag; the Change read back")
                swept = await _sweep(app, sample.project_id)
                streams = await read_streams(stack.nats.url)
                change_body = await demo.read_back(api)
                demo.say("\n== the audit, read by the ops agent over MCP")
                await demo.attempt(demo.audit_over_mcp(api))
            await demo.attempt(
                demo._timed(
                    "replay", reactions.replay_dry_run(demo.say, started_at - _REPLAY_MARGIN)
                )
            )
            outbox, publish_order = _outbox(app)
            summary: dict[str, Any] = {
                "project": {
                    "id": sample.project_id,
                    "tenant": sample.tenant,
                    "stream": event_stream_name(stream_index(sample.project_id)),
                },
                "bucket": settings.evidence_bucket,
                "streams": streams,
                "outbox": outbox,
                "commands": await _commands(app),
                "duplicatesDropped": _duplicates(demo),
                "deadLetters": _dead_letters(app),
                "auditedRetries": demo.audited_retries,
                "apiCalls": api.calls,
                **swept,
                "change": _change_report(demo, streams, change_body),
                "reactions": reactions.summary(),
            }
        finally:
            if reactions is not None:
                reactions.endpoint.stop()
            await app.close()
    summary["timingsS"] = {**demo.timings_s, "total": round(time.monotonic() - started, 3)}
    summary["problems"] = (
        demo.problems + _order_problems(summary["streams"], publish_order) + check_summary(summary)
    )
    _print_summary(summary, out)
    (root / "demo-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {root / 'demo-summary.json'}", file=out)
    for problem in summary["problems"]:
        print(f"PROBLEM: {problem}", file=out)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rhumbatron demo`` and ``make demo``."""
    import argparse

    parser = argparse.ArgumentParser(prog="rhumbatron demo", description=__doc__)
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help="the demo's own folder: its state and NATS store are wiped at each run",
    )
    parser.add_argument("--sample", type=Path, default=Path("samplefiles/lifecycle.json"))
    args = parser.parse_args(argv)
    # The demo prints every step itself; the runtime's warnings about the command it fails on
    # purpose would only repeat them. Errors still show.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    summary = asyncio.run(run_demo(args.root, args.sample))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
