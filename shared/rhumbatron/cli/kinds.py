"""``rhumbatron kinds``: the Event kind grammar."""

from __future__ import annotations

import argparse

from rhumbatron.cli.common import print_json
from rhumbatron.cli.options import JsonFlag

__all__ = ["kinds", "kinds_command"]


def kinds_command(json_: JsonFlag = False) -> int:
    """List the Event kinds: subject, triggerable, owner, payload fields."""
    return kinds(argparse.Namespace(json=json_))


def kinds(args: argparse.Namespace) -> int:
    """Print every Event kind: subject, whether it can trigger reactions, its payload."""
    from rhumbatron.reactions.kinds import kinds_table, list_kinds

    rows = list_kinds()
    if args.json:
        print_json(rows)
    else:
        print(kinds_table(rows))
    return 0
