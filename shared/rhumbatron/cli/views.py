"""``rhumbatron views rebuild [--project ID | --stream N]``: rebuild project views from the log.

Exit status: 3 a rebuild that cannot run as asked, 1 one that failed (some event could not be
applied, or part of the history could not be read), 4 NATS cannot be reached, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
from typing import Annotated

import typer

from rhumbatron.cli.common import EXIT_CANNOT, EXIT_ERROR, fail, run_on_runtime
from rhumbatron.cli.guard import GuardedCommand
from rhumbatron.cli.options import JsonAlways
from rhumbatron.cli.progress import progress_on_stderr

__all__ = ["app", "views"]

app = typer.Typer(help="The project views the router builds from the events.", no_args_is_help=True)


@app.command("rebuild", cls=GuardedCommand)
def rebuild_command(
    project: Annotated[
        str | None, typer.Option(help="Rebuild this project's view only (not with --stream).")
    ] = None,
    stream: Annotated[
        int | None,
        typer.Option(help="Rebuild the views of one stream (0-7; not with --project)."),
    ] = None,
    json_: JsonAlways = False,
) -> int:
    """Forget the views and rebuild them from the stream (and the S3 archive beyond its
    retention); every project unless --project or --stream. Prints what it read and applied
    (JSON). Exit status: 3 cannot run as asked, 1 failed, 4 NATS cannot be reached."""
    if project is not None and stream is not None:
        raise typer.BadParameter("give --project or --stream, not both", param_hint="--stream")
    return views(argparse.Namespace(action="rebuild", project=project, stream=stream, json=json_))


def views(args: argparse.Namespace) -> int:
    """Rebuild the views asked for and print what the rebuild read and applied, as JSON."""
    from rhumbatron.protocol.ids import PROJECT_ID_PATTERN
    from rhumbatron.router.views import rebuild_views

    if args.project is not None and PROJECT_ID_PATTERN.fullmatch(args.project) is None:
        return fail(
            EXIT_CANNOT,
            f"--project {args.project!r} is not a project ID (letters, digits, '-' and '_', "
            "at most 64, starting with a letter or digit)",
            command="views rebuild",
        )
    with progress_on_stderr(
        "rebuilding views", json_output=args.json, notes_off_terminal=True
    ) as progress:
        result = run_on_runtime(
            lambda app: rebuild_views(
                app.router(),
                project_id=args.project,
                stream=args.stream,
                progress=progress,
            )
        )
    print(json.dumps(result.as_json(), indent=2))
    return EXIT_ERROR if result.failed or result.gaps else 0
