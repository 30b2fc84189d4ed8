"""``rhumbatron capacity``: the event router's ceilings, the volume sized for and observed.

Prints the capacity report as JSON (``router.capacity.capacity_report``): every ceiling the
settings allow, ``expectedEventsPerDay`` and the rate the streams carry, the prune's chunk per
tick, and the warnings the router would log. When NATS cannot be reached it says so on stderr
and prints the report from the settings alone (``observedEventsPerDay`` null).

It exits 0 whatever the report says: the warnings are in it (a ceiling below the sized
volume, or one the observed rate passed 80 % of).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from rhumbatron.cli.common import run_on_runtime
from rhumbatron.cli.options import JsonAlways

if TYPE_CHECKING:
    from rhumbatron.router.capacity import CapacityReport
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["capacity", "capacity_command"]


def capacity_command(json_: JsonAlways = False) -> int:
    """The event router's ceilings against the volume sized for and the one observed (JSON)."""
    return capacity(argparse.Namespace(json=json_))


def capacity(args: argparse.Namespace) -> int:
    """Print the capacity report as JSON."""
    from rhumbatron.router.capacity import capacity_report

    async def report(app: Rhumbatron) -> CapacityReport:
        from rhumbatron.errors import NatsUnavailableError

        try:
            nc = await app.nats()
        except NatsUnavailableError as exc:
            print(
                f"rhumbatron capacity: {exc}; the report is from the settings alone",
                file=sys.stderr,
            )
            nc = None
        return await capacity_report(app.settings, nc)

    result = run_on_runtime(report)
    print(json.dumps(result.as_json(), indent=2))
    return 0
