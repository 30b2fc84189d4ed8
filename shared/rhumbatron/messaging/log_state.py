"""What the log holds, read two ways for reconciliation against the outbox.

* **Per replica, cheap**: every node's ``/jsz`` (its monitoring endpoint) reports its own copy
  of each stream: messages, first and last sequence, deleted. Nothing deletes from an event
  stream (limits retention only moves its first sequence), so a replica whose messages fall
  short of its sequence range has a *hole*: acknowledged events it lost, as a node does
  whose newest block file was cut before a restart. A replica only *behind* the leader (a
  lower last sequence, no hole) is catching up, not damaged.
* **By event ID, per replica**: an ephemeral, headers-only R1 consumer placed on that replica
  reads every ``Nats-Msg-Id`` and its stream sequence from a start time on, a thousand per
  request.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rhumbatron.errors import MessagingError

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

__all__ = [
    "ReplicaState",
    "ScanStopped",
    "StreamIds",
    "read_replica_states",
    "read_stream_ids",
]


class ScanStopped(Exception):
    """A scan stopped because its caller's time was up: nothing about the copy is proven."""


#: Messages one fetch of the headers-only scan asks for.
SCAN_BATCH = 1_000


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One node's copy of one stream, as its ``/jsz`` reports it."""

    stream: str
    node: str
    messages: int
    first_seq: int
    last_seq: int
    deleted: int
    leader: str | None

    @property
    def is_leader(self) -> bool:
        return self.node == self.leader

    @property
    def span(self) -> int:
        """Messages its sequence range would hold with nothing missing."""
        return max(0, self.last_seq - self.first_seq + 1)

    @property
    def holes(self) -> int:
        """Messages missing inside its own sequence range (0 on a healthy event stream)."""
        return max(0, self.span - self.messages)


def read_replica_states(
    monitor_urls: Sequence[str], streams: Iterable[str], *, timeout_s: float = 2.0
) -> tuple[list[ReplicaState], list[str]]:
    """Each node's copy of each of ``streams``; and the monitor URLs that did not answer,
    each with why."""
    wanted = set(streams)
    states: list[ReplicaState] = []
    unread: list[str] = []
    for url in monitor_urls:
        try:
            # /jsz does not name its server; /varz does.
            node = str(_read_json(url, "/varz", timeout_s).get("server_name") or url)
            jsz = _read_json(url, "/jsz?streams=true&accounts=true", timeout_s)
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
            unread.append(f"{url} ({exc})")
            continue
        for account in jsz.get("account_details") or ():
            for stream in account.get("stream_detail") or ():
                if stream.get("name") not in wanted:
                    continue
                state = stream.get("state") or {}
                states.append(
                    ReplicaState(
                        stream=str(stream["name"]),
                        node=node,
                        messages=int(state.get("messages", 0)),
                        first_seq=int(state.get("first_seq", 0)),
                        last_seq=int(state.get("last_seq", 0)),
                        deleted=int(state.get("num_deleted", 0)),
                        leader=(stream.get("cluster") or {}).get("leader") or node,
                    )
                )
    return states, unread


def _read_json(monitor_url: str, path: str, timeout_s: float) -> dict[str, Any]:
    url = monitor_url.rstrip("/") + path
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return dict(json.load(answer))


@dataclass(frozen=True, slots=True)
class StreamIds:
    """The event IDs one replica of a stream holds from a start time on, each at its
    sequence; the node it was read on (None: not pinned, one server); the requests taken."""

    stream: str
    node: str | None
    sequence_of: dict[str, int]
    requests: int


#: Tries to have JetStream place the scan's consumer on the wanted replica.
PLACEMENT_TRIES = 30


async def read_stream_ids(
    js: JetStreamContext,
    stream: str,
    *,
    since: datetime,
    on_node: str | None = None,
    copy_last_seq: int | None = None,
    batch: int = SCAN_BATCH,
    should_stop: Callable[[], bool] | None = None,
) -> StreamIds:
    """Every ``Nats-Msg-Id`` on ``stream`` stored at or after ``since``, read by a
    headers-only R1 consumer (no bodies cross the wire), up to the last sequence the stream
    had when the scan began.

    An R1 consumer reads the copy of the server it is placed on, and JetStream places it on
    any replica: with ``on_node``, a consumer placed elsewhere is deleted and made again
    until it lands there, so the scan proves that replica's copy. ``copy_last_seq`` is that
    copy's own last sequence (its ``/jsz``), when known: a copy already that far has nothing
    left to catch up, so its scan ends where its messages do instead of waiting
    :data:`CATCH_UP_S` for the ones it lost. ``should_stop`` is asked before each fetch;
    when it says yes the scan raises :class:`ScanStopped` (its consumer is deleted).
    """
    from nats.errors import Error as NatsError

    try:
        last_seq = (await js.stream_info(stream)).state.last_seq
        if last_seq == 0:
            return StreamIds(stream, on_node, {}, 1)
        name, requests = await _consumer_on(js, stream, since, on_node)
        try:
            caught_up = copy_last_seq is not None and copy_last_seq >= last_seq
            sequence_of, fetches = await _scan(
                js, stream, name, last_seq, batch, caught_up=caught_up, should_stop=should_stop
            )
        finally:
            await js.delete_consumer(stream, name)
    except NatsError as exc:
        where = f" on {on_node}" if on_node else ""
        raise MessagingError(
            f"cannot read the event IDs of {stream}{where}: {type(exc).__name__}: {exc}"
        ) from exc
    return StreamIds(stream, on_node, sequence_of, 1 + requests + fetches + 1)


