"""Every ``rhumbatron`` command ends a failure it cannot help in one line on stderr and a
documented exit status, never a traceback: NATS down (4), durability refused (5), a setting
that cannot work (1). Run as a user runs it: a fresh interpreter, the settings in its
environment, stderr read whole (nats-py's own logging would print there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rhumbatron.cli import EXIT_ERROR, EXIT_UNAVAILABLE, EXIT_UNSAFE
from rhumbatron_dev.local.nats_server import NatsServerProcess, free_port

pytestmark = pytest.mark.integration


def _rhumbatron(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    clean |= {"RHUMBATRON_STATE_DIR": str(tmp_path / "state"), **env}
    return subprocess.run(
        [sys.executable, "-m", "rhumbatron.cli", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", [("streams",), ("views", "rebuild")])
def test_with_nats_down_a_command_says_so_in_one_line_and_exits_4(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    nowhere = f"nats://127.0.0.1:{free_port()}"
    done = _rhumbatron(
        tmp_path, *command, RHUMBATRON_NATS_URL=nowhere, RHUMBATRON_NATS_CONNECT_TIMEOUT_S="0.2"
    )
    assert done.returncode == EXIT_UNAVAILABLE
    assert done.stderr.splitlines() == [
        f"rhumbatron {' '.join(command)}: no NATS server answered at {nowhere} within 0.4 s "
        "(TimeoutError); check RHUMBATRON_NATS_URL and that nats-server is running"
    ]


def test_a_durability_refusal_is_one_line_naming_the_node_and_exit_5(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    monitor = f"http://127.0.0.1:{nats_server.http_port}"
    done = _rhumbatron(
        tmp_path,
        "streams",
        RHUMBATRON_NATS_URL=nats_server.url,
        RHUMBATRON_NATS_MONITOR_URLS=monitor,
        RHUMBATRON_REQUIRE_DURABLE_JETSTREAM="true",
        RHUMBATRON_STREAM_REPLICAS="3",
    )
    assert done.returncode == EXIT_UNSAFE
    [line] = done.stderr.splitlines()
    assert line.startswith(
        f"rhumbatron streams: nats-server {nats_server.name} ({monitor}) runs JetStream with "
        "sync_interval 120s"
    )


def test_a_setting_that_cannot_work_is_one_line_naming_it_and_exit_1(tmp_path: Path) -> None:
    done = _rhumbatron(tmp_path, "streams", RHUMBATRON_STREAM_REPLICAS="9")
    assert done.returncode == EXIT_ERROR
    assert done.stderr.splitlines() == [
        "rhumbatron streams: invalid settings: RHUMBATRON_STREAM_REPLICAS='9': Input should be "
        "less than or equal to 5"
    ]


def test_a_reader_that_goes_away_stops_the_command_without_a_traceback(tmp_path: Path) -> None:
    # GIVEN a command printing a long document into a pipe whose reader reads one byte
    command = [str(Path(sys.executable).with_name("rhumbatron")), "openapi"]
    env = {**os.environ, "RHUMBATRON_STATE_DIR": str(tmp_path / "state")}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    # WHEN the reader goes away after its first byte
    assert process.stdout.read(1) == b"{"
    process.stdout.close()
    errors = process.stderr.read().decode()
    # THEN the command stops as a shell reports SIGPIPE, and says nothing
    assert process.wait(timeout=60) == 141
    assert "Traceback" not in errors and "BrokenPipe" not in errors, errors
