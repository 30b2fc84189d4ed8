"""Every specification code the package cites resolves inside the repository.

Docstrings and comments cite rules (``S2-046``), faults and bad inputs (``F8``, ``B9``) and a
few other codes (``E3``, ``R3``). ``docs/glossary.md`` lists each one; a rule's text there is
its row in ``docs/conformance.md``, so the two cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GLOSSARY = REPO / "docs" / "glossary.md"
#: The codes the code cites: rules, faults, bad inputs, roadmap rungs, replica counts.
CODE = re.compile(r"\b(S[02]-\d{3}|F\d{1,2}|B\d{1,2}|E[0-4]|R[13])\b")


def _cited() -> dict[str, str]:
    """Each code cited in the package or the functions, with one file that cites it."""
    files = [*(REPO / "shared" / "rhumbatron").rglob("*.py"), *(REPO / "functions").rglob("*.py")]
    cited: dict[str, str] = {}
    for path in sorted(files):
        for match in CODE.finditer(path.read_text()):
            cited.setdefault(match.group(1), str(path.relative_to(REPO)))
    return cited


def _glossary_rows() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in GLOSSARY.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 2:
            for code in cells[0].split(", "):
                rows[code] = cells[1]
    return rows


def test_every_code_the_package_cites_is_in_the_glossary() -> None:
    # GIVEN the codes cited by the package's docstrings and comments
    cited = _cited()
    assert "S2-046" in cited and "F1" in cited, "the citation pattern finds nothing"

    # WHEN the glossary is read
    rows = _glossary_rows()

    # THEN each has its row
    missing = {code: where for code, where in cited.items() if code not in rows}
    assert missing == {}, f"add these to docs/glossary.md (code: a file citing it): {missing}"


def test_a_rules_text_in_the_glossary_is_its_conformance_row() -> None:
    # GIVEN the rule rows of the conformance map
    conformance = {
        m.group(1): m.group(2)
        for m in re.finditer(
            r"^\| (S\d-\d{3}) \| (.*?) \|", (REPO / "docs" / "conformance.md").read_text(), re.M
        )
    }

    # WHEN the glossary's rule rows are read
    rules = {code: text for code, text in _glossary_rows().items() if code.startswith("S")}

    # THEN each says what the conformance map says
    assert rules
    assert {code: text for code, text in rules.items() if conformance.get(code) != text} == {}
