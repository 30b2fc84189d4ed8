"""The ``rhumbatron`` command's shape, walked in the click tree typer builds from the app:
every command and every option and argument says what it is for, every command's failures
go through the one guard, and every command that prints data takes ``--json`` and prints
JSON with it. The progress bar shows only on a terminal and never with ``--json``."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from rhumbatron.cli import app, main
from rhumbatron.cli.guard import GuardedCommand
from rhumbatron.cli.progress import progress_on_stderr

#: The commands that print data, and so take ``--json``.
DATA_COMMANDS = {
    "outbox",
    "streams",
    "dead-letters list",
    "dead-letters show",
    "dead-letters retry",
    "dead-letters dismiss",
    "kinds",
    "replay",
    "views rebuild",
    "capacity",
    "doctor",
    "inspect",
    "reconcile",
    "subscriptions list",
    "subscriptions create",
    "subscriptions show",
    "subscriptions enable",
    "subscriptions disable",
    "subscriptions delete",
    "subscriptions deliveries",
    "subscriptions replay-skipped",
    "schedules list",
    "schedules create",
    "schedules show",
    "schedules enable",
    "schedules disable",
    "schedules delete",
    "openapi",
}
#: The commands that serve or launch, printing no data of their own: servers until Ctrl-C
#: (api, mcp), and the development package's own programs (demo, up, invoke).
OTHER_COMMANDS = {"demo", "up", "api", "mcp", "invoke"}


def _commands() -> dict[str, Any]:
    """Every command of the app by its path (``dead-letters list``), groups included."""
    found: dict[str, Any] = {}

    def walk(command: Any, path: str) -> None:
        found[path] = command
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return found


def _leaves() -> dict[str, Any]:
    return {p: c for p, c in _commands().items() if p and not hasattr(c, "commands")}


def test_every_command_says_what_it_does() -> None:
    # GIVEN every command and group of the app, the root too
    commands = _commands()
    # THEN each has a help text
    assert [
        path or "rhumbatron" for path, c in commands.items() if not (c.help or "").strip()
    ] == []


def test_every_option_and_argument_says_what_it_is_for() -> None:
    # GIVEN every parameter of every command, the root's too
    missing = [
        f"{path or 'rhumbatron'} {param.name}"
        for path, command in _commands().items()
        for param in command.params
        if not (getattr(param, "help", None) or "").strip()
    ]
    # THEN none is without its help
    assert missing == []


def test_every_command_is_guarded_and_classified() -> None:
    # GIVEN the app's commands
    leaves = _leaves()
    # THEN each ends its failures through the guard, and each is known as printing data or not
    assert [p for p, c in leaves.items() if not isinstance(c, GuardedCommand)] == []
    assert set(leaves) == DATA_COMMANDS | OTHER_COMMANDS


def test_every_command_that_prints_data_takes_json() -> None:
    leaves = _leaves()
    without = [
        p for p in sorted(DATA_COMMANDS) if not any("--json" in q.opts for q in leaves[p].params)
    ]
    assert without == []


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty local state; NATS nowhere, so the commands below must not need it."""
    for name in [n for n in os.environ if n.startswith("RHUMBATRON_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RHUMBATRON_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("RHUMBATRON_NATS_CONNECT_TIMEOUT_S", "0.2")
    (tmp_path / "state").mkdir()
    return tmp_path / "state"


@pytest.mark.parametrize(
    "argv",
    [
        ["kinds", "--json"],
        ["inspect", "--json"],
        ["inspect", "--by-file", "--json"],
        ["outbox", "status", "--json"],
        ["outbox", "requeue", "--json"],
        ["dead-letters", "list", "--json"],
        ["subscriptions", "list", "--json"],
        ["schedules", "list", "--json"],
        ["capacity", "--json"],
        ["openapi", "--json"],
    ],
    ids=" ".join,
)
def test_a_data_command_with_json_prints_json_only(
    argv: list[str], state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an empty local state
    # WHEN the command runs with --json
    status = main(argv)
    # THEN it succeeds and its whole output is one JSON document
    out = capsys.readouterr().out
    assert status == 0
    json.loads(out)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> _Terminal:
    """stderr on a terminal, from here on (set in the test: pytest sets its own capture
    again between a fixture and the test's body)."""
    stream = _Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def test_the_progress_bar_is_drawn_on_a_terminal_from_the_operations_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN stderr on a terminal
    terminal = _on_a_terminal(monkeypatch)
    # WHEN an operation reports its steps
    with progress_on_stderr("rebuilding views", json_output=False) as progress:
        assert progress is not None
        for done in range(1, 4):
            progress(done, 3, f"EVENTS_0{done} rebuilt")
    # THEN the bar was drawn on stderr, with the counts the operation gave
    assert "3/3" in terminal.getvalue()


def test_no_progress_at_all_with_json(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _on_a_terminal(monkeypatch)
    with progress_on_stderr("replaying", json_output=True) as progress:
        assert progress is None
    assert terminal.getvalue() == ""


def test_off_a_terminal_there_is_no_bar_and_only_notes_asked_for_are_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN stderr that is no terminal (pytest's capture)
    # WHEN an operation runs without notes asked for THEN nothing reports its progress
    with progress_on_stderr("reconciling", json_output=False) as progress:
        assert progress is None
    # WHEN the views rebuild asks for its notes THEN they are printed as lines, the bare counts not
    with progress_on_stderr("rebuilding", json_output=False, notes_off_terminal=True) as progress:
        assert progress is not None
        progress(1, None)
        progress(2, 8, "EVENTS_01 rebuilt")
    assert capsys.readouterr().err == "EVENTS_01 rebuilt\n"
