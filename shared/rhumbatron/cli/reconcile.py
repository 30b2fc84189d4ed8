"""``rhumbatron reconcile [--stream N ...] [--json]``: prove the log holds every event the
outbox published (:mod:`rhumbatron.operator.reconciliation`).

Prints, per event stream, the events the outbox published within the window and how many of
them the leader holds, every missing event ID, and each replica's expected and found counts
(``--json``: the whole report). Exit status: 0 no gap, 6 a gap (some replica lacks
acknowledged events, or a stream could not be read), 4 NATS cannot be reached.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rhumbatron.cli.common import EXIT_GAP, print_json, run_on_runtime

if TYPE_CHECKING:
    from rhumbatron.operator.reconciliation import ReconciliationReport
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["add_parser", "reconcile"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "reconcile",
        help="prove the log holds every event the outbox marked published",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument(
        "--stream",
        type=int,
        action="append",
        metavar="N",
        choices=range(8),
        help="an event stream index (0-7) to check (repeatable); default: all eight",
    )
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")


def reconcile(args: argparse.Namespace) -> int:
    """Run the reconciliation and print what it found."""

    async def run(app: Rhumbatron) -> ReconciliationReport:
        return await app.reconcile(args.stream)

    report = run_on_runtime(run)
    if args.json:
        print_json(report.as_json())
    else:
        _print_table(report)
    return EXIT_GAP if report.gaps else 0


def _print_table(report: ReconciliationReport) -> None:
    print(
        f"published {report.checked_from:%Y-%m-%d %H:%M} .. {report.checked_to:%Y-%m-%d %H:%M} "
        f"UTC; {report.requests} requests, {report.seconds:.2f} s"
    )
    for stream in report.streams:
        verdict = "GAP" if stream.has_gap else "ok"
        print(f"{stream.stream}: {verdict}: {stream.expected} events published")
        if stream.error:
            print(f"  cannot read it: {stream.error}")
        for replica in stream.replicas:
            role = "leader" if replica.leader else "replica"
            print(f"  {role} {replica.node}: holds {replica.found} of {replica.expected}")
            if replica.error:
                print(f"    cannot read it: {replica.error}")
            if replica.holes:
                print(f"    {replica.holes} lost inside its sequence range")
            if replica.behind:
                print(f"    {replica.behind} behind the leader")
            for event_id in replica.missing:
                print(f"    missing {event_id}")
    for node in report.unread_nodes:
        print(f"not read: {node}")
