"""The alarm jobs: an actor's alarm fired, the every-minute scan, and the local drain.

A fire asks the actor's AlarmGuard, then publishes while rows are due. The scan visits the
actors the due-actor index names as due, up to ``publish_concurrency`` at once; the local
invoker drains the alarms a :class:`~rhumbatron.actors.alarms.RecordingAlarmSink` announced.
Each job nudges the router once per stream it moved, when it ends (the local drain, at the end
of each round of fires): not once per actor, nor once per 100-row publish, so a busy run costs
the router one run per stream, not one per actor. One actor's failure (a damaged or locked
file) is recorded in its report and does not stop the others. These are the composition root's
jobs: they read the actor directory and the publisher it built, and
:class:`~rhumbatron.runtime.bootstrap.Rhumbatron` runs them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rhumbatron.actors.actor import Actor, ActorRef
from rhumbatron.actors.alarms import FireDecision, RecordingAlarmSink, alarm_due_at
from rhumbatron.actors.directory import ActorDirectory
from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.actors.publisher import OutboxPublisher, PublishReport, ScanReport
from rhumbatron.core.clock import Clock
from rhumbatron.errors import ActorError, RhumbatronError

__all__ = ["AlarmJobs"]

_log = logging.getLogger(__name__)


def _failed_report(actor_key: str, exc: BaseException) -> PublishReport:
    _log.error("publishing actor %s failed: %s", actor_key, exc)
    return PublishReport(actor_key, error=f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True, slots=True)
class AlarmJobs:
    """The alarm jobs over ``actors`` with ``publisher``, ``concurrency`` actors at once."""

    actors: ActorDirectory
    publisher: OutboxPublisher
    clock: Clock
    concurrency: int

    async def fire_alarm(
        self, actor_key: str, *, should_stop: Callable[[], bool] | None = None
    ) -> PublishReport:
        """An actor's alarm fired (the local invoker here; an async invoke in the cloud).

        Refuses an actor that has no file: an alarm for a mistyped key must not create one.
        """
        ref = ActorRef.parse(actor_key)
        self.actors.check_shard(ref)
        state_dir = self.actors.settings.state_dir
        if not self.actors.is_open(ref) and not ref.path(state_dir).exists():
            raise ActorError(
                f"no actor file for {actor_key} at {ref.path(state_dir)}; "
                "an alarm can only fire for an actor that has written something"
            )
        report = await self._drain_actor(self.actors.actor(ref), should_stop)
        await self.publisher.nudge_streams(report.nudged)
        return report

    async def _drain_actor(
        self,
        actor: Actor,
        should_stop: Callable[[], bool] | None = None,
        *,
        publish_when_capped: bool = False,
    ) -> PublishReport:
        """One alarm fire: AlarmGuard decides, then publish while rows are due now.

        The per-call cap (100 rows per project) bounds one ``publish_due``, not one fire: an
        actor that writes more than 100 events between fires must not fall behind. A fire
        refused at the daily cap publishes nothing, except from the every-minute scan
        (``publish_when_capped``), which publishes without counting a fire (DECISIONS).
        """
        publisher = self.publisher
        report = await publisher.fire_alarm(actor, nudge=False)
        if report.alarm is FireDecision.CAPPED and publish_when_capped:
            report.absorb(await publisher.publish_due(actor, nudge=False))
        elif report.alarm is not FireDecision.FIRE:
            return report
        while (
            report.last_published
            and report.next_alarm_at is not None
            and report.next_alarm_at <= self.clock.now().timestamp()
            and not (should_stop is not None and should_stop())
        ):
            report.absorb(await publisher.publish_due(actor, nudge=False))
        return report

    async def fire_due_alarms(
        self, *, should_stop: Callable[[], bool] | None = None, rotate: bool = False
    ) -> ScanReport:
        """The every-minute scan: fire every due alarm, up to ``concurrency`` at once.

        The actors visited are those the due-actor index names as due
        (:mod:`~rhumbatron.actors.due_index`), the longest-due first; no other actor file is
        opened. Once a day, and on the first scan of a state directory from before the
        index, it walks every actor file instead, settles each one's marker, and stamps the
        index complete. Each visit settles the actor's marker under its write lock.

        Order is per actor, and the publish lock keeps two publishers off one actor.
        ``should_stop`` is asked before each actor and between publishes (a Lambda stops
        before its time runs out; the next scan continues). ``rotate`` starts a full walk at
        a random actor so a walk that runs out of time does not starve the actors at the end
        of the list. Actor files opened only for the scan are closed again: a warm container
        must not collect open files.
        """
        index = self.actors.due_index
        now_s = self.clock.now().timestamp()
        scan = ScanReport(full_walk=index.needs_full_walk(now_s))
        if scan.full_walk:
            refs = list(self.actors.actor_refs())
            if rotate and refs:
                start = random.randrange(len(refs))
                refs = refs[start:] + refs[:start]
        else:
            refs = self.actors.indexed_refs(index.due(now_s))
        queue = deque(refs)

        async def worker() -> None:
            while queue:
                if should_stop is not None and should_stop():
                    scan.actors_left = len(queue)
                    return
                await self._scan_one(queue.popleft(), scan, now_s, should_stop)

        await asyncio.gather(*(worker() for _ in range(min(self.concurrency, len(queue)))))
        if scan.full_walk and scan.actors_left == 0:
            index.mark_complete(now_s)
        await self.publisher.nudge_streams(i for r in scan.reports for i in r.nudged)
        return scan

    async def _scan_one(
        self,
        ref: ActorRef,
        scan: ScanReport,
        now_s: float,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        try:
            with self.actors.visiting(ref) as actor:
                scan.actors_visited += 1
                due = alarm_due_at(actor.connection)
                if due is not None and due <= now_s:
                    report = await self._drain_actor(actor, should_stop, publish_when_capped=True)
                    scan.reports.append(report)
                await asyncio.to_thread(self._settle_marker, actor)
        except (RhumbatronError, sqlite3.Error) as exc:
            scan.reports.append(_failed_report(ref.key, exc))
            # Visited again by the next scan: a failure must not drop the actor from the index.
            try:
                self.actors.due_index.mark(ref.key, now_s)
            except OSError as mark_failed:  # the day's full walk still finds it
                _log.error("cannot keep %s in the due-actor index: %s", ref.key, mark_failed)

    @staticmethod
    def _settle_marker(actor: Actor) -> None:
        """The actor's marker set to the alarm its file holds, and kept for its failed rows,
        both read under its write lock (BEGIN IMMEDIATE, no write: nothing is synced)."""
        with actor.write() as db:
            failed = counts_by_state(db)[RowState.FAILED]
            actor.due_index.settle(actor.ref.key, alarm_due_at(db), failed_rows=failed)

    async def drain_alarms(self, sink: RecordingAlarmSink) -> list[PublishReport]:
        """The local invoker: fire every alarm ``sink`` announced, up to ``concurrency`` at
        once, until no announcement is left.

        It works in rounds: the keys announced when a round starts, then those announced
        while it ran. Each round ends by nudging the streams it moved, once each: under a
        steady load the sink is seldom empty, and a router nudged only when the whole drain
        ends would wait as long as the load lasts.
        """
        reports: list[PublishReport] = []
        queue: deque[str] = deque()

        async def worker(round_reports: list[PublishReport]) -> None:
            while queue:
                key = queue.popleft()
                try:
                    actor = self.actors.actor(ActorRef.parse(key))
                    round_reports.append(await self._drain_actor(actor))
                except (RhumbatronError, sqlite3.Error) as exc:
                    round_reports.append(_failed_report(key, exc))

        while keys := sink.drain():
            queue.extend(keys)
            this_round: list[PublishReport] = []
            # No more workers than actors to drain: a busy local invoker drains a key or two
            # per call, and each idle worker is a task created and run for nothing.
            await asyncio.gather(
                *(worker(this_round) for _ in range(min(self.concurrency, len(queue))))
            )
            reports += this_round
            await self.publisher.nudge_streams(i for r in this_round for i in r.nudged)
        return reports
