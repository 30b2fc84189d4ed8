"""The composition root: builds every adapter from settings, lazily, with test overrides.

Nothing heavy happens at import or at :func:`bootstrap`: the NATS connection opens on first
use and is reused (one per warm Lambda container). Actor files open on first use too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import Context
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rhumbatron.actors.actor import Actor, ActorRef
from rhumbatron.actors.alarms import AlarmSink, RecordingAlarmSink
from rhumbatron.actors.directory import ActorDirectory
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.publisher import OutboxPublisher, PublishReport, ScanReport
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.storage import check_journal_mode
from rhumbatron.core.clock import Clock, SystemClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.messaging.nudge import NoNudge, RouterNudge

if TYPE_CHECKING:
    from datetime import datetime

    from mypy_boto3_s3 import S3Client
    from nats.aio.client import Client as NATS

    from rhumbatron.archive import ArchiveWriter
    from rhumbatron.core.progress import ProgressCallback
    from rhumbatron.entrypoints.ports import SweepTick
    from rhumbatron.messaging.commands import CommandBus
    from rhumbatron.messaging.queue_consumer import QueueConsumerRuntime
    from rhumbatron.messaging.secrets import SecretCache
    from rhumbatron.messaging.sender import EventSender
    from rhumbatron.messaging.streams import StreamReport
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.operator.log_repair import RepairStep
    from rhumbatron.operator.reconciliation import ReconciliationReport
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.product.letter_closing import SucceededCommandLetters
    from rhumbatron.reactions.consumer import Reactions
    from rhumbatron.reactions.webhook_retries import WebhookRetrier
    from rhumbatron.router.event_router import EventRouter
    from rhumbatron.router.handlers import CausalRouting, RecordHandler
    from rhumbatron.runtime.alarm_scan import AlarmJobs
    from rhumbatron.runtime.lifecycle_assembly import Lifecycle
    from rhumbatron.runtime.reactions_assembly import LazyHttpClient

__all__ = ["Rhumbatron", "bootstrap"]

_log = logging.getLogger(__name__)


@dataclass
class Rhumbatron:
    """Everything a role needs, built once per process from :class:`Settings`."""

    settings: Settings
    clock: Clock
    alarms: AlarmSink
    nudge: RouterNudge
    #: The streams were ensured by this runtime (a Lambda role's first ``prepare``).
    streams_ready: bool = False
    _sender: EventSender | None = None
    _nc: NATS | None = None
    _publisher: OutboxPublisher | None = None
    _publisher_nc: NATS | None = None
    actors: ActorDirectory = field(init=False)
    _connecting: asyncio.Lock = field(default_factory=asyncio.Lock)
    _s3: S3Client | None = None
    _product: ProductDatabase | None = None
    _router: EventRouter | None = None
    _metrics_sink: MetricsSink | None = None
    _causal_routing: CausalRouting | None = None
    _bus: CommandBus | None = None
    _queues: QueueConsumerRuntime | None = None
    _lifecycle: Lifecycle | None = None
    _reaction_http: LazyHttpClient | None = None
    _succeeded_letters: SucceededCommandLetters | None = None
    _secrets: SecretCache | None = None

    # -- actors ----------------------------------------------------------------------------
    def __post_init__(self) -> None:
        self.actors = ActorDirectory(self.settings, self.clock, self.alarms)
        if self.settings.trace_spans:  # the local dashboard's Change timelines
            from rhumbatron.metrics.trace_spans import install_span_store

            install_span_store(self.settings)

    def actor(self, ref: ActorRef) -> Actor:
        """The (cached) actor for ``ref``."""
        return self.actors.actor(ref)

    def project_root(self, project_id: str) -> ProjectRoot:
        """The root actor of ``project_id``."""
        return self.actors.project_root(project_id)

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard:
        """The shard of ``project_id`` that owns ``resource_key`` (``change:<id>``, a path …)."""
        return self.actors.resource_shard(project_id, resource_key)

    @property
    def open_actor_count(self) -> int:
        """Actor files this process holds open right now."""
        return self.actors.open_actor_count

    def actor_refs(self) -> Iterator[ActorRef]:
        """Every actor file under the state directory."""
        return self.actors.actor_refs()

    def project_tenant(self, project_id: str) -> str | None:
        """The tenant owning ``project_id``; None when the project was never created."""
        return self.actors.project_tenant(project_id)

    # -- NATS --------------------------------------------------------------------------------
    async def nats(self) -> NATS:
        """The process's one NATS connection, opened on first use (and again once closed); a
        lock keeps concurrent first users (the publisher's workers) to one connection."""
        async with self._connecting:
            if self._nc is None or self._nc.is_closed:
                from rhumbatron.messaging.connection import connect_nats

                # A context of its own: the client's tasks outlive the command that connected.
                connecting = connect_nats(self.settings, secrets=self.secrets)
                self._nc = await asyncio.create_task(connecting, context=Context())
            return self._nc

    @property
    def secrets(self) -> SecretCache:
        """The process's Secrets Manager secrets, each kept ``secret_max_age_s`` on the clock."""
        if self._secrets is None:
            from rhumbatron.messaging.secrets import SecretCache

            self._secrets = SecretCache(self.clock, self.settings.secret_max_age_s)
        return self._secrets

    async def ensure_streams(self) -> StreamReport:
        """Create or reconcile the streams; refuse non-durable JetStream when it is demanded."""
        from rhumbatron.messaging.durability import (
            check_durability,
            check_replica_holders,
            check_stream_replicas,
            online_replica_holders,
        )
        from rhumbatron.messaging.streams import ensure_streams

        verified = check_durability(self.settings)
        js = (await self.nats()).jetstream()
        report = await ensure_streams(js, self.settings)
        if self.settings.require_durable_jetstream:
            names = [*report.created, *report.updated, *report.unchanged]
            infos = [await js.stream_info(name) for name in names]
            check_stream_replicas(
                self.settings, {i.config.name or "?": i.config.num_replicas or 1 for i in infos}
            )
            check_replica_holders(
                self.settings,
                verified,
                {i.config.name or "?": online_replica_holders(i) for i in infos},
            )
        return report

    async def reconcile(
        self,
        stream_indexes: Sequence[int] | None = None,
        *,
        now: datetime | None = None,
        within_s: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        progress: ProgressCallback | None = None,
    ) -> ReconciliationReport:
        """Prove the log holds every event the outbox published within the reconciliation
        window, or the last ``within_s`` seconds of it
        (:mod:`rhumbatron.operator.reconciliation`)."""
        from rhumbatron.operator.reconciliation import reconcile

        js = (await self.nats()).jetstream()
        return await reconcile(
            self.actors,
            js,
            self.settings,
            now=now or self.clock.now(),
            stream_indexes=stream_indexes,
            within_s=within_s,
            should_stop=should_stop,
            progress=progress,
        )

    async def repair_log(self, report: ReconciliationReport, *, dry_run: bool) -> list[RepairStep]:
        """Move the lead of each stream whose leader lost events to a healthy replica; publish
        again, from the outbox, the events no replica holds; say what is left
        (:func:`rhumbatron.operator.reconciliation.repair`)."""
        from rhumbatron.messaging.sender import JetStreamSender
        from rhumbatron.operator.log_repair import Republisher, repair

        nc = await self.nats()
        sender = JetStreamSender(nc, ack_timeout_s=self.settings.publish_ack_timeout_s)
        republisher = Republisher(self.actors, sender)
        return await repair(nc, report, dry_run=dry_run, republisher=republisher)

    async def publisher(self) -> OutboxPublisher:
        """The process's publisher, over the current connection: rebuilt when the connection
        was replaced (nats-py closes a client for good on some server errors, and a publisher
        left on it would report ``unavailable`` for ever)."""
        if self._sender is not None:
            if self._publisher is None:
                self._publisher = self._new_publisher(self._sender)
            return self._publisher
        nc = await self.nats()
        if self._publisher is None or self._publisher_nc is not nc:
            from rhumbatron.messaging.sender import JetStreamSender

            sender = JetStreamSender(nc, ack_timeout_s=self.settings.publish_ack_timeout_s)
            self._publisher, self._publisher_nc = self._new_publisher(sender), nc
        return self._publisher

    def _new_publisher(self, sender: EventSender) -> OutboxPublisher:
        return OutboxPublisher(sender, self.settings, clock=self.clock, nudge=self.nudge)

    # -- commands ------------------------------------------------------------------------------
    async def command_bus(self) -> CommandBus:
        """The command bus over the current connection (rebuilt if it was replaced)."""
        from rhumbatron.messaging.commands import CommandBus

        nc = await self.nats()
        if self._bus is None or self._bus.nc is not nc:
            self._bus = CommandBus(nc, ack_timeout_s=self.settings.command_send_timeout_s)
        return self._bus

    async def queue_runtime(self) -> QueueConsumerRuntime:
        """The queue consumer runtime over the current connection."""
        from rhumbatron.messaging.queue_consumer import QueueConsumerRuntime
        from rhumbatron.product.letter_closing import SucceededCommandLetters

        bus = await self.command_bus()
        if self._queues is None or self._queues.nc is not bus.nc:
            if self._succeeded_letters is None:
                self._succeeded_letters = SucceededCommandLetters(self.product, self.clock)
            self._queues = QueueConsumerRuntime(
                bus.nc, self.settings, self.clock, bus, on_success=self._succeeded_letters
            )
        return self._queues

    # -- router, archive, metrics -----------------------------------------------------------
    def s3(self) -> S3Client:
        """The S3 client of the archive (moto's endpoint locally)."""
        if self._s3 is None:
            import boto3
            from botocore.config import Config

            session = boto3.Session(region_name=self.settings.s3_region)
            if self.settings.s3_endpoint_url and session.get_credentials() is None:
                # A local endpoint (moto) takes any credentials; the cloud never gets here.
                session = boto3.Session(
                    aws_access_key_id="local",
                    aws_secret_access_key="local",
                    region_name=self.settings.s3_region,
                )
            self._s3 = session.client(
                "s3",
                endpoint_url=self.settings.s3_endpoint_url,
                config=Config(
                    retries={"max_attempts": 2, "mode": "standard"},
                    connect_timeout=self.settings.s3_timeout_s,
                    read_timeout=self.settings.s3_timeout_s,
                ),
            )
        return self._s3

    def archive_writer(self) -> ArchiveWriter:
        from rhumbatron.archive import ArchiveWriter

        return ArchiveWriter(self.s3(), self.settings.evidence_bucket)

    def product(self) -> ProductDatabase:
        """The product database (dead letters, platform metrics)."""
        if self._product is None:
            from rhumbatron.runtime.product_schema import open_product_database

            self._product = open_product_database(self.settings)
        return self._product

    @property
    def metrics_sink(self) -> MetricsSink:
        if self._metrics_sink is None:
            from rhumbatron.metrics import EmfSink, NoEmf

            self._metrics_sink = EmfSink() if self.settings.metrics_emf else NoEmf()
        return self._metrics_sink

    def router(self) -> EventRouter:
        """The process's event router."""
        if self._router is None:
            from rhumbatron.router.event_router import EventRouter
            from rhumbatron.router.records import ProjectOwners

            reactions = self._reactions()
            self._router = EventRouter(
                settings=self.settings,
                clock=self.clock,
                connect=self.nats,
                product=self.product(),
                archive_writer=self.archive_writer,
                s3=self.s3,
                metrics_sink=self.metrics_sink,
                project_owners=ProjectOwners(self.project_tenant),
                reactions_handler=self._reactions_handler(reactions),
                prune_reaction_history=self._reaction_pruner(reactions),
                causal_routing=self._causal_routing or self.lifecycle().routing,
                outbox_backlog=self.outbox_backlog,
            )
            self._router.rebuild_lost_views = self._views_rebuilder(self._router)
            from rhumbatron.router.nudge import InProcessNudge

            if isinstance(self.nudge, InProcessNudge) and self.nudge.router is None:
                self.nudge.bind(self._router)
        return self._router

    @staticmethod
    def _views_rebuilder(router: EventRouter) -> Callable[[int], Awaitable[object]]:
        """A lost view store's rebuild: the stream's views from the log."""
        from rhumbatron.router.views import rebuild_views

        async def rebuild(stream: int) -> object:
            return await rebuild_views(router, stream=stream)

        return rebuild

    def bind_reactions(self, reactions: Reactions) -> None:
        """Run the router's ``reactions`` subscription, and prune its bookkeeping, with
        ``reactions`` (a registry, limits and effects of the caller's; tests bind their
        own). Binds before the subscription's first batch, as the router keeps its handler."""
        router = self.router()
        router.reactions_handler = self._reactions_handler(reactions)
        router.prune_reaction_history = self._reaction_pruner(reactions)

    def _reactions_handler(self, reactions: Reactions) -> RecordHandler:
        from rhumbatron.reactions.consumer import ReactionsConsumer

        return ReactionsConsumer(
            settings=self.settings,
            clock=self.clock,
            product=self.product(),
            metrics_sink=self.metrics_sink,
            reactions=reactions,
            lease_s=self.settings.router_ack_wait_s,
        )

    def _reaction_pruner(self, reactions: Reactions) -> Callable[[float, int], int]:
        from rhumbatron.reactions.store import ReactionHistoryPruner

        return ReactionHistoryPruner(self.product(), reactions.limits.reaction_history_days)

    def _reactions(self) -> Reactions:
        """The reactions consumer bound to the subscription registry (product database)."""
        from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
        from rhumbatron.runtime.reactions_assembly import LazyHttpClient, reactions_for

        if self._reaction_http is None:
            self._reaction_http = LazyHttpClient()
        registry = SubscriptionRegistry(self.product(), self.settings, self.clock)
        return reactions_for(self, registry, http=self._reaction_http)

    def webhook_retrier(self) -> WebhookRetrier:
        """The webhook retry pass over the delivery ledger (run once per sweep tick)."""
        from rhumbatron.runtime.reactions_assembly import LazyHttpClient, webhook_retrier_for

        if self._reaction_http is None:
            self._reaction_http = LazyHttpClient()
        return webhook_retrier_for(self, http=self._reaction_http)

    def lifecycle(self) -> Lifecycle:
        """The Change lifecycle's parts: causal rules, integration module, workflows,
        indexer, agent runtimes and queue handlers (built on first use)."""
        if self._lifecycle is None:
            from rhumbatron.runtime.lifecycle_assembly import Lifecycle

            self._lifecycle = Lifecycle(self)
        return self._lifecycle

    def outbox_backlog(self, *, every_actor: bool = False) -> dict[str, int]:
        """Open outbox rows by state, from the actors the due-actor index names
        (:meth:`ActorDirectory.outbox_backlog`); ``every_actor`` walks every file and adds
        the published rows."""
        return self.actors.outbox_backlog(every_actor=every_actor)

    # -- alarms ------------------------------------------------------------------------------
    async def alarm_jobs(self) -> AlarmJobs:
        """The alarm jobs over this process's actors and publisher."""
        from rhumbatron.runtime.alarm_scan import AlarmJobs

        return AlarmJobs(
            self.actors, await self.publisher(), self.clock, self.settings.publish_concurrency
        )

    async def fire_alarm(
        self, actor_key: str, *, should_stop: Callable[[], bool] | None = None
    ) -> PublishReport:
        """An actor's alarm fired (:meth:`AlarmJobs.fire_alarm`)."""
        return await (await self.alarm_jobs()).fire_alarm(actor_key, should_stop=should_stop)

    async def fire_due_alarms(
        self, *, should_stop: Callable[[], bool] | None = None, rotate: bool = False
    ) -> ScanReport:
        """The every-minute scan (:meth:`AlarmJobs.fire_due_alarms`)."""
        jobs = await self.alarm_jobs()
        return await jobs.fire_due_alarms(should_stop=should_stop, rotate=rotate)

    async def drain_alarms(self) -> list[PublishReport]:
        """The local invoker: fire every announced alarm (:meth:`AlarmJobs.drain_alarms`);
        nothing when the alarms are not recorded here."""
        if not isinstance(self.alarms, RecordingAlarmSink):
            return []
        return await (await self.alarm_jobs()).drain_alarms(self.alarms)

    # -- the sweep -----------------------------------------------------------------------------
    async def sweep_tick(
        self, now: datetime, *, should_stop: Callable[[], bool] | None = None
    ) -> SweepTick:
        """One sweep tick at ``now`` (:func:`~rhumbatron.runtime.sweep_tick.run_sweep_tick`)."""
        from rhumbatron.runtime.sweep_tick import run_sweep_tick

        return await run_sweep_tick(self, now, should_stop)

    async def close(self) -> None:
        if self._metrics_sink is not None:
            self._metrics_sink.flush()  # a long-lived local run's last EMF documents
        if self._lifecycle is not None:
            await self._lifecycle.close()
            self._lifecycle = None
        if self._reaction_http is not None:
            await self._reaction_http.aclose()
            self._reaction_http = None
        if self._queues is not None:
            await self._queues.close()
            self._queues = None
        self._bus = None
        if self._router is not None:
            await self._router.close()
            self._router = None
        if self._product is not None:
            self._product.close()
            self._product = None
        self.actors.close()
        if self._nc is not None and not self._nc.is_closed:
            # A reconnecting client (NATS down) cannot drain: closing it ends its reconnect loop.
            await (self._nc.drain() if self._nc.is_connected else self._nc.close())
        self._nc = None
        self._publisher = None


def bootstrap(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    alarms: AlarmSink | None = None,
    nudge: RouterNudge | None = None,
    sender: EventSender | None = None,
    metrics_sink: MetricsSink | None = None,
    causal_routing: CausalRouting | None = None,
) -> Rhumbatron:
    """Build the runtime. Refuses unsafe storage settings before anything opens a file."""
    settings = settings or load_settings()
    check_journal_mode(settings)
    if nudge is None and settings.router_nudge_function:
        nudge = _lambda_nudge(settings)
    return Rhumbatron(
        settings=settings,
        clock=clock or SystemClock(),
        alarms=alarms if alarms is not None else RecordingAlarmSink(),
        nudge=nudge or NoNudge(),
        _sender=sender,
        _metrics_sink=metrics_sink,
        _causal_routing=causal_routing,
    )


def _lambda_nudge(settings: Settings) -> RouterNudge:
    import boto3
    from botocore.config import Config

    from rhumbatron.router.nudge import LambdaNudge

    assert settings.router_nudge_function is not None
    client = boto3.client(
        "lambda",
        endpoint_url=settings.lambda_endpoint_url,
        config=Config(
            retries={"max_attempts": 2, "mode": "standard"},
            connect_timeout=settings.lambda_timeout_s,
            read_timeout=settings.lambda_timeout_s,
        ),
    )
    return LambdaNudge(client, settings.router_nudge_function)
