"""``rhumbatron demo``, ``up`` and ``invoke`` run the development package ``rhumbatron_dev``,
which the Lambda code layer leaves out: the CLI imports it only when one of them runs, and
where it (or the ``local`` extra it needs) cannot be imported the command says what to
install, in one line, with exit status 1."""

from __future__ import annotations

import sys

import pytest

from rhumbatron.cli import EXIT_ERROR, main

DEV_COMMANDS = [
    pytest.param(["demo"], id="demo"),
    pytest.param(["up"], id="up"),
    pytest.param(["invoke", "SweepFunction", "--event", "events/sweep.json"], id="invoke"),
]


def _unimportable(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make ``name`` fail to import, as where it is not installed (restored after the test);
    the development package's modules already imported are forgotten, so they import anew."""
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        monkeypatch.delitem(sys.modules, module)
    for module in [m for m in sys.modules if m.startswith("rhumbatron_dev.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("argv", DEV_COMMANDS)
def test_a_dev_command_without_the_dev_package_says_what_to_install(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an install without the development package (as the Lambda layer is)
    _unimportable(monkeypatch, "rhumbatron_dev")

    # WHEN the command runs
    status = main(argv)

    # THEN it fails with one line naming the package and how to install it, no traceback
    err = capsys.readouterr().err
    assert status == EXIT_ERROR
    assert err.startswith(f"rhumbatron {argv[0]}: rhumbatron_dev is not installed;"), err
    assert "pip install -e '.[local]'" in err
    assert err.count("\n") == 1


def test_invoke_without_the_local_extra_names_the_missing_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the development package without PyYAML, which the local extra installs
    _unimportable(monkeypatch, "yaml")

    # WHEN `rhumbatron invoke` runs
    status = main(["invoke", "SweepFunction", "--event", "events/sweep.json"])

    # THEN it names the missing module and the extra, no traceback
    err = capsys.readouterr().err
    assert status == EXIT_ERROR
    assert err.startswith("rhumbatron invoke: yaml is not installed;"), err
    assert "local extra" in err
