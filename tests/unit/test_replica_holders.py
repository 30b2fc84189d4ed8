"""Which nodes hold a live replica of a stream, from its ``StreamInfo``
(``durability.online_replica_holders``): the nodes whose durability must be verified."""

from __future__ import annotations

from nats.js.api import ClusterInfo, PeerInfo, StreamConfig, StreamInfo, StreamState

from rhumbatron.messaging.durability import online_replica_holders


def info(cluster: ClusterInfo | None) -> StreamInfo:
    state = StreamState(messages=0, bytes=0, first_seq=0, last_seq=0, consumer_count=0)
    return StreamInfo(config=StreamConfig(name="EVENTS_00"), state=state, cluster=cluster)


def test_the_leader_and_each_peer_not_offline_hold_a_live_replica() -> None:
    peers = [
        PeerInfo(name="n2", current=True, offline=False),
        PeerInfo(name="n3", current=False, offline=True),  # offline: holds nothing live
        PeerInfo(name="n4"),  # offline unknown: counted as live
        PeerInfo(name="", offline=False),  # no name: nobody to name
    ]
    assert online_replica_holders(info(ClusterInfo(leader="n1", replicas=peers))) == {
        "n1",
        "n2",
        "n4",
    }


def test_a_stream_without_a_leader_or_a_cluster_names_only_its_live_peers() -> None:
    peers = [PeerInfo(name="n2", offline=False)]
    assert online_replica_holders(info(ClusterInfo(leader=None, replicas=peers))) == {"n2"}
    assert online_replica_holders(info(ClusterInfo(leader="n1", replicas=None))) == {"n1"}
    assert online_replica_holders(info(None)) == set()
