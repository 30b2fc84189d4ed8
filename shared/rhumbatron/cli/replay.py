"""``rhumbatron replay``: rewind a subscription over a stream, or replay an archive range,
through its claims. Exit status: 3 a replay that cannot run as asked, 1 one that failed, 4
NATS cannot be reached."""

from __future__ import annotations

import argparse
import json
import logging
from datetime import datetime
from typing import Any

from rhumbatron.cli.common import EXIT_CANNOT, EXIT_ERROR, exit_status_of, fail, run_on_runtime

__all__ = ["add_parser", "replay"]


def add_parser(sub: Any) -> None:
    replay = sub.add_parser(
        "replay",
        help="rewind a subscription over a stream, or replay an archive range (claims: no "
        "second effect)",
    )
    replay.add_argument("--source", required=True, choices=["stream", "archive"])
    replay.add_argument(
        "--subscription",
        required=True,
        help="project-view-projector, causal-router, audit-archiver or analytics-projector",
    )
    replay.add_argument("--stream", type=int, help="the event stream (0-7); archive: all if unset")
    replay.add_argument("--to-seq", type=int, help="rewind: start at this stream sequence")
    replay.add_argument("--to-time", help="rewind: start at the first event stored at this time")
    replay.add_argument("--start", help="archive: the range's start (ISO-8601 with a timezone)")
    replay.add_argument("--end", help="archive: the range's end, exclusive")
    replay.add_argument("--dry-run", action="store_true", help="count only; change nothing")


def replay(args: argparse.Namespace) -> int:
    """Rewind a subscription over a stream, or replay an archive range, through its claims:
    only events it never applied take effect. ``--dry-run`` counts and changes nothing."""
    import dataclasses

    from rhumbatron.errors import ReplayError, RhumbatronError
    from rhumbatron.router.replay import run_replay

    # nats-py logs each failed connect with a traceback; the one-line error below says it.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    try:
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
            )
        )
    except ReplayError as exc:
        return fail(EXIT_CANNOT, str(exc), command="replay")
    except RhumbatronError as exc:
        return fail(exit_status_of(exc), str(exc), command="replay")
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
