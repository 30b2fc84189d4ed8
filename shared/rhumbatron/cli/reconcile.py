"""``rhumbatron reconcile [--stream N ...] [--repair [--dry-run]] [--json]``: prove the log
holds every event the outbox published (:mod:`rhumbatron.operator.reconciliation`).

Prints, per event stream and replica, the events the outbox published within the window, how
many of them that replica holds and every missing event ID, with the replica's own counts
(``--json``: the whole report). ``--repair`` then moves the lead of each stream whose leader
lost events to a healthy replica, publishes again from the outbox the events no replica holds,
and lists what is left to an operator (rebuilding a damaged replica on its node);
``--dry-run`` only lists it all. Exit status: 0 no
gap, 6 a gap (some replica lacks acknowledged events, or a stream could not be read), 4 NATS
cannot be reached.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Annotated

import typer

from rhumbatron.cli.common import EXIT_GAP, print_json, run_on_runtime
from rhumbatron.cli.options import JsonFlag
from rhumbatron.cli.progress import progress_on_stderr

if TYPE_CHECKING:
    from rhumbatron.operator.log_repair import RepairStep
    from rhumbatron.operator.reconciliation import ReconciliationReport
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["reconcile", "reconcile_command"]


def reconcile_command(
    stream: Annotated[
        list[int] | None,
        typer.Option(
            min=0,
            max=7,
            metavar="N",
            help="An event stream index (0-7) to check (repeatable); default: all eight.",
        ),
    ] = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Move the lead away from a replica that lost events, publish again what no "
            "replica holds; list what is left.",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="With --repair: say what it would do, do nothing.")
    ] = False,
    json_: JsonFlag = False,
) -> int:
    """Prove the log holds every event the outbox marked published.

    Per event stream and replica: the events published within the window, how many that
    replica holds, every missing event ID. Exit status: 0 no gap, 6 a gap, 4 NATS cannot be
    reached, 2 a usage error.
    """
    if dry_run and not repair:
        raise typer.BadParameter("--dry-run goes with --repair", param_hint="'--dry-run'")
    return reconcile(argparse.Namespace(stream=stream, repair=repair, dry_run=dry_run, json=json_))


def reconcile(args: argparse.Namespace) -> int:
    """Run the reconciliation and print what it found (``--dry-run`` without ``--repair`` is
    refused before, as a usage error)."""

    async def run(app: Rhumbatron) -> tuple[ReconciliationReport, list[RepairStep]]:
        with progress_on_stderr("reconciling", json_output=args.json) as progress:
            report = await app.reconcile(args.stream, progress=progress)
        steps = await app.repair_log(report, dry_run=args.dry_run) if args.repair else []
        return report, steps

    report, steps = run_on_runtime(run)
    if args.json:
        body = report.as_json()
        if args.repair:
            body["repair"] = {"dryRun": args.dry_run, "steps": [s.as_json() for s in steps]}
        print_json(body)
    else:
        _print_table(report)
        for step in steps:
            state = "done" if step.done else ("would do" if args.dry_run else "left to do")
            print(f"repair {step.stream}: {step.action} {step.node} ({state}): {step.detail}")
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
