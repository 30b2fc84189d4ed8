"""``rhumbatron outbox`` (status, requeue) and ``rhumbatron streams``: the actors' outboxes
and the JetStream streams of the local state."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from rhumbatron.cli.common import run_on_runtime

if TYPE_CHECKING:
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["add_outbox_parser", "add_streams_parser", "outbox", "streams"]


def add_outbox_parser(sub: Any) -> None:
    outbox = sub.add_parser("outbox", help="inspect outboxes, or requeue failed rows")
    outbox.add_argument("action", choices=["status", "requeue"])
    outbox.add_argument("--event-id", action="append", help="requeue only these events")


def add_streams_parser(sub: Any) -> None:
    sub.add_parser("streams", help="create or reconcile the JetStream streams")


def outbox(args: argparse.Namespace) -> int:
    from rhumbatron.actors.outbox import counts_by_state
    from rhumbatron.actors.publisher import requeue_failed_rows
    from rhumbatron.runtime.bootstrap import bootstrap

    app = bootstrap()
    status: dict[str, dict[str, object]] = {}
    for ref in app.actor_refs():
        actor = app.actor(ref)
        if args.action == "requeue":
            count = requeue_failed_rows(actor, args.event_id or None)
            if count:
                print(f"{ref.key}: requeued {count} failed rows")
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
    return 0


def streams(args: argparse.Namespace) -> int:
    async def ensure(app: Rhumbatron) -> None:
        report = await app.ensure_streams()
        print(json.dumps(report.__dict__, indent=2))

    run_on_runtime(ensure)
    return 0