async def _consumer_on(
    js: JetStreamContext, stream: str, since: datetime, node: str | None
) -> tuple[str, int]:
    """A headers-only consumer from ``since`` on, placed on ``node``; its name and the
    requests its placement took."""
    import uuid

    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    for attempt in range(1, PLACEMENT_TRIES + 1):
        name = f"reconcile-{uuid.uuid4().hex[:12]}"
        info = await js.add_consumer(
            stream,
            ConsumerConfig(
                name=name,
                deliver_policy=DeliverPolicy.BY_START_TIME,
                opt_start_time=since,
                ack_policy=AckPolicy.NONE,
                headers_only=True,
                mem_storage=True,
                num_replicas=1,
                inactive_threshold=60.0,
            ),
        )
        placed = info.cluster.leader if info.cluster is not None else None
        if node is None or placed in (None, node):
            return name, 2 * attempt - 1
        await js.delete_consumer(stream, name)
    raise MessagingError(
        f"JetStream placed no scan consumer of {stream} on {node} in {PLACEMENT_TRIES} tries: "
        "is it a replica of the stream?"
    )


#: Fetches in a row that may come back empty before a scan with messages still pending
#: gives up (a loaded server answers late; it does not end the stream).
SCAN_STALLS = 10


#: How long a scan asks again while nobody answers its fetches (503), and the pause between.
UNANSWERED_S = 5.0
UNANSWERED_PAUSE_S = 0.2


#: How long a scan waits for a replica behind the leader to catch up to the leader's last
#: sequence (a follower applies what the leader stored a moment ago): a replica still short
#: after it is reported as it is.
CATCH_UP_S = 5.0


async def _scan(
    js: JetStreamContext,
    stream: str,
    consumer: str,
    last_seq: int,
    batch: int,
    *,
    caught_up: bool,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[dict[str, int], int]:
    """Fetch the consumer's headers up to ``last_seq``: each ID at its sequence, and the
    requests it took. A fetch that times out ends the scan only when the consumer has nothing
    pending, and, short of ``last_seq``, once the replica had :data:`CATCH_UP_S` to catch up
    (at once when its copy is known to have ``caught_up`` to ``last_seq``): a slow answer or a
    lagging follower is not the end of the copy. A fetch nobody answers (503) is a stall too:
    a consumer just placed on another node takes a moment before its interest reaches the
    server this client is connected to."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.errors import ServiceUnavailableError

    subscription = await js.pull_subscribe_bind(consumer=consumer, stream=stream)
    sequence_of: dict[str, int] = {}
    pacing = _ScanPacing(stream, caught_up=caught_up)
    seen = 0
    try:
        while seen < last_seq:
            if should_stop is not None and should_stop():
                raise ScanStopped(f"the scan of {stream} stopped at sequence {seen}: out of time")
            pacing.requests += 1
            try:
                messages = await subscription.fetch(batch, timeout=1.0)
            except (ServiceUnavailableError, NoRespondersError):
                await pacing.unanswered()
                continue
            except (NatsTimeoutError, TimeoutError):  # nats-py raises either
                pacing.requests += 1
                pending = (await subscription.consumer_info()).num_pending
                if pacing.timed_out_ends_copy(pending):
                    break  # the replica's copy ends here
                continue
            pacing.answered()
            for msg in messages:
                event_id = (msg.headers or {}).get("Nats-Msg-Id")
                if event_id is not None:
                    sequence_of[event_id] = msg.metadata.sequence.stream
                seen = max(seen, msg.metadata.sequence.stream)
    finally:
        await subscription.unsubscribe()
    return sequence_of, pacing.requests


class _ScanPacing:
    """When a scan's fetch that brought nothing ends the scan, waits, or fails it; and the
    requests the scan made."""

    def __init__(self, stream: str, *, caught_up: bool) -> None:
        self.stream = stream
        self.caught_up = caught_up
        self.requests = 0
        self._stalls = 0
        self._catch_up_until: float | None = None
        self._unanswered_until: float | None = None

    def answered(self) -> None:
        self._stalls = 0
        self._unanswered_until = None

    async def unanswered(self) -> None:
        """A fetch nobody answered: ask again after a pause, for up to
        :data:`UNANSWERED_S`."""
        now = time.monotonic()
        self._unanswered_until = self._unanswered_until or now + UNANSWERED_S
        if now >= self._unanswered_until:
            raise MessagingError(
                f"nobody answered the scan of {self.stream} for {UNANSWERED_S:g} s"
            )
        await asyncio.sleep(UNANSWERED_PAUSE_S)

    def timed_out_ends_copy(self, pending: int | None) -> bool:
        """A fetch timed out with ``pending`` messages left for the consumer: whether the
        copy ends here (nothing pending, and caught up or given its catch-up time); raises
        after :data:`SCAN_STALLS` empty fetches in a row with messages still pending."""
        if pending == 0:
            if self.caught_up:
                return True  # the copy's messages end here; the rest it lost
            now = time.monotonic()
            self._catch_up_until = self._catch_up_until or now + CATCH_UP_S
            return now >= self._catch_up_until
        self._stalls += 1
        if self._stalls >= SCAN_STALLS:
            raise MessagingError(
                f"the scan of {self.stream} got nothing in {SCAN_STALLS} fetches in a row "
                "with messages still pending"
            )
        return False
