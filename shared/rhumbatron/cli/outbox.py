"""``rhumbatron outbox`` (status, requeue) and ``rhumbatron streams``: the actors' outboxes
and the JetStream streams of the local state."""

from __future__ import annotations

import argparse
import json
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from rhumbatron.cli.common import print_json, run_on_runtime
from rhumbatron.cli.options import JsonAlways

if TYPE_CHECKING:
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["outbox", "outbox_command", "streams", "streams_command"]


class OutboxAction(StrEnum):
    STATUS = "status"
    REQUEUE = "requeue"


def outbox_command(
    action: Annotated[
        OutboxAction,
        typer.Argument(
            help="status: each actor's rows by state and its failed rows (JSON); requeue: "
            "put failed rows back to pending"
        ),
    ],
    event_id: Annotated[
        list[str] | None,
        typer.Option("--event-id", help="requeue: only this event's row (repeatable)."),
    ] = None,
    json_: Annotated[
        bool,
        typer.Option("--json", help="Print JSON: requeue prints the rows requeued per actor."),
    ] = False,
) -> int:
    """Inspect the actors' outboxes, or requeue their failed rows."""
    return outbox(argparse.Namespace(action=action.value, event_id=event_id, json=json_))


def streams_command(json_: JsonAlways = False) -> int:
    """Create or reconcile the JetStream streams; print what was done (JSON)."""
    return streams(argparse.Namespace(json=json_))


def outbox(args: argparse.Namespace) -> int:
    from rhumbatron.actors.outbox import counts_by_state
    from rhumbatron.actors.publisher import requeue_failed_rows
    from rhumbatron.runtime.bootstrap import bootstrap

    app = bootstrap()
    status: dict[str, dict[str, object]] = {}
    requeued: dict[str, int] = {}
    for ref in app.actor_refs():
        actor = app.actor(ref)
        if args.action == "requeue":
            count = requeue_failed_rows(actor, args.event_id or None)
            if count and not args.json:
                print(f"{ref.key}: requeued {count} failed rows")
            if count:
                requeued[ref.key] = count
            continue
        failed = actor.connection.execute(
            "SELECT event_id, event_type, attempts, last_error FROM outbox "
            "WHERE state = 'failed' ORDER BY seq LIMIT 20"
        ).fetchall()
        status[ref.key] = {
            "rows": counts_by_state(actor.connection),
            "failedRows": [dict(row) for row in failed],
        }
        actor.close()
    if args.action == "status":
        print(json.dumps(status, indent=2))
    elif args.json:
        print_json(requeued)
    return 0


def streams(args: argparse.Namespace) -> int:
    async def ensure(app: Rhumbatron) -> None:
        report = await app.ensure_streams()
        print(json.dumps(report.__dict__, indent=2))

    run_on_runtime(ensure)
    return 0
