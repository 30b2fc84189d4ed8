"""``rhumbatron views rebuild [--project ID | --stream N]``: rebuild project views from the log.

Exit status: 3 a rebuild that cannot run as asked, 1 one that failed (some event could not be
applied, or part of the history could not be read), 4 NATS cannot be reached, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from rhumbatron.cli.common import EXIT_CANNOT, EXIT_ERROR, exit_status_of, fail, run_on_runtime

__all__ = ["add_parser", "views"]


def add_parser(sub: Any) -> None:
    views = sub.add_parser("views", help="the project views the router builds from the events")
    actions = views.add_subparsers(dest="action", required=True)
    rebuild = actions.add_parser(
        "rebuild",
        help="forget the views and rebuild them from the stream (and the S3 archive beyond "
        "its retention); every project unless --project or --stream",
    )
    which = rebuild.add_mutually_exclusive_group()
    which.add_argument("--project", help="rebuild this project's view only")
    which.add_argument("--stream", type=int, help="rebuild the views of one stream (0-7)")


def views(args: argparse.Namespace) -> int:
    """Rebuild the views asked for and print what the rebuild read and applied, as JSON."""
    from rhumbatron.errors import ReplayError, RhumbatronError
    from rhumbatron.protocol.ids import PROJECT_ID_PATTERN
    from rhumbatron.router.views import rebuild_views

    if args.project is not None and PROJECT_ID_PATTERN.fullmatch(args.project) is None:
        return fail(
            EXIT_CANNOT,
            f"--project {args.project!r} is not a project ID (letters, digits, '-' and '_', "
            "at most 64, starting with a letter or digit)",
            command="views rebuild",
        )
    # nats-py logs each failed connect with a traceback; the one-line error below says it.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    try:
        result = run_on_runtime(
            lambda app: rebuild_views(
                app.router(),
                project_id=args.project,
                stream=args.stream,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
        )
    except ReplayError as exc:
        return fail(EXIT_CANNOT, str(exc), command="views rebuild")
    except RhumbatronError as exc:
        return fail(exit_status_of(exc), str(exc), command="views rebuild")
    print(json.dumps(result.as_json(), indent=2))
    return EXIT_ERROR if result.failed or result.gaps else 0
