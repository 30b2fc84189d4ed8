"""The composition root: builds every adapter from settings, lazily, with test overrides.

Nothing heavy happens at import or at :func:`bootstrap`: the NATS connection opens on first
use and is reused (one per warm Lambda container). Actor files open on first use too.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rhumbatron.actors.actor import Actor, ActorKind, ActorRef
from rhumbatron.actors.alarms import AlarmSink, FireDecision, RecordingAlarmSink, alarm_due_at
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.publisher import OutboxPublisher, PublishReport
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.storage import check_journal_mode
from rhumbatron.errors import ActorError
from rhumbatron.messaging.nudge import NoNudge, RouterNudge
from rhumbatron.runtime.clock import Clock, SystemClock
from rhumbatron.runtime.settings import Settings, load_settings

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.messaging.sender import EventSender
    from rhumbatron.messaging.streams import StreamReport

__all__ = ["Rhumbatron", "ScanReport", "bootstrap"]


@dataclass
class ScanReport:
    """What one every-minute scan did: a report per fired actor, and actors not reached."""

    reports: list[PublishReport] = field(default_factory=list)
    actors_left: int = 0


@dataclass
class Rhumbatron:
    """Everything a role needs, built once per process from :class:`Settings`."""

    settings: Settings
    clock: Clock
    alarms: AlarmSink
    nudge: RouterNudge
    _sender: EventSender | None = None
    _nc: NATS | None = None
    _publisher: OutboxPublisher | None = None
    _actors: dict[ActorRef, Actor] = field(default_factory=dict)

    # -- actors ----------------------------------------------------------------------------
    def actor(self, ref: ActorRef) -> Actor:
        """The (cached) actor for ``ref``."""
        actor = self._actors.get(ref)
        if actor is None:
            cls = ProjectRoot if ref.kind is ActorKind.PROJECT_ROOT else ResourceShard
            actor = cls(ref, self.settings, clock=self.clock, alarms=self.alarms)
            self._actors[ref] = actor
        return actor

    def project_root(self, project_id: str) -> ProjectRoot:
        actor = self.actor(ProjectRoot.ref_for(project_id))
        assert isinstance(actor, ProjectRoot)
        return actor

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard:
        """The shard of ``project_id`` that owns ``resource_key`` (``change:<id>``, a path …)."""
        ref = ResourceShard.ref_for(project_id, resource_key, self.settings.resource_shard_count)
        actor = self.actor(ref)
        assert isinstance(actor, ResourceShard)
        return actor

    @property
    def open_actor_count(self) -> int:
        """Actor files this process holds open right now."""
        return len(self._actors)

    def actor_refs(self) -> Iterator[ActorRef]:
        """Every actor file under the state directory."""
        projects = self.settings.state_dir / "projects"
        if not projects.is_dir():
            return
        for path in sorted(projects.glob("*/*.sqlite")):
            project_id, name = path.parent.name, path.stem
            try:
                if name == "root":
                    yield ActorRef(ActorKind.PROJECT_ROOT, project_id)
                elif name.startswith("shard-"):
                    yield ActorRef(ActorKind.RESOURCE_SHARD, project_id, int(name[6:]))
            except (ActorError, ValueError):
                continue  # not an actor file of ours

    # -- NATS --------------------------------------------------------------------------------
    async def nats(self) -> NATS:
        """The process's one NATS connection, opened on first use."""
        if self._nc is None or self._nc.is_closed:
            from rhumbatron.messaging.connection import connect_nats

            self._nc = await connect_nats(self.settings, name="rhumbatron")
        return self._nc

    async def ensure_streams(self) -> StreamReport:
        """Create or reconcile the streams; refuse non-durable JetStream when it is demanded."""
        from rhumbatron.messaging.durability import check_durability, check_stream_replicas
        from rhumbatron.messaging.streams import ensure_streams

        check_durability(self.settings)
        js = (await self.nats()).jetstream()
        report = await ensure_streams(js, self.settings)
        if self.settings.require_durable_jetstream:
            names = [*report.created, *report.updated, *report.unchanged]
            infos = [await js.stream_info(name) for name in names]
            check_stream_replicas(
                self.settings, {i.config.name or "?": i.config.num_replicas or 1 for i in infos}
            )
        return report

    async def publisher(self) -> OutboxPublisher:
        if self._publisher is None:
            sender = self._sender
            if sender is None:
                from rhumbatron.messaging.sender import JetStreamSender

                sender = JetStreamSender(
                    await self.nats(), ack_timeout_s=self.settings.publish_ack_timeout_s
                )
            self._publisher = OutboxPublisher(
                sender, self.settings, clock=self.clock, nudge=self.nudge
            )
        return self._publisher

    # -- alarms ------------------------------------------------------------------------------
    async def fire_alarm(self, actor_key: str) -> PublishReport:
        """An actor's alarm fired (async invoke in the cloud, the local invoker here)."""
        actor = self.actor(ActorRef.parse(actor_key))
        return await (await self.publisher()).fire_alarm(actor)

    async def fire_due_alarms(
        self, *, should_stop: Callable[[], bool] | None = None, rotate: bool = False
    ) -> ScanReport:
        """The every-minute scan: fire every due alarm; publish capped ones without a fire.

        Up to ``publish_concurrency`` actors at once (order is per actor, and the publish
        lock keeps two publishers off one actor). ``should_stop`` is asked before each actor
        (a Lambda stops before its time runs out; the next scan continues). ``rotate``
        starts at a random actor so a scan that runs out of time does not starve the actors
        at the end of the list. Actor files opened only for the scan are closed again: a
        warm container must not collect open files.
        """
        refs = list(self.actor_refs())
        if rotate and refs:
            start = random.randrange(len(refs))
            refs = refs[start:] + refs[:start]
        scan = ScanReport()
        publisher = await self.publisher()
        now_s = self.clock.now().timestamp()
        queue = deque(refs)

        async def scan_one(ref: ActorRef) -> None:
            opened_here = ref not in self._actors
            actor = self.actor(ref)
            try:
                due = alarm_due_at(actor.connection)
                if due is None or due > now_s:
                    return
                report = await publisher.fire_alarm(actor)
                if report.alarm is FireDecision.CAPPED:
                    report = await publisher.publish_due(actor)
                    report.alarm = FireDecision.CAPPED
                scan.reports.append(report)
            finally:
                if opened_here:
                    self._actors.pop(ref).close()

        async def worker() -> None:
            while queue:
                if should_stop is not None and should_stop():
                    scan.actors_left = len(queue)
                    return
                await scan_one(queue.popleft())

        await asyncio.gather(*(worker() for _ in range(self.settings.publish_concurrency)))
        return scan

    async def drain_alarms(self) -> list[PublishReport]:
        """The local invoker: fire announced alarms until no announced actor has due work.

        Up to ``publish_concurrency`` actors at once. An actor whose run left rows due (the
        per-project cap) or that was announced again while it ran goes round once more.
        """
        if not isinstance(self.alarms, RecordingAlarmSink):
            return []
        sink = self.alarms
        queue: deque[str] = deque(sink.drain())
        running: set[str] = set()
        again: set[str] = set()
        reports: list[PublishReport] = []

        def take_announcements() -> None:
            for key in sink.drain():
                if key in running:
                    again.add(key)
                elif key not in queue:
                    queue.append(key)

        async def worker() -> None:
            while queue:
                key = queue.popleft()
                running.add(key)
                try:
                    report = await self.fire_alarm(key)
                finally:
                    running.discard(key)
                reports.append(report)
                now_s = self.clock.now().timestamp()
                due_now = report.next_alarm_at is not None and report.next_alarm_at <= now_s
                if (due_now or key in again) and not report.unavailable:
                    again.discard(key)
                    queue.append(key)
                take_announcements()

        while queue:
            await asyncio.gather(*(worker() for _ in range(self.settings.publish_concurrency)))
            take_announcements()
        return reports

    async def close(self) -> None:
        for actor in self._actors.values():
            actor.close()
        self._actors.clear()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.drain()
        self._nc = None
        self._publisher = None


def bootstrap(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    alarms: AlarmSink | None = None,
    nudge: RouterNudge | None = None,
    sender: EventSender | None = None,
) -> Rhumbatron:
    """Build the runtime. Refuses unsafe storage settings before anything opens a file."""
    settings = settings or load_settings()
    check_journal_mode(settings)
    return Rhumbatron(
        settings=settings,
        clock=clock or SystemClock(),
        alarms=alarms if alarms is not None else RecordingAlarmSink(),
        nudge=nudge or NoNudge(),
        _sender=sender,
    )
