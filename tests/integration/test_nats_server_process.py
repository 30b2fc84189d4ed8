"""The embedded nats-server: a port taken between finding it free and binding it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from rhumbatron.errors import LocalStackError
from rhumbatron_dev.local.nats_server import NatsServerProcess, free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_first_start_on_a_taken_port_moves_to_free_ports(tmp_path: Path, taken_port: int) -> None:
    # GIVEN a standalone server whose port another socket took first
    server = NatsServerProcess(store_dir=tmp_path / "nats", port=taken_port)

    # WHEN it starts
    server.start()
    try:
        # THEN it runs, on another port
        assert server.running
        assert server.port != taken_port
    finally:
        server.stop()


def test_a_restart_keeps_its_port_and_fails_when_the_port_is_taken(tmp_path: Path) -> None:
    # GIVEN a running server, stopped, and its port taken while it was down
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    port = server.port
    server.stop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()

        # WHEN it restarts, THEN it fails on its own port (the fault tests restart on purpose
        # on the same port and store)
        with pytest.raises(LocalStackError, match=str(port)):
            server.restart(timeout_s=5)
    assert server.port == port


def test_a_cluster_node_keeps_the_ports_its_peers_know(tmp_path: Path, taken_port: int) -> None:
    # GIVEN a cluster node whose client port was taken
    node = NatsServerProcess(
        store_dir=tmp_path / "node",
        port=taken_port,
        server_name="n0",
        cluster_name="c",
        cluster_port=free_port(),
    )

    # WHEN it starts, THEN it fails rather than move
    with pytest.raises(LocalStackError, match=str(taken_port)):
        node.start(timeout_s=5)
    assert node.port == taken_port
