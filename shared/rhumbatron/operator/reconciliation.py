"""Reconciliation: the proof that the log holds every event the outbox marked ``published``.

A PubAck is JetStream's promise that an event is stored on a quorum of replicas. A replica can
still lose acknowledged events (a node stopped, its newest block file cut, restarted: it
rebuilds without them and says nothing to clients), and once it leads, they are gone from the
stream while the outbox still says ``published``. Nothing else in the system would notice.

:func:`reconcile` compares, per event stream, within the reconciliation window
(``reconcile_window_days``; default the event stream's retention):

* **by event ID, on every replica**: the outbox's published rows of the stream's actor files
  against the ``Nats-Msg-Id`` values each replica's copy holds (a headers-only scan on that
  node); an event a copy lacks is listed by ID;
* **per replica**: each node's own copy (its ``/jsz``, ``RHUMBATRON_NATS_MONITOR_URLS``): a
  replica whose messages fall short of its sequence range has lost events (a *hole*), which
  the leader's view alone misses until that replica leads.

The outbox is read before the log, so every row it calls ``published`` was stored before the
scan began. The window's oldest hour is left out of the check: its events may have aged out
of the stream (limits retention) since their rows were marked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rhumbatron.actors.directory import ActorDirectory
from rhumbatron.actors.outbox import published_since
from rhumbatron.core.clock import utc_day
from rhumbatron.core.progress import ProgressCallback
from rhumbatron.core.settings import Settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import MessagingError
from rhumbatron.messaging.log_state import ReplicaState, read_replica_states, read_stream_ids
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import (
    EVENT_STREAM_COUNT,
    event_stream_name,
    stable_event_id,
    stream_index,
)

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

__all__ = [
    "ReconciliationReport",
    "ReplicaReport",
    "StreamReconciliation",
    "log_gap_event",
    "reconcile",
    "split_missing",
]

#: The oldest part of the window left out of the check (see the module's docstring).
AGE_OUT_MARGIN_S = 3_600.0


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One node's copy of a stream: of the ``expected`` events the outbox published in the
    window, those it holds (``found``) and the IDs it lacks; and, from its ``/jsz`` when its
    monitor is known, the messages in its sequence range (``holes``: lost inside it) and how
    far it is behind the leader."""

    node: str
    leader: bool
    expected: int
    found: int
    missing: tuple[str, ...]
    state: ReplicaState | None = None
    behind: int = 0
    #: Why this copy could not be read (then nothing about it is proven).
    error: str | None = None
    #: Missing IDs stored beyond this copy's own last sequence: a follower still catching up
    #: (a node that lost stored events keeps its range, with holes in it), not a loss.
    catching_up: tuple[str, ...] = ()

    @property
    def holes(self) -> int:
        return self.state.holes if self.state is not None else 0

    @property
    def has_gap(self) -> bool:
        """Whether this copy lacks acknowledged events: IDs its scan did not find, a read
        that failed, or, where no event was there to look up by ID, holes in its range. A
        copy that holds every published event by ID has no gap even with holes: they are
        sequences whose events were published again (a repair) or deleted on purpose."""
        return bool(self.missing or self.error or (self.holes and not self.expected))

    def as_json(self) -> dict[str, object]:
        return {
            "node": self.node,
            "leader": self.leader,
            "expected": self.expected,
            "found": self.found,
            "missing": list(self.missing),
            "messages": None if self.state is None else self.state.messages,
            "firstSeq": None if self.state is None else self.state.first_seq,
            "lastSeq": None if self.state is None else self.state.last_seq,
            "holes": self.holes,
            "behind": self.behind,
            "catchingUp": list(self.catching_up),
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class StreamReconciliation:
    """One event stream: the events the outbox published in the window, and each replica's
    proof against them."""

    stream: str
    expected: int
    replicas: tuple[ReplicaReport, ...]
    #: Why the stream could not be read at all (then nothing about it is proven).
    error: str | None = None

    @property
    def has_gap(self) -> bool:
        """Whether some replica lacks acknowledged events, or something could not be read."""
        return bool(self.error or any(replica.has_gap for replica in self.replicas))

    @property
    def missing_everywhere(self) -> tuple[str, ...]:
        """The events no replica holds: only these may be published again from the outbox."""
        read = [replica for replica in self.replicas if replica.error is None]
        if not read:
            return ()
        common = set.intersection(*(set(replica.missing) for replica in read))
        return tuple(event_id for event_id in read[0].missing if event_id in common)

    def as_json(self) -> dict[str, object]:
        return {
            "stream": self.stream,
            "expected": self.expected,
            "gap": self.has_gap,
            "missingEverywhere": list(self.missing_everywhere),
            "replicas": [replica.as_json() for replica in self.replicas],
            "error": self.error,
        }


@dataclass(slots=True)
class ReconciliationReport:
    """Every stream checked, the window, the nodes that did not answer, and the cost."""

    checked_from: datetime
    checked_to: datetime
    streams: list[StreamReconciliation] = field(default_factory=list)
    unread_nodes: list[str] = field(default_factory=list)
    requests: int = 0
    seconds: float = 0.0

    @property
    def gaps(self) -> list[StreamReconciliation]:
        return [stream for stream in self.streams if stream.has_gap]

    def as_json(self) -> dict[str, object]:
        return {
            "checkedFrom": self.checked_from.isoformat(),
            "checkedTo": self.checked_to.isoformat(),
            "gap": bool(self.gaps),
            "streams": [stream.as_json() for stream in self.streams],
            "unreadNodes": self.unread_nodes,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
        }


async def reconcile(
    actors: ActorDirectory,
    js: JetStreamContext,
    settings: Settings,
    *,
    now: datetime,
    stream_indexes: Sequence[int] | None = None,
    within_s: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    progress: ProgressCallback | None = None,
) -> ReconciliationReport:
    """Prove, for each event stream of ``stream_indexes`` (default all eight) and each of its
    replicas, that the log holds every event the outbox published within the window (or,
    with ``within_s``, within that many seconds before ``now``, when it is shorter: the
    sweep's scheduled proof); say where it does not. ``should_stop`` is asked before each
    fetch of the scans: when time is up the proof raises
    :class:`~rhumbatron.messaging.log_state.ScanStopped`, and proves nothing. ``progress``
    hears the streams checked of those to check."""
    started = time.monotonic()
    indexes = sorted(set(range(EVENT_STREAM_COUNT) if stream_indexes is None else stream_indexes))
    window_s = settings.reconcile_window_s
    scan_from = datetime.fromtimestamp(now.timestamp() - window_s, UTC)
    checked_from = now.timestamp() - window_s + min(AGE_OUT_MARGIN_S, window_s / 2)
    if within_s is not None and within_s < window_s - min(AGE_OUT_MARGIN_S, window_s / 2):
        checked_from = now.timestamp() - within_s
        scan_from = datetime.fromtimestamp(checked_from, UTC)
    report = ReconciliationReport(
        checked_from=datetime.fromtimestamp(checked_from, UTC), checked_to=now
    )
    expected = await asyncio.to_thread(_published_by_stream, actors, checked_from, set(indexes))
    names = {index: event_stream_name(index) for index in indexes}
    states, report.unread_nodes = await asyncio.to_thread(
        read_replica_states, settings.monitor_urls, names.values()
    )
    report.requests += 2 * len(settings.monitor_urls)  # /varz and /jsz of each node
    for index, name in names.items():
        stream = await _reconcile_stream(
            js,
            name,
            expected.get(index, {}),
            [s for s in states if s.stream == name],
            scan_from,
            should_stop=should_stop,
        )
        report.requests += stream.requests
        report.streams.append(stream.result)
        if progress is not None:
            progress(len(report.streams), len(names), f"{name} checked")
    report.seconds = time.monotonic() - started
    return report


@dataclass(frozen=True, slots=True)
class _Checked:
    result: StreamReconciliation
    requests: int


async def _reconcile_stream(
    js: JetStreamContext,
    name: str,
    wanted: dict[str, int | None],
    states: Sequence[ReplicaState],
    scan_from: datetime,
    *,
    should_stop: Callable[[], bool] | None,
) -> _Checked:
    from nats.errors import Error as NatsError

    try:
        info = await js.stream_info(name)
    except NatsError as exc:
        error = f"cannot read {name}: {type(exc).__name__}: {exc}"
        return _Checked(StreamReconciliation(name, len(wanted), (), error=error), 1)
    cluster = info.cluster
    leader = cluster.leader if cluster is not None else None
    nodes: list[str | None] = [leader] if leader else [None]
    if cluster is not None:
        nodes += [peer.name for peer in cluster.replicas or () if peer.name]
    state_of = {state.node: state for state in states}
    leader_last = state_of[leader].last_seq if leader in state_of else info.state.last_seq
    requests = 1
    replicas: list[ReplicaReport] = []
    for node in nodes:
        # A server outside a cluster names no leader: its one copy is the one reported.
        state = state_of.get(node) if node else (states[0] if len(states) == 1 else None)
        replica, used = await _prove_replica(
            js,
            name,
            wanted,
            node,
            state,
            leader=leader,
            leader_last=leader_last,
            since=scan_from,
            should_stop=should_stop,
        )
        replicas.append(replica)
        requests += used
    return _Checked(StreamReconciliation(name, len(wanted), tuple(replicas)), requests)


async def _prove_replica(
    js: JetStreamContext,
    name: str,
    wanted: dict[str, int | None],
    node: str | None,
    state: ReplicaState | None,
    *,
    leader: str | None,
    leader_last: int,
    since: datetime,
    should_stop: Callable[[], bool] | None,
) -> tuple[ReplicaReport, int]:
    """One copy of stream ``name`` (on ``node``; ``None``: the one server) against the
    events the outbox published; and the requests its scan took."""
    behind = max(0, leader_last - state.last_seq) if state is not None else 0
    label = node or "(server)"
    if not wanted:  # nothing published in the window: nothing to prove by ID here
        return ReplicaReport(label, node == leader, 0, 0, (), state, behind), 0
    copy_last_seq = state.last_seq if state is not None else None
    try:
        ids = await read_stream_ids(
            js,
            name,
            since=since,
            on_node=node,
            copy_last_seq=copy_last_seq,
            should_stop=should_stop,
        )
    except MessagingError as exc:
        failed = ReplicaReport(label, node == leader, len(wanted), 0, (), state, behind, str(exc))
        return failed, 0
    missing, catching_up = split_missing(wanted, ids.sequence_of, state, leader_last=leader_last)
    report = ReplicaReport(
        label,
        node == leader,
        len(wanted),
        len(wanted) - len(missing) - len(catching_up),
        missing,
        state,
        behind,
        catching_up=catching_up,
    )
    return report, ids.requests


def split_missing(
    wanted: dict[str, int | None],
    found: dict[str, int],
    state: ReplicaState | None,
    *,
    leader_last: int,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The published IDs a replica's scan did not find, split into those it lost and those
    it has not received yet.

    An event the outbox saw stored at a sequence beyond the replica's own last sequence (its
    ``/jsz``) but within the leader's (``leader_last``) has not reached it: a follower
    catching up, after a restart or a slow disk. One inside its range, or of unknown place,
    is lost: a node that lost stored events keeps its sequence range, with holes in it. One
    beyond the leader's last sequence too is lost: the leader (or a server on its own) lost
    its newest events and their sequences with them, and nobody has them to send. Without
    the replica's ``/jsz`` nothing is known of its range, and every missing ID counts as
    lost.
    """
    lost: list[str] = []
    catching_up: list[str] = []
    for event_id, sequence in wanted.items():
        if event_id in found:
            continue
        if state is not None and sequence is not None and state.last_seq < sequence <= leader_last:
            catching_up.append(event_id)
        else:
            lost.append(event_id)
    return tuple(lost), tuple(catching_up)


def _published_by_stream(
    actors: ActorDirectory, since_s: float, indexes: set[int]
) -> dict[int, dict[str, int | None]]:
    """The outbox rows published since ``since_s``, per stream, in outbox order."""
    expected: dict[int, dict[str, int | None]] = {}
    for ref in actors.actor_refs():
        # An actor's events are its project's, and a project's events are on one stream:
        # an actor of a project on another stream is not opened.
        if stream_index(ref.project_id) not in indexes:
            continue
        with actors.visiting(ref) as actor:
            for event_id, index, sequence in published_since(actor.connection, since_s=since_s):
                if index in indexes:
                    expected.setdefault(index, {})[event_id] = sequence
    return expected


def log_gap_event(
    stream: str,
    node: str,
    lost: int,
    state: ReplicaState | None,
    *,
    tenant_id: str,
    project_id: str,
    now: datetime,
) -> Event:
    """The ``log.gap_detected`` fact of ``node``'s copy of ``stream`` lacking ``lost``
    acknowledged events: short of its own sequence range (``state``, its ``/jsz``), or, by
    the full proof, of events the outbox published.

    Its ID is stable for the same loss on the same UTC day: a gap seen by every tick of the
    day is one fact (the outbox's ``INSERT OR IGNORE`` drops the repeats), a loss that grows
    is a new one.
    """
    day = utc_day(now)
    caller = Caller(tenant_id, "system:reconciliation", f"log-gap:{stream}:{day}")
    payload = {
        "stream": stream,
        "node": node,
        "lostEvents": lost,
        "messages": None if state is None else state.messages,
        "firstSeq": None if state is None else state.first_seq,
        "lastSeq": None if state is None else state.last_seq,
    }
    event_id = stable_event_id(stream, "log.gap_detected", node, f"{day}:{lost}")
    return FactContext(caller, project_id, now).fact("log.gap_detected", payload, event_id=event_id)
