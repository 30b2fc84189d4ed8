"""The layering of the package, as `make lint` checks it with import-linter.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``): no import cycle anywhere
in the package, and the layers of ``docs/architecture.md``. They count every import — at
module level, inside a function (a lazy import) and under ``TYPE_CHECKING`` — because a cycle
hidden in a function body is still a cycle when the code runs. These tests run the real
contracts over the package, and prove that the settings really count the hidden imports: the
same settings applied to a small package whose only cycle is hidden must report it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _settings() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


def _lint(config: Path, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(config)],
        cwd=cwd,
        env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _write_package(root: Path, modules: dict[str, str]) -> None:
    package = root / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, source in modules.items():
        (package / f"{name}.py").write_text(textwrap.dedent(source))


def _config_like_ours(path: Path, contract: dict[str, object]) -> Path:
    """The project's import-linter settings, with one contract, over the package ``pkg``."""
    ours = _settings()
    lines = [
        "[importlinter]",
        "root_packages =",
        "    pkg",
        f"include_external_packages = {ours['include_external_packages']}",
        f"exclude_type_checking_imports = {ours['exclude_type_checking_imports']}",
        "",
        "[importlinter:contract:under-test]",
    ]
    for key, value in contract.items():
        if isinstance(value, list):
            lines.append(f"{key} =")
            lines.extend(f"    {item}" for item in value)
        else:
            lines.append(f"{key} = {value}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_package_keeps_every_contract() -> None:
    # GIVEN the package and its contracts in pyproject.toml
    # WHEN import-linter checks them (as `make lint` does)
    done = _lint(REPO / "pyproject.toml", REPO, REPO / "shared")

    # THEN every contract is kept
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout


def test_the_contracts_count_every_module_and_every_hidden_import() -> None:
    # GIVEN the contracts
    settings = _settings()
    contracts = {c["id"]: c for c in settings["contracts"]}  # type: ignore[index]

    # THEN TYPE_CHECKING imports count, the cycle check covers the whole package, and every
    # module must sit in a layer
    assert settings["exclude_type_checking_imports"] is False
    assert contracts["no-cycles"]["type"] == "acyclic_siblings"
    assert {"rhumbatron", "rhumbatron_dev"} <= set(contracts["no-cycles"]["ancestors"])
    assert contracts["layers"]["exhaustive"] is True


@pytest.mark.parametrize(
    ("how", "b_source"),
    [
        (
            "inside a function",
            """
            def f():
                from pkg import a
                return a
            """,
        ),
        (
            "under TYPE_CHECKING",
            """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg import a
            """,
        ),
    ],
)
def test_a_cycle_hidden_in_a_lazy_or_type_checking_import_is_reported(
    tmp_path: Path, how: str, b_source: str
) -> None:
    # GIVEN a package whose module a imports b at the top, and b imports a only {how}
    _write_package(tmp_path, {"a": "from pkg import b\n", "b": b_source})
    config = _config_like_ours(
        tmp_path / "contracts.ini",
        {"name": "no cycles", "type": "acyclic_siblings", "ancestors": ["pkg"]},
    )

    # WHEN the project's settings check it
    done = _lint(config, tmp_path, tmp_path)

    # THEN the cycle is reported and the check fails
    assert done.returncode != 0, f"a cycle hidden {how} passed:\n{done.stdout}"
    assert "BROKEN" in done.stdout


def test_an_upward_import_hidden_in_a_function_breaks_the_layers(tmp_path: Path) -> None:
    # GIVEN a lower module that imports the layer above it inside a function
    _write_package(
        tmp_path,
        {"top": "from pkg import low\n", "low": "def f():\n    from pkg import top\n"},
    )
    config = _config_like_ours(
        tmp_path / "contracts.ini",
        {"name": "layers", "type": "layers", "containers": ["pkg"], "layers": ["top", "low"]},
    )

    # WHEN the project's settings check it
    done = _lint(config, tmp_path, tmp_path)

    # THEN the layers contract is broken, naming the import
    assert done.returncode != 0, done.stdout
    assert "pkg.low is not allowed to import pkg.top" in done.stdout
