"""``rhumbatron replay``: rewind a subscription over a stream, or replay an archive range,
through its claims. Exit status: 3 a replay that cannot run as asked, 1 one that failed, 4
NATS cannot be reached."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated

import typer

from rhumbatron.cli.common import EXIT_ERROR, run_on_runtime
from rhumbatron.cli.options import JsonAlways
from rhumbatron.cli.progress import progress_on_stderr

__all__ = ["replay", "replay_command"]


class Source(StrEnum):
    STREAM = "stream"
    ARCHIVE = "archive"


def replay_command(
    *,
    source: Annotated[
        Source, typer.Option(help="stream: rewind over an event stream; archive: the S3 archive.")
    ],
    subscription: Annotated[
        str,
        typer.Option(
            help="project-view-projector, causal-router, audit-archiver or analytics-projector."
        ),
    ],
    stream: Annotated[
        int | None, typer.Option(help="The event stream (0-7); archive: all if unset.")
    ] = None,
    to_seq: Annotated[
        int | None, typer.Option(help="Rewind: start at this stream sequence.")
    ] = None,
    to_time: Annotated[
        str | None,
        typer.Option(help="Rewind: start at the first event stored at this time (ISO-8601)."),
    ] = None,
    start: Annotated[
        str | None, typer.Option(help="Archive: the range's start (ISO-8601 with a timezone).")
    ] = None,
    end: Annotated[str | None, typer.Option(help="Archive: the range's end, exclusive.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only; change nothing.")] = False,
    json_: JsonAlways = False,
) -> int:
    """Rewind a subscription over a stream, or replay an archive range (claims: no second
    effect). Prints the report as JSON. Exit status: 3 a replay that cannot run as asked, 1
    one that failed, 4 NATS cannot be reached."""
    return replay(
        argparse.Namespace(
            source=source.value,
            subscription=subscription,
            stream=stream,
            to_seq=to_seq,
            to_time=to_time,
            start=start,
            end=end,
            dry_run=dry_run,
            json=json_,
        )
    )


def replay(args: argparse.Namespace) -> int:
    """Rewind a subscription over a stream, or replay an archive range, through its claims:
    only events it never applied take effect. ``--dry-run`` counts and changes nothing."""
    import dataclasses

    from rhumbatron.router.replay import run_replay

    with progress_on_stderr(f"replaying {args.subscription}", json_output=args.json) as progress:
        report = run_on_runtime(
            lambda app: run_replay(
                app,
                source=args.source,
                subscription=args.subscription,
                dry_run=args.dry_run,
                stream=args.stream,
                to_seq=args.to_seq,
                to_time=_when(args.to_time, "--to-time"),
                start=_when(args.start, "--start"),
                end=_when(args.end, "--end"),
                progress=progress,
            )
        )
    print(json.dumps(dataclasses.asdict(report), indent=2, default=str))
    return EXIT_ERROR if report.failed else 0


def _when(value: str | None, option: str) -> datetime | None:
    """The moment an option names, with its timezone, or ReplayError saying what is wrong."""
    from rhumbatron.errors import ReplayError

    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ReplayError(f"{option} {value!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None:
        raise ReplayError(f"{option} {value!r} needs a timezone (e.g. 2026-11-29T10:00Z)")
    return moment
