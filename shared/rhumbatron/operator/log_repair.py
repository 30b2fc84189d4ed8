"""The repair of a log that lost acknowledged events, from a reconciliation's report
(:mod:`rhumbatron.operator.reconciliation`): make nothing worse, then say what is left.

* a stream whose **leader** lost events while a healthy replica holds them all: the lead moves
  there (JetStream's leader stepdown, preferring it), done here;
* each **damaged replica** with a healthy one beside it: listed to rebuild on its node (stop
  it, delete its copy, start it: the operator's step, docs/operations.md);
* the events **no replica holds**: published again from their outbox rows, done here, each
  after the stream's newer events (the order caveat); never an event some replica holds,
  which would be a duplicate there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.actors.directory import ActorDirectory
from rhumbatron.actors.publisher import republish_rows
from rhumbatron.errors import MessagingError
from rhumbatron.messaging.sender import EventSender
from rhumbatron.operator.reconciliation import ReconciliationReport, StreamReconciliation
from rhumbatron.protocol.ids import event_stream_index, stream_index

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = ["RepairStep", "Republished", "Republisher", "move_leader", "repair"]


@dataclass(frozen=True, slots=True)
class RepairStep:
    """One thing the repair did (or, in a dry run, would do) for a stream with a gap, or
    leaves to an operator: ``move_leader`` away from a damaged replica to a healthy one
    (done here), ``rebuild_replica`` on its node (an operator's step: docs/operations.md),
    ``republish`` the events no replica holds, from their outbox rows (done here, after the
    stream's newer events: the order caveat)."""

    stream: str
    action: str
    node: str
    detail: str
    done: bool

    def as_json(self) -> dict[str, object]:
        return {
            "stream": self.stream,
            "action": self.action,
            "node": self.node,
            "detail": self.detail,
            "done": self.done,
        }


async def repair(
    nc: NATS,
    report: ReconciliationReport,
    *,
    dry_run: bool,
    republisher: Republisher | None = None,
    timeout_s: float = 15.0,
) -> list[RepairStep]:
    """Make nothing worse, then say what is left: for each stream with a gap whose leader
    lost events while a healthy replica holds them all, move the lead there (JetStream's
    leader stepdown, preferring it); list each damaged replica to rebuild from the leader;
    and publish again, from their outbox rows, the events no replica holds (with a
    ``republisher``; they land after the stream's newer events)."""
    steps: list[RepairStep] = []
    for stream in report.gaps:
        damaged = [r for r in stream.replicas if r.has_gap]
        healthy = [r for r in stream.replicas if not r.has_gap]
        leader = next((r for r in damaged if r.leader), None)
        if leader is not None and healthy:
            target = healthy[0].node
            detail = f"the lead moves from {leader.node}, which lost events, to {target}"
            if not dry_run:
                await move_leader(nc, stream.stream, target, timeout_s=timeout_s)
            steps.append(RepairStep(stream.stream, "move_leader", target, detail, not dry_run))
        # A damaged copy is rebuilt from a healthy one; with none (a server on its own, or
        # every copy short), deleting a copy would lose what it still holds.
        for replica in damaged if healthy else ():
            steps.append(
                RepairStep(
                    stream.stream,
                    "rebuild_replica",
                    replica.node,
                    f"{len(replica.missing) or replica.holes} event(s) lost: stop the node, "
                    f"delete its copy of {stream.stream}, start it (docs/operations.md, "
                    "Log gap detected)",
                    False,
                )
            )
        if stream.missing_everywhere:
            steps.append(await _republish_step(stream, dry_run, republisher))
    return steps


async def _republish_step(
    stream: StreamReconciliation, dry_run: bool, republisher: Republisher | None
) -> RepairStep:
    """Publish again the events no replica of ``stream`` holds, or say it would (dry run) or
    cannot (no republisher)."""
    lost = stream.missing_everywhere
    caveat = "each lands after the stream's newer events (docs/operations.md, Log gap detected)"
    unread = [replica.node for replica in stream.replicas if replica.error is not None]
    if unread:  # a copy not read may hold them: a re-publish would be a duplicate there
        return RepairStep(
            stream.stream,
            "republish",
            "",
            f"{len(lost)} event(s) no copy read holds are not published again: "
            f"{', '.join(unread)} could not be read, and may hold them; repair again once "
            "every copy answers",
            False,
        )
    if dry_run or republisher is None:
        why = "would be published again from the outbox" if dry_run else "not published again"
        return RepairStep(
            stream.stream,
            "republish",
            "",
            f"{len(lost)} event(s) no replica holds {why}: {caveat}",
            False,
        )
    result = await republisher.republish(stream.stream, lost)
    detail = (
        f"{len(result.stored)} of {len(lost)} event(s) no replica held published again: {caveat}"
    )
    if result.repeats:
        detail += (
            f"; {len(result.repeats)} dropped by the stream's duplicate window as repeats "
            "(it still remembers their IDs): repair again once the window has passed"
        )
    if result.unknown:
        detail += f"; {len(result.unknown)} have no published outbox row any more"
    return RepairStep(stream.stream, "republish", "", detail, bool(result.stored))


@dataclass(frozen=True, slots=True)
class Republished:
    """What a re-publish did: the event IDs stored again, those the stream's duplicate
    window dropped as repeats, and those no outbox row holds any more."""

    stored: tuple[str, ...]
    repeats: tuple[str, ...]
    unknown: tuple[str, ...]


class Republisher:
    """Publishes again, from their outbox rows, events no replica of the log holds.

    Each goes out with its own ``Nats-Msg-Id``, one at a time in its actor's outbox order,
    and its row's ``stream_seq`` moves to where it is stored now. Only what no replica
    holds may be sent: a copy of what a replica still has would be a duplicate there.
    """

    def __init__(self, actors: ActorDirectory, sender: EventSender) -> None:
        self._actors = actors
        self._sender = sender

    async def republish(self, stream: str, event_ids: Sequence[str]) -> Republished:
        index = event_stream_index(stream)
        wanted = set(event_ids)
        stored: list[str] = []
        repeats: list[str] = []
        for ref in self._actors.actor_refs():
            if not wanted:
                break
            if stream_index(ref.project_id) != index:
                continue  # an actor's events are all on its project's stream
            with self._actors.visiting(ref) as actor:
                stored_here, repeats_here = await republish_rows(
                    actor, self._sender, sorted(wanted)
                )
            wanted.difference_update(stored_here, repeats_here)
            stored += stored_here
            repeats += repeats_here
        unknown = tuple(event_id for event_id in event_ids if event_id in wanted)
        return Republished(tuple(stored), tuple(repeats), unknown)


async def move_leader(nc: NATS, stream: str, node: str, *, timeout_s: float = 15.0) -> None:
    """Step the stream's leader down, preferring ``node``, until ``node`` leads."""
    import contextlib
    import json

    from nats.errors import Error as NatsError

    js = nc.jetstream()
    deadline = time.monotonic() + timeout_s
    while True:
        info = await js.stream_info(stream)
        if info.cluster is not None and info.cluster.leader == node:
            return
        if time.monotonic() > deadline:
            raise MessagingError(f"{node} did not take the lead of {stream} in {timeout_s:g} s")
        with contextlib.suppress(NatsError):  # between leaders nobody answers: ask again
            await nc.request(
                f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                json.dumps({"placement": {"preferred": node}}).encode(),
                timeout=2,
            )
        await asyncio.sleep(0.5)  # an election takes a moment
