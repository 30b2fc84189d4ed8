"""The ``rhumbatron`` command: ``demo``, ``outbox`` (inspect, requeue) and ``streams``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _outbox(args: argparse.Namespace) -> int:
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


def _streams(args: argparse.Namespace) -> int:
    from rhumbatron.runtime.bootstrap import bootstrap

    async def run() -> None:
        app = bootstrap()
        try:
            report = await app.ensure_streams()
            print(json.dumps(report.__dict__, indent=2))
        finally:
            await app.close()

    asyncio.run(run())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rhumbatron")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the sample scenario on the embedded stack", add_help=False)
    outbox = sub.add_parser("outbox", help="inspect outboxes, or requeue failed rows")
    outbox.add_argument("action", choices=["status", "requeue"])
    outbox.add_argument("--event-id", action="append", help="requeue only these events")
    sub.add_parser("streams", help="create or reconcile the JetStream streams")
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from rhumbatron.demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "outbox":
        return _outbox(args)
    return _streams(args)


if __name__ == "__main__":
    sys.exit(main())
