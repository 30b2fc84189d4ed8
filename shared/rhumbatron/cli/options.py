"""The options several commands share, declared once with their help."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["JsonAlways", "JsonFlag", "TenantFilter"]

#: ``--json`` of a command that prints text by default.
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print JSON (the HTTP API's form) instead of text.")
]
#: ``--json`` of a command whose output is JSON already: accepted by every command that
#: prints data, so a script can always pass it; it also turns the progress bar off.
JsonAlways = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print JSON (this command's output is JSON anyway; no progress bar either).",
    ),
]
#: ``--tenant`` as a filter of the registry commands (every tenant's when unset).
TenantFilter = Annotated[
    str | None,
    typer.Option("--tenant", help="Only this tenant's records (default: every tenant's)."),
]
