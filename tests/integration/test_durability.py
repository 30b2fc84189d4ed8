"""F1: start-up refuses a JetStream deployment that cannot give the durability demanded: too
few replicas, or a node that holds one and does not sync every write."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest

from rhumbatron.core.settings import load_settings
from rhumbatron.errors import ConfigurationError, UnsafeStorageError
from rhumbatron.messaging.connection import connect_nats
from rhumbatron.messaging.durability import (
    check_durability,
    check_replica_holders,
    check_stream_replicas,
    read_varz,
)
from rhumbatron.messaging.streams import ensure_streams
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration


def _monitor(server: NatsServerProcess) -> str:
    return f"http://127.0.0.1:{server.http_port}"


def test_durable_demand_with_single_replica_streams_is_refused(tmp_path: Path) -> None:
    # GIVEN durability demanded, but streams configured with one replica
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=1)
    # WHEN the check runs THEN it names the replicas setting
    with pytest.raises(UnsafeStorageError, match="RHUMBATRON_STREAM_REPLICAS=1"):
        check_durability(
            settings, varz_by_url={"n": {"jetstream": {"config": {"sync_always": True}}}}
        )


def test_server_with_periodic_fsync_is_refused_when_durability_is_demanded(
    nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    # GIVEN a real nats-server at its default sync_interval (2 minutes)
    settings = load_settings(
        state_dir=tmp_path,
        nats_url=nats_server.url,
        nats_monitor_urls=_monitor(nats_server),
        require_durable_jetstream=True,
        stream_replicas=3,
    )
    # WHEN start-up checks it THEN it is refused, naming sync_interval
    with pytest.raises(UnsafeStorageError, match=r"sync_interval 120s.*sync_interval: always"):
        check_durability(settings)


def test_server_with_sync_always_passes_the_durability_check(tmp_path: Path) -> None:
    # GIVEN a real nats-server with sync_interval: always
    server = NatsServerProcess(store_dir=tmp_path / "nats", sync_interval="always")
    server.start()
    try:
        settings = load_settings(
            state_dir=tmp_path,
            nats_monitor_urls=_monitor(server),
            require_durable_jetstream=True,
            stream_replicas=3,
        )
        # WHEN / THEN: no error, and the node is named as verified
        assert check_durability(settings) == {server.name}
    finally:
        server.stop()


def test_demanding_durability_without_a_monitor_url_is_refused(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    with pytest.raises(UnsafeStorageError) as refused:
        check_durability(settings)
    assert str(refused.value) == (
        "RHUMBATRON_REQUIRE_DURABLE_JETSTREAM is set but RHUMBATRON_NATS_MONITOR_URLS is not: "
        "the nodes' sync_interval cannot be verified"
    )


def test_a_server_without_jetstream_and_one_syncing_periodically_are_named(
    tmp_path: Path,
) -> None:
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    with pytest.raises(UnsafeStorageError) as plain:
        check_durability(settings, varz_by_url={"http://a": {"server_name": "n1", "jetstream": {}}})
    assert str(plain.value) == "nats-server n1 (http://a) does not run JetStream"
    periodic = {"server_name": "n2", "jetstream": {"config": {"sync_interval": 2_000_000_000}}}
    with pytest.raises(UnsafeStorageError) as refused:
        check_durability(settings, varz_by_url={"http://b": periodic})
    assert str(refused.value) == (
        "nats-server n2 (http://b) runs JetStream with sync_interval 2s, so an acknowledged "
        "publish can be lost on power failure; set `sync_interval: always` in its jetstream "
        "block"
    )
    with pytest.raises(UnsafeStorageError, match=r"^nats-server \? \(http://c\) does not run"):
        check_durability(settings, varz_by_url={"http://c": {}})


async def test_existing_single_replica_stream_is_refused_under_durability(
    nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    # GIVEN streams that exist with one replica (as a single-node deployment made them)
    plain = load_settings(state_dir=tmp_path, nats_url=nats_server.url)
    nc = await connect_nats(plain)
    try:
        await ensure_streams(nc.jetstream(), plain)
        info = await nc.jetstream().stream_info("EVENTS_03")
        demanding = load_settings(
            state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3
        )
        # WHEN the replica check sees them THEN it names the stream
        with pytest.raises(UnsafeStorageError, match=r"stream EVENTS_03 has 1 replica"):
            check_stream_replicas(demanding, {"EVENTS_03": info.config.num_replicas or 1})
    finally:
        await nc.close()


async def test_bootstrap_refuses_non_durable_server_before_touching_streams(
    nats_server: NatsServerProcess, tmp_path: Path
) -> None:
    settings = load_settings(
        state_dir=tmp_path,
        nats_url=nats_server.url,
        nats_monitor_urls=_monitor(nats_server),
        require_durable_jetstream=True,
        stream_replicas=3,
    )
    app = bootstrap(settings)
    try:
        with pytest.raises(UnsafeStorageError):
            await app.ensure_streams()
        nc = await connect_nats(settings)
        account = await nc.jetstream().account_info()
        assert account.streams == 0  # nothing was created
        await nc.close()
    finally:
        await app.close()


def test_retention_windows_that_do_not_nest_are_refused(tmp_path: Path) -> None:
    # A dedupe window longer than the stream keeps messages is a promise that cannot hold.
    with pytest.raises(ConfigurationError, match=r"duplicate_window_s=864000\.0"):
        load_settings(state_dir=tmp_path, duplicate_window_s=10 * 86_400)
    with pytest.raises(ConfigurationError, match="outbox_published_retention_days=1"):
        load_settings(state_dir=tmp_path, outbox_published_retention_days=1)


# -- reading /varz, and the replicas of streams that exist ------------------------------------


def test_the_monitor_url_may_end_with_a_slash(nats_server: NatsServerProcess) -> None:
    varz = read_varz(_monitor(nats_server) + "/")
    assert varz["server_id"] == nats_server.varz()["server_id"]


def test_an_unreachable_monitor_url_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(UnsafeStorageError) as refused:
        read_varz(url)
    message = str(refused.value)
    assert message.startswith(f"cannot read {url}/varz to verify JetStream durability (")
    assert message.endswith("); check RHUMBATRON_NATS_MONITOR_URLS")


def test_a_monitor_that_never_answers_is_given_up_on_within_its_timeout() -> None:
    # GIVEN a port that accepts connections and never answers
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        # WHEN /varz is read with a 0.2 s timeout, THEN it is refused, not waited on forever
        started = time.monotonic()
        with pytest.raises(UnsafeStorageError, match="timed out"):
            read_varz(url, timeout_s=0.2)
        assert time.monotonic() - started < 5
        # AND the start-up check waits its default 2 s for a node, no longer
        started = time.monotonic()
        with pytest.raises(UnsafeStorageError, match="timed out"):
            read_varz(url)
        assert 1.9 <= time.monotonic() - started < 2.9


def test_streams_with_exactly_three_replicas_pass_and_fewer_are_refused(tmp_path: Path) -> None:
    demanding = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    check_stream_replicas(demanding, {"EVENTS_00": 3, "COMMANDS": 5})
    with pytest.raises(UnsafeStorageError) as refused:
        check_stream_replicas(demanding, {"EVENTS_00": 3, "EVENTS_01": 2})
    assert str(refused.value) == (
        "stream EVENTS_01 has 2 replica(s); durability needs 3 (num_replicas): update the "
        "stream, or unset RHUMBATRON_REQUIRE_DURABLE_JETSTREAM"
    )
    # not demanded: nothing is checked
    check_stream_replicas(load_settings(state_dir=tmp_path), {"EVENTS_01": 1})


# -- every node of a cluster ------------------------------------------------------------------


def _node(name: str, *, sync_always: bool = True) -> dict[str, object]:
    config = {"sync_always": True} if sync_always else {"sync_interval": 120_000_000_000}
    return {"server_name": name, "jetstream": {"config": config}}


def test_one_node_of_three_that_syncs_periodically_is_refused_by_name(tmp_path: Path) -> None:
    # GIVEN a cluster where only the first node syncs every write
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    nodes = {
        "http://a:8222": _node("n1"),
        "http://b:8222": _node("n2"),
        "http://c:8222": _node("n3", sync_always=False),
    }
    # WHEN the check reads every node, THEN the one that does not is named, with its URL
    with pytest.raises(UnsafeStorageError, match=r"^nats-server n3 \(http://c:8222\) runs"):
        check_durability(settings, varz_by_url=nodes)


def test_a_node_that_does_not_answer_is_passed_over_only_while_a_majority_is_verified(
    tmp_path: Path,
) -> None:
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    down = UnsafeStorageError("cannot read http://c:8222/varz (refused)")
    # GIVEN two of three nodes verified and one down: it passes, naming the two verified
    verified = check_durability(
        settings,
        varz_by_url={
            "http://a:8222": _node("n1"),
            "http://b:8222": _node("n2"),
            "http://c:8222": down,
        },
    )
    assert verified == {"n1", "n2"}
    # GIVEN one of three verified: refused, saying why each other node was not read
    down_b = UnsafeStorageError("cannot read http://b:8222/varz (refused)")
    with pytest.raises(UnsafeStorageError) as refused:
        check_durability(
            settings,
            varz_by_url={
                "http://a:8222": _node("n1"),
                "http://b:8222": down_b,
                "http://c:8222": down,
            },
        )
    assert str(refused.value) == (
        "only 1 of the 3 nodes in RHUMBATRON_NATS_MONITOR_URLS could be verified, and a "
        "majority must be: cannot read http://b:8222/varz (refused); "
        "cannot read http://c:8222/varz (refused)"
    )
    # GIVEN one of two: not a majority either
    with pytest.raises(UnsafeStorageError, match="only 1 of the 2 nodes"):
        check_durability(
            settings, varz_by_url={"http://a:8222": _node("n1"), "http://b:8222": down}
        )


def test_a_node_down_first_in_the_list_does_not_stop_the_others_being_verified(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    down = UnsafeStorageError("cannot read http://a:8222/varz (refused)")
    # GIVEN the first node listed down and the two after it syncing every write
    verified = check_durability(
        settings,
        varz_by_url={
            "http://a:8222": down,
            "http://b:8222": _node("n2"),
            "http://c:8222": _node("n3"),
        },
    )
    # THEN the two after it are verified, and the check passes
    assert verified == {"n2", "n3"}
    # AND the node passed over is named in a warning, with why it was not read
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "rhumbatron.messaging.durability" and r.levelno == logging.WARNING
    ]
    assert warnings == [
        "durability check passed over a node that did not answer: "
        "cannot read http://a:8222/varz (refused)"
    ]


def test_the_one_node_listed_down_is_refused_with_the_reason_it_was_not_read(
    tmp_path: Path,
) -> None:
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    down = UnsafeStorageError("cannot read http://a:8222/varz (refused)")
    # GIVEN one node listed, and it does not answer
    with pytest.raises(UnsafeStorageError) as refused:
        check_durability(settings, varz_by_url={"http://a:8222": down})
    # THEN the refusal is that node's own: why it could not be read
    assert refused.value is down


def test_a_live_replica_on_a_node_not_verified_is_refused(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    # replicas on verified nodes pass
    check_replica_holders(settings, {"n1", "n2", "n3"}, {"EVENTS_00": {"n1", "n2", "n3"}})
    # a replica on a node the monitor URLs do not list is refused, naming stream and node
    with pytest.raises(UnsafeStorageError) as refused:
        check_replica_holders(
            settings, {"n1", "n2"}, {"EVENTS_00": {"n1", "n2"}, "COMMANDS": {"n1", "n4"}}
        )
    assert str(refused.value) == (
        "stream COMMANDS has a replica on n4, whose sync_interval was not verified: list every "
        "node's monitoring URL in RHUMBATRON_NATS_MONITOR_URLS"
    )
    # every unverified node is named, in order
    with pytest.raises(UnsafeStorageError, match=r"^stream EVENTS_00 has a replica on n4, n5, "):
        check_replica_holders(settings, {"n1"}, {"EVENTS_00": {"n5", "n1", "n4"}})
    # not demanded: nothing is checked
    check_replica_holders(load_settings(state_dir=tmp_path), set(), {"EVENTS_00": {"n9"}})


def test_a_node_that_reports_no_sync_interval_is_refused_as_syncing_every_0s(
    tmp_path: Path,
) -> None:
    # A /varz whose JetStream config names no sync_interval (and no sync_always) is not
    # durable: the refusal reads its interval as 0 s, never as some other default.
    settings = load_settings(state_dir=tmp_path, require_durable_jetstream=True, stream_replicas=3)
    silent = {"server_name": "n9", "jetstream": {"config": {"max_memory": 1}}}
    with pytest.raises(UnsafeStorageError) as refused:
        check_durability(settings, varz_by_url={"http://n9": silent})
    assert str(refused.value).startswith(
        "nats-server n9 (http://n9) runs JetStream with sync_interval 0s, so"
    )
