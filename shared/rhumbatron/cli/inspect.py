"""``rhumbatron inspect [FILE ...] [--by-file] [--json]``: what the state's SQLite files hold.

With no file, every SQLite file under the state directory (``RHUMBATRON_STATE_DIR``), summed
by kind: files, rows per table, bytes in use and of WAL files; ``--by-file`` lists each file
instead, with an actor file's outbox by state. Named files are listed one by one. Read only:
nothing is created or changed (:mod:`rhumbatron.operator.inspect`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Annotated

import typer

from rhumbatron.cli.options import JsonFlag

__all__ = ["inspect", "inspect_command"]


def inspect_command(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="FILE...", help="SQLite files to list (default: every file of the state)"
        ),
    ] = None,
    by_file: Annotated[
        bool, typer.Option("--by-file", help="One entry per file, not a sum per kind.")
    ] = False,
    json_: JsonFlag = False,
) -> int:
    """Tables, row counts, bytes and outbox states of the state directory's SQLite files.

    With no FILE, every SQLite file under RHUMBATRON_STATE_DIR, summed by kind. Read only.
    """
    return inspect(argparse.Namespace(files=files or [], by_file=by_file, json=json_))


def inspect(args: argparse.Namespace) -> int:
    """Print the summary; a missing or unreadable file is a clear error (exit 2)."""
    from rhumbatron.core.settings import load_settings
    from rhumbatron.operator.inspect import inspect_file, inspect_state, totals

    state_dir = load_settings().state_dir
    if args.files:
        summaries = [inspect_file(path.resolve(), state_dir.resolve()) for path in args.files]
    else:
        summaries = inspect_state(state_dir)
    if args.by_file or args.files:
        if args.json:
            print(json.dumps([s.to_json() for s in summaries], indent=2))
            return 0
        for summary in summaries:
            print(
                f"{summary.path} ({summary.kind}): {summary.used_bytes:,} bytes in use, "
                f"WAL {summary.wal_bytes:,}"
            )
            for table, count in sorted(summary.rows.items()):
                print(f"  {table:<32}{count:>12,}")
            if summary.outbox is not None:
                states = ", ".join(f"{k} {v:,}" for k, v in sorted(summary.outbox.items()))
                print(f"  outbox by state: {states}")
        return 0
    by_kind = totals(summaries)
    if args.json:
        print(json.dumps(by_kind.to_json(), indent=2))
        return 0
    print(f"{state_dir}: {sum(by_kind.files.values())} SQLite files")
    for kind in sorted(by_kind.files):
        print(
            f"{kind}: {by_kind.files[kind]} files, {by_kind.used_bytes[kind]:,} bytes in use, "
            f"WAL {by_kind.wal_bytes[kind]:,}"
        )
        prefix = f"{kind}."
        for name, count in sorted(by_kind.rows.items()):
            if name.startswith(prefix) and count:
                print(f"  {name[len(prefix) :]:<32}{count:>12,}")
    return 0
