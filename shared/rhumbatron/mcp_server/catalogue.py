"""Every operation of the ops surface in one table: its MCP tool, API route, scope, the token
it needs, what it changes and whether it is audited — read off the API itself.

``docs/operations.md`` holds the table between two markers; ``tests/unit/test_ops_catalogue.py``
fails when it differs from what this module renders, and
``python -m rhumbatron.mcp_server.catalogue --write`` writes it there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rhumbatron.mcp_server.tools import DESTRUCTIVE

__all__ = ["BEGIN", "END", "CatalogueRow", "catalogue", "render"]

BEGIN = "<!-- ops-catalogue:begin -->"
END = "<!-- ops-catalogue:end -->"


@dataclass(frozen=True, slots=True)
class CatalogueRow:
    """One operation of the ops surface."""

    tool: str
    method: str
    path: str
    scopes: tuple[str, ...]
    platform: bool

    @property
    def changes(self) -> str:
        if self.method == "GET":
            return "read-only"
        return "destructive: `confirm`" if self.tool in DESTRUCTIVE else "changes state"

    @property
    def token(self) -> str:
        if not self.scopes:
            return "none"
        return "platform" if self.platform else "tenant"

    @property
    def audited(self) -> bool:
        return self.method != "GET"


def _walk(dependant: Any, scopes: set[str], platform: list[bool]) -> None:
    scopes.update(getattr(dependant, "own_oauth_scopes", None) or [])
    call = getattr(dependant, "call", None)
    if getattr(call, "__qualname__", "").startswith("platform_principal"):
        platform.append(True)
    for sub in dependant.dependencies:
        _walk(sub, scopes, platform)


def catalogue() -> list[CatalogueRow]:
    """Every operation of the API's routers, in the OpenAPI document's order."""
    from fastapi.routing import APIRoute

    from rhumbatron.api.routes import ROUTERS

    rows: list[CatalogueRow] = []
    for router in ROUTERS:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                continue
            scopes: set[str] = set()
            platform: list[bool] = []
            _walk(route.dependant, scopes, platform)
            for method in sorted(route.methods or ()):
                rows.append(
                    CatalogueRow(
                        route.name, method, route.path, tuple(sorted(scopes)), bool(platform)
                    )
                )
    return rows


def render(rows: Sequence[CatalogueRow]) -> str:
    """The Markdown table of ``rows``."""
    lines = [
        "| MCP tool (operation) | API route | scope | token | changes | audited |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        scope = ", ".join(f"`{s}`" for s in row.scopes) or "none"
        lines.append(
            f"| `{row.tool}` | `{row.method} {row.path}` | {scope} | "
            f"{row.token} | {row.changes} | "
            f"{'yes' if row.audited else '—'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rhumbatron.mcp_server.catalogue")
    parser.add_argument(
        "--write",
        type=Path,
        nargs="?",
        const=Path("docs/operations.md"),
        help="replace the table between the markers of this file (default docs/operations.md)",
    )
    args = parser.parse_args(argv)
    table = render(catalogue())
    if args.write is None:
        print(table)
        return 0
    text = args.write.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    args.write.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
