"""Start-up refusal when durability is demanded but the JetStream deployment cannot give it.

JetStream fsyncs periodically by default (every 2 minutes): an acknowledged publish can be
lost on a power or OS failure, and an R1 stream is lost with its one node. With
``RHUMBATRON_REQUIRE_DURABLE_JETSTREAM=true`` (the cloud setting) start-up refuses unless the
streams have at least 3 replicas and the server runs with ``sync_interval: always``
(RELIABILITY F1). The server's setting is read from its monitoring endpoint's ``/varz``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from rhumbatron.core.settings import Settings
from rhumbatron.errors import UnsafeStorageError

__all__ = ["MIN_DURABLE_REPLICAS", "check_durability", "check_stream_replicas", "read_varz"]

MIN_DURABLE_REPLICAS = 3


def read_varz(monitor_url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """The ``/varz`` document of the nats-server at ``monitor_url``."""
    url = monitor_url.rstrip("/") + "/varz"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return dict(json.load(answer))
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise UnsafeStorageError(
            f"cannot read {url} to verify JetStream durability ({exc}); check "
            "RHUMBATRON_NATS_MONITOR_URL"
        ) from exc


def check_durability(settings: Settings, *, varz: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`UnsafeStorageError` naming the setting that breaks durability.

    Does nothing unless ``settings.require_durable_jetstream``. ``varz`` defaults to a read
    of ``settings.nats_monitor_url``.
    """
    if not settings.require_durable_jetstream:
        return
    if settings.stream_replicas < MIN_DURABLE_REPLICAS:
        raise UnsafeStorageError(
            f"RHUMBATRON_REQUIRE_DURABLE_JETSTREAM is set but RHUMBATRON_STREAM_REPLICAS="
            f"{settings.stream_replicas}; durable streams need at least {MIN_DURABLE_REPLICAS}"
        )
    if varz is None:
        if settings.nats_monitor_url is None:
            raise UnsafeStorageError(
                "RHUMBATRON_REQUIRE_DURABLE_JETSTREAM is set but RHUMBATRON_NATS_MONITOR_URL "
                "is not: the server's sync_interval cannot be verified"
            )
        varz = read_varz(settings.nats_monitor_url)
    config = (varz.get("jetstream") or {}).get("config") or {}
    server = varz.get("server_name", "?")
    if not config:
        raise UnsafeStorageError(f"nats-server {server} does not run JetStream")
    if not config.get("sync_always"):
        interval_s = (config.get("sync_interval") or 0) / 1e9
        raise UnsafeStorageError(
            f"nats-server {server} runs JetStream with sync_interval {interval_s:g}s, so an "
            "acknowledged publish can be lost on power failure; set `sync_interval: always` "
            "in its jetstream block"
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
