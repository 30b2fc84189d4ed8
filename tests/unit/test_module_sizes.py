"""The package stays in small pieces: no module over about 500 lines (a declarative table
excepted), no function over about 60. A module or function that grows past them is split
where it is written, not later."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
#: The package Lambda runs; the development package (demo, local stack) is not held to it.
PACKAGES = ("rhumbatron",)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
#: Declarative tables, allowed to be long: every setting with its default and description,
#: the API's request and response models, and the one exception tree.
DECLARATIVE = frozenset(
    {
        "rhumbatron/core/settings.py",
        "rhumbatron/api/lifecycle_schemas.py",
        "rhumbatron/errors.py",
    }
)


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (SHARED / package).rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(SHARED).as_posix()


@pytest.mark.parametrize("package", PACKAGES)
def test_the_checked_packages_have_modules(package: str) -> None:
    assert list((SHARED / package).rglob("*.py")), f"no modules under {package}: moved?"


def test_no_module_is_over_its_limit() -> None:
    # GIVEN every module of the packages, but the declarative tables
    long = {
        _name(p): n
        for p in _modules()
        if _name(p) not in DECLARATIVE and (n := p.read_text().count("\n")) > MAX_MODULE_LINES
    }
    # THEN none is over the limit
    assert long == {}, f"split these modules (lines): {long}"


def test_no_function_is_over_its_limit() -> None:
    # GIVEN every function and method of the packages
    long: dict[str, int] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{_name(path)}::{node.name}"] = length
    # THEN none is over the limit
    assert long == {}, f"break these functions into steps (lines): {long}"


def test_the_declarative_exceptions_still_exist() -> None:
    assert {m for m in DECLARATIVE if not (SHARED / m).exists()} == set()
