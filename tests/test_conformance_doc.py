"""docs/conformance.md stays true: one row per rule ID, and every test it names exists."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT / "docs" / "conformance.md"
SPEC_RULES = ROOT.parent / "shared" / "SPEC-RULES.md"
_ROW = re.compile(r"^\| (S[02]-\d{3}) \|")
_TEST_REF = re.compile(r"`([\w/]+\.py)::(\w+)`")


def _rows(path: Path) -> list[str]:
    return [m.group(1) for line in path.read_text().splitlines() if (m := _ROW.match(line))]


@functools.cache
def _test_names(path: Path) -> set[str]:
    # Cached: the page names some files hundreds of times, and parsing each once is the test.
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    }


def test_every_rule_id_of_the_specification_has_exactly_one_row() -> None:
    if not SPEC_RULES.exists():
        pytest.skip(f"{SPEC_RULES} is not beside the repository")
    assert sorted(_rows(CONFORMANCE)) == sorted(_rows(SPEC_RULES))


def test_every_test_named_as_proof_exists() -> None:
    missing = []
    text = CONFORMANCE.read_text()
    for file, name in _TEST_REF.findall(text):
        path = ROOT / "tests" / file
        if not path.exists() or name not in _test_names(path):
            missing.append(f"{file}::{name}")
    assert missing == []
    assert _TEST_REF.search(text), "the page names no tests at all"


def test_a_proved_row_names_at_least_one_test() -> None:
    unproved = [
        line.split("|")[1].strip()
        for line in CONFORMANCE.read_text().splitlines()
        if _ROW.match(line) and "| proved |" in line and not _TEST_REF.search(line)
    ]
    assert unproved == []


_SUMMARY = re.compile(r"^Summary: (.+)\.$", re.MULTILINE)
_STATUS = re.compile(r"^\| S[02]-\d{3} \|[^|]*\| ([a-z ]+?) \|", re.MULTILINE)


def test_the_summary_line_counts_the_rows_by_status() -> None:
    # GIVEN the page's one summary line ("Summary: 80 adapted, 10 not applicable, 292 proved.")
    text = CONFORMANCE.read_text()
    (summary,) = _SUMMARY.findall(text)
    said = {status: int(count) for count, status in re.findall(r"(\d+) ([a-z ]+?)(?:,|$)", summary)}
    # THEN each count is the number of rows with that status, and no status is left out
    counted: dict[str, int] = {}
    for status in _STATUS.findall(text):
        counted[status] = counted.get(status, 0) + 1
    assert said == counted
