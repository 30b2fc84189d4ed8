"""Start-up refusal when durability is demanded but the JetStream deployment cannot give it.

JetStream fsyncs periodically by default (every 2 minutes): an acknowledged publish can be
lost on a power or OS failure, and an R1 stream is lost with its one node. With
``RHUMBATRON_REQUIRE_DURABLE_JETSTREAM=true`` (the cloud setting) start-up refuses unless the
streams have at least 3 replicas and every node that holds one runs with
``sync_interval: always`` (RELIABILITY F1). A cluster where only one node syncs every write
still loses acknowledged events when that node is not among the quorum that acked them, so
each node's setting is read from its own monitoring endpoint's ``/varz``
(``RHUMBATRON_NATS_MONITOR_URLS``, one URL per node).

A node whose ``/varz`` cannot be read (it is down) is passed over with a warning while a
majority of the listed nodes is verified: refusing then would turn one node's restart into
an outage of every function's cold start. A node that answers and does not sync every write
is refused, and so is any stream replica on a node that was not verified (not listed, or not
read) unless JetStream reports that replica offline.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rhumbatron.core.settings import Settings
from rhumbatron.errors import UnsafeStorageError

if TYPE_CHECKING:
    from nats.js.api import StreamInfo

__all__ = [
    "MIN_DURABLE_REPLICAS",
    "check_durability",
    "check_replica_holders",
    "check_stream_replicas",
    "online_replica_holders",
    "read_varz",
]

MIN_DURABLE_REPLICAS = 3

_log = logging.getLogger(__name__)


def read_varz(monitor_url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """The ``/varz`` document of the nats-server at ``monitor_url``."""
    url = monitor_url.rstrip("/") + "/varz"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return dict(json.load(answer))
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise UnsafeStorageError(
            f"cannot read {url} to verify JetStream durability ({exc}); check "
            "RHUMBATRON_NATS_MONITOR_URLS"
        ) from exc


def check_durability(
    settings: Settings,
    *,
    varz_by_url: Mapping[str, Mapping[str, Any] | UnsafeStorageError] | None = None,
) -> frozenset[str]:
    """Raise :class:`UnsafeStorageError` naming the setting or the node that breaks
    durability; return the names of the nodes verified (empty when not demanded).

    ``varz_by_url`` is each node's ``/varz`` (or why it could not be read); by default each
    URL of ``settings.nats_monitor_urls`` is read.
    """
    if not settings.require_durable_jetstream:
        return frozenset()
    if settings.stream_replicas < MIN_DURABLE_REPLICAS:
        raise UnsafeStorageError(
            f"RHUMBATRON_REQUIRE_DURABLE_JETSTREAM is set but RHUMBATRON_STREAM_REPLICAS="
            f"{settings.stream_replicas}; durable streams need at least {MIN_DURABLE_REPLICAS}"
        )
    if varz_by_url is None:
        urls = settings.monitor_urls
        if not urls:
            raise UnsafeStorageError(
                "RHUMBATRON_REQUIRE_DURABLE_JETSTREAM is set but RHUMBATRON_NATS_MONITOR_URLS "
                "is not: the nodes' sync_interval cannot be verified"
            )
        varz_by_url = {url: _read_or_error(url) for url in urls}
    verified: set[str] = set()
    unread: list[UnsafeStorageError] = []
    for url, varz in varz_by_url.items():
        if isinstance(varz, UnsafeStorageError):
            unread.append(varz)
            continue
        verified.add(_check_node(varz, url))
    if unread and len(verified) * 2 <= len(varz_by_url):
        if len(varz_by_url) == 1:
            raise unread[0]
        raise UnsafeStorageError(
            f"only {len(verified)} of the {len(varz_by_url)} nodes in "
            "RHUMBATRON_NATS_MONITOR_URLS could be verified, and a majority must be: "
            + "; ".join(str(error) for error in unread)
        )
    for error in unread:
        _log.warning("durability check passed over a node that did not answer: %s", error)
    return frozenset(verified)


def _read_or_error(url: str) -> dict[str, Any] | UnsafeStorageError:
    try:
        return read_varz(url)
    except UnsafeStorageError as exc:
        return exc


def _check_node(varz: Mapping[str, Any], url: str) -> str:
    """The node's name, once its ``/varz`` shows JetStream syncing every write."""
    config = (varz.get("jetstream") or {}).get("config") or {}
    server = varz.get("server_name", "?")
    if not config:
        raise UnsafeStorageError(f"nats-server {server} ({url}) does not run JetStream")
    if not config.get("sync_always"):
        interval_s = (config.get("sync_interval") or 0) / 1e9
        raise UnsafeStorageError(
            f"nats-server {server} ({url}) runs JetStream with sync_interval {interval_s:g}s, "
            "so an acknowledged publish can be lost on power failure; set "
            "`sync_interval: always` in its jetstream block"
        )
    return str(server)


def online_replica_holders(info: StreamInfo) -> set[str]:
    """The nodes holding a live replica of a stream: its leader, and each peer JetStream
    does not report offline."""
    cluster = info.cluster
    if cluster is None:
        return set()
    holders = {cluster.leader} if cluster.leader else set()
    holders |= {peer.name for peer in cluster.replicas or () if peer.name and not peer.offline}
    return holders


def check_replica_holders(
    settings: Settings, verified: Iterable[str], holders: Mapping[str, Iterable[str]]
) -> None:
    """Refuse a stream with a replica (online: its leader, or a peer JetStream does not
    report offline) on a node whose durability was not verified."""
    if not settings.require_durable_jetstream:
        return
    known = set(verified)
    for stream, nodes in holders.items():
        unverified = sorted(set(nodes) - known)
        if unverified:
            raise UnsafeStorageError(
                f"stream {stream} has a replica on {', '.join(unverified)}, whose "
                "sync_interval was not verified: list every node's monitoring URL in "
                "RHUMBATRON_NATS_MONITOR_URLS"
            )


def check_stream_replicas(settings: Settings, stream_replicas: Mapping[str, int]) -> None:
    """Refuse existing streams with fewer than 3 replicas when durability is demanded."""
    if not settings.require_durable_jetstream:
        return
    for name, replicas in stream_replicas.items():
        if replicas < MIN_DURABLE_REPLICAS:
            raise UnsafeStorageError(
                f"stream {name} has {replicas} replica(s); durability needs "
                f"{MIN_DURABLE_REPLICAS} (num_replicas): update the stream, or unset "
                "RHUMBATRON_REQUIRE_DURABLE_JETSTREAM"
            )
