"""``rhumbatron kinds``: the Event kind grammar."""

from __future__ import annotations

import argparse
from typing import Any

from rhumbatron.cli.common import print_json

__all__ = ["add_parser", "kinds"]


def add_parser(sub: Any) -> None:
    kinds = sub.add_parser(
        "kinds", help="list the Event kinds: subject, triggerable, owner, payload fields"
    )
    kinds.add_argument("--json", action="store_true", help="print the kinds as a JSON list")


def kinds(args: argparse.Namespace) -> int:
    """Print every Event kind: subject, whether it can trigger reactions, its payload."""
    from rhumbatron.reactions.kinds import kinds_table, list_kinds

    rows = list_kinds()
    if args.json:
        print_json(rows)
    else:
        print(kinds_table(rows))
    return 0
