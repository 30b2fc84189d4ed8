"""Reconciliation reads each replica's copy (issue #18), on a 3-node cluster: every node's
counts from its own monitor, with the stream's leader, a silent node named and passed over;
and the scan's headers-only R1 consumer, made again until JetStream places it on the wanted
node, a node that holds no copy of the stream refused by name after the tries, with every
misplaced consumer deleted on the way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.js.client import JetStreamContext

from rhumbatron.errors import MessagingError
from rhumbatron.messaging.log_state import (
    PLACEMENT_TRIES,
    ReplicaState,
    _consumer_on,
    read_replica_states,
    read_stream_ids,
)
from rhumbatron_dev.local.nats_server import NatsServerProcess, start_cluster
from unresponsive_monitors import silent_monitor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SINCE = datetime.now(UTC) - timedelta(minutes=1)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[NatsServerProcess]]:
    nodes = start_cluster(tmp_path, cluster_name="rhumbatron-scan")
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
async def nc(cluster: list[NatsServerProcess]) -> AsyncIterator[NATS]:
    client: NATS = await nats.connect([node.url for node in cluster])
    yield client
    await client.close()


async def stream_on(js: JetStreamContext, name: str, replicas: int) -> list[str]:
    """A stream of ``replicas`` copies once the cluster takes it; the nodes that hold it."""
    deadline = time.monotonic() + 30
    while True:
        try:
            info = await js.add_stream(name=name, subjects=[f"{name}.>"], num_replicas=replicas)
            break
        except Exception:  # no meta leader elected yet: JetStream answers with errors
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)  # polling the cluster coming up, with a deadline
    while True:
        try:
            await js.publish(f"{name}.a", b"1", headers={"Nats-Msg-Id": f"{name}-1"})
            break
        except NoRespondersError:  # the new stream's interest has not reached this node yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)  # polling the route's interest, with a deadline
    assert info.cluster is not None
    followers = [str(replica.name) for replica in info.cluster.replicas or ()]
    return [str(info.cluster.leader), *followers]


async def scan_consumers(
    js: JetStreamContext, stream: str, expected: list[str], within_s: float = 10.0
) -> list[str]:
    """The scan consumers of ``stream``, read again until they are ``expected`` or
    ``within_s`` is up: a cluster lists the consumers whose nodes answered its gather in
    time, and under load it can leave out one made a moment before."""
    deadline = time.monotonic() + within_s
    while True:
        found = [c.name for c in await js.consumers_info(stream) if c.name.startswith("reconcile-")]
        if found == expected or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)  # polling the cluster's listing, with a deadline


async def test_the_scans_consumer_lands_on_each_wanted_replica_in_an_odd_count_of_requests(
    nc: NATS,
) -> None:
    js = nc.jetstream()
    # GIVEN a stream with a copy on each of the three nodes
    holders = await stream_on(js, "PLACED", 3)
    assert sorted(holders) == ["node0", "node1", "node2"]
    for node in holders * 2:  # a placement that ignored the node would miss some of six
        # WHEN the scan's consumer is asked for on that node
        name, requests = await _consumer_on(js, "PLACED", SINCE, node)
        # THEN it is there (JetStream places an R1 consumer on any replica: a misplaced one
        #   was deleted and made again), each try costing a create and a delete but the last
        info = await js.consumer_info("PLACED", name)
        assert info.cluster is not None and info.cluster.leader == node
        assert isinstance(requests, int) and requests % 2 == 1 and requests <= 2 * PLACEMENT_TRIES
        # AND it is the only scan consumer left
        assert await scan_consumers(js, "PLACED", [name]) == [name]
        await js.delete_consumer("PLACED", name)
    # AND a scan of each node's copy reads its one event there, and says where it read
    for node in holders:
        ids = await read_stream_ids(js, "PLACED", since=SINCE, on_node=node)
        assert (ids.node, ids.sequence_of) == (node, {"PLACED-1": 1})


async def test_a_node_without_a_copy_is_refused_by_name_and_no_consumer_is_left(
    nc: NATS,
) -> None:
    js = nc.jetstream()
    # GIVEN a stream with one copy, and a node that holds none of it
    (holder,) = await stream_on(js, "ALONE", 1)
    elsewhere = next(node for node in ("node0", "node1", "node2") if node != holder)
    # WHEN its scan's consumer is asked for on that node
    sent_before = nc.stats["out_msgs"]
    with pytest.raises(MessagingError) as refused:
        await _consumer_on(js, "ALONE", SINCE, elsewhere)
    # THEN each of the tries landed on the one copy and was deleted: two API requests a try
    assert nc.stats["out_msgs"] - sent_before == 2 * PLACEMENT_TRIES
    # AND the scan is refused naming the stream, the node and the tries
    assert str(refused.value) == (
        f"JetStream placed no scan consumer of ALONE on {elsewhere} in {PLACEMENT_TRIES} tries: "
        "is it a replica of the stream?"
    )
    assert await scan_consumers(js, "ALONE", []) == []
    # AND a scan of that node's copy is refused the same way, not read from another node
    with pytest.raises(MessagingError, match=f"placed no scan consumer of ALONE on {elsewhere}"):
        await read_stream_ids(js, "ALONE", since=SINCE, on_node=elsewhere)
    # AND asked for on its holder, it lands at the first try
    name, requests = await _consumer_on(js, "ALONE", SINCE, holder)
    assert requests == 1
    await js.delete_consumer("ALONE", name)


async def test_each_nodes_copy_is_read_from_its_own_monitor_with_the_streams_leader(
    nc: NATS, cluster: list[NatsServerProcess]
) -> None:
    # GIVEN a stream with a copy on each node: three messages, the second deleted
    js = nc.jetstream()
    leader, *_ = await stream_on(js, "COPIES", 3)
    await js.publish("COPIES.b", b"2")
    await js.publish("COPIES.c", b"3")
    await js.delete_msg("COPIES", 2)
    monitors = [f"http://127.0.0.1:{node.http_port}" for node in cluster]
    with silent_monitor() as silent:
        # WHEN every node's monitor is read, with one that never answers listed first (until
        #   the followers have applied the delete the leader did a moment ago)
        deadline = time.monotonic() + 20
        while True:
            states, unread = await asyncio.wait_for(
                asyncio.to_thread(
                    read_replica_states, [silent, *monitors], ["COPIES", "OTHER"], timeout_s=0.5
                ),
                10,  # a read that waits on the silent node for ever fails here
            )
            if [s.messages for s in states] == [2, 2, 2] or time.monotonic() > deadline:
                break
    # THEN each copy is named by its node, with its counts and the stream's leader
    assert sorted(states, key=lambda state: state.node) == [
        ReplicaState("COPIES", node, 2, 1, 3, 1, leader) for node in ("node0", "node1", "node2")
    ]
    assert [state.is_leader for state in states].count(True) == 1
    # AND the silent node is named with why, and did not keep the others from being read
    assert len(unread) == 1 and unread[0].startswith(f"{silent} (")
