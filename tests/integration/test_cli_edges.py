"""The ``rhumbatron`` command at its edges, run as a user runs it (a fresh interpreter, the
settings in its environment, stderr read whole): NATS down is one line and a non-zero exit
status for every command that needs NATS, never a traceback; a reader that goes away after
one line stops the command quietly; a mistyped option shows the subcommand's own usage. And
the long operations report real progress to the callback the bar is drawn from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rhumbatron.cli import EXIT_READER_GONE, EXIT_UNAVAILABLE, EXIT_UNSAFE
from rhumbatron.runtime.bootstrap import Rhumbatron
from stack_processes import IGNORING_SIGINT, port_open

pytestmark = pytest.mark.integration

SHARED = Path(__file__).resolve().parents[2] / "shared"
NOWHERE = "nats://127.0.0.1:1"


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    pythonpath = os.pathsep.join(filter(None, [str(SHARED), env.get("PYTHONPATH")]))
    return (
        env | {"PYTHONPATH": pythonpath, "RHUMBATRON_STATE_DIR": str(tmp_path / "state")} | settings
    )


def _rhumbatron(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rhumbatron.cli", *args],
        env=_env(tmp_path, **settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("streams",),
        ("streams", "--json"),
        ("views", "rebuild", "--json"),
        ("reconcile",),
        ("reconcile", "--json"),
        (
            "replay",
            "--source",
            "stream",
            "--subscription",
            "causal-router",
            "--stream",
            "0",
            "--to-seq",
            "1",
        ),
    ],
    ids=" ".join,
)
def test_with_nats_down_a_command_says_what_failed_in_one_line(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    # GIVEN a NATS URL where nothing listens
    # WHEN a command that needs NATS runs
    done = _rhumbatron(
        tmp_path, *args, RHUMBATRON_NATS_URL=NOWHERE, RHUMBATRON_NATS_CONNECT_TIMEOUT_S="0.2"
    )
    # THEN one line on stderr names the command, the server and what to check; no traceback
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    [line] = done.stderr.splitlines()
    command = " ".join(a for a in args[:2] if not a.startswith("-"))
    assert line.startswith(f"rhumbatron {command}: no NATS server answered at {NOWHERE}"), line
    assert "RHUMBATRON_NATS_URL" in line
    assert "Traceback" not in done.stderr


def test_a_reader_gone_after_one_line_stops_the_command_quietly(tmp_path: Path) -> None:
    # GIVEN a command printing a long document (far more than a pipe holds) into a pipe
    process = subprocess.Popen(
        [sys.executable, "-m", "rhumbatron.cli", "openapi", "--json"],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    # WHEN its reader reads one line and goes away, as `| head -1` does
    assert process.stdout.readline() == b"{\n"
    process.stdout.close()
    errors = process.stderr.read().decode()
    # THEN the command stops as a shell reports SIGPIPE, and says nothing
    assert process.wait(timeout=60) == EXIT_READER_GONE
    assert errors == ""


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("dead-letters list", ("--jsn",)),
        ("reconcile", ("--stream", "9")),
        ("schedules show", ("sch_1", "--tenantt", "a")),
    ],
)
def test_a_mistyped_option_shows_the_subcommands_usage_and_the_error(
    tmp_path: Path, command: str, args: tuple[str, ...]
) -> None:
    # WHEN a subcommand is given an option it does not have, or a value out of range
    done = _rhumbatron(tmp_path, *command.split(), *args)
    # THEN it exits 2 with that subcommand's usage (not the top level's) and what was wrong
    assert done.returncode == 2
    assert done.stderr.startswith(f"Usage: rhumbatron {command} [OPTIONS]"), done.stderr
    assert f"Try 'rhumbatron {command} --help' for help." in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


async def test_the_reconciliation_reports_each_stream_checked_to_its_progress_callback(
    app: Rhumbatron,
) -> None:
    # GIVEN a deployment whose streams exist, and a progress callback
    heard: list[tuple[int, int | None, str]] = []

    def progress(done: int, total: int | None, note: str = "") -> None:
        heard.append((done, total, note))

    # WHEN the log is reconciled
    report = await app.reconcile(progress=progress)

    # THEN the callback heard each stream as it was checked, the counts rising to the whole
    assert [(done, total) for done, total, _ in heard] == [(i, 8) for i in range(1, 9)]
    assert [note for _, _, note in heard] == [f"{s.stream} checked" for s in report.streams]


@pytest.mark.parametrize(
    "args",
    [("dead-letters", "list"), ("subscriptions", "list"), ("schedules", "list")],
)
def test_a_durability_refusal_exits_five_whichever_command_meets_it(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    # GIVEN storage settings that would lose data (WAL on a network filesystem)
    done = _rhumbatron(
        tmp_path,
        *args,
        RHUMBATRON_NETWORK_FILESYSTEM="true",
        RHUMBATRON_JOURNAL_MODE="WAL",
        RHUMBATRON_NATS_URL=NOWHERE,
    )
    # THEN every command refuses with the one status the CLI documents for it, naming itself
    assert done.returncode == EXIT_UNSAFE, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"rhumbatron {args[0]}")
    assert "RHUMBATRON_JOURNAL_MODE=WAL" in done.stderr


def test_dry_run_without_repair_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    done = _rhumbatron(tmp_path, "reconcile", "--dry-run", RHUMBATRON_NATS_URL=NOWHERE)
    assert done.returncode == 2
    assert "--dry-run goes with --repair" in done.stderr
    assert "Usage: rhumbatron reconcile" in done.stderr


@pytest.mark.parametrize("launcher", [(), ("-c", IGNORING_SIGINT)], ids=["plain", "bg-job"])
def test_up_stops_its_whole_stack_on_sigterm(tmp_path: Path, launcher: tuple[str, ...]) -> None:
    # GIVEN `rhumbatron up` running (started as a shell starts it, or as a background job,
    #   whose SIGINT is ignored), its stack up
    process = subprocess.Popen(
        [sys.executable, *launcher, "-m", "rhumbatron.cli", "up", "--root", str(tmp_path / "up")],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner: list[str] = []
        for line in process.stdout:
            banner.append(line)
            if "Ctrl-C stops" in line:
                break
        nats_url = next(line for line in banner if "NATS nats://" in line).split()[1]
        assert port_open(nats_url), banner
        # WHEN a process manager (or kill, or `timeout`) sends SIGTERM
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    # THEN it stops as for Ctrl-C: cleanly, saying so, its nats-server gone with it
    assert process.returncode == 0, err
    assert err.rstrip().endswith("rhumbatron up: stopped"), err
    assert "Traceback" not in err
    assert not port_open(nats_url)
