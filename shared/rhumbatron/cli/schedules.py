"""``rhumbatron schedules`` (list, show, create, enable, disable, delete): the local product
database's schedules, as a platform operator."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rhumbatron.cli.common import (
    EXIT_ERROR,
    print_json,
    read_json_object,
    run_registry_command,
)

if TYPE_CHECKING:
    from rhumbatron.reactions.schedule_models import ScheduleRecord
    from rhumbatron.reactions.schedule_registry import ScheduleRegistry

__all__ = ["add_parser", "schedules"]


def add_parser(sub: Any) -> None:
    schedules = sub.add_parser(
        "schedules",
        help="list, show, create, enable, disable or delete schedules (every tenant's)",
        description="Schedules in the local product database, every tenant's unless "
        "--tenant. Each fire lands schedule.fired on its project's stream. Exit status: 2 no "
        "such schedule, 3 the name holds other content.",
    )
    actions = schedules.add_subparsers(dest="action", required=True)
    tenant = argparse.ArgumentParser(add_help=False)
    tenant.add_argument("--tenant", help="only this tenant's schedules")
    listing = actions.add_parser("list", parents=[tenant], help="list schedules")
    listing.add_argument("--enabled-only", action="store_true")
    listing.add_argument("--json", action="store_true", help="print the API's JSON form")
    create = actions.add_parser(
        "create", help="create a schedule from the API's JSON body (idempotent per name)"
    )
    create.add_argument("--tenant", required=True, help="the tenant that owns it")
    create.add_argument(
        "--file",
        required=True,
        help='{"name", "projectId", "mode": "interval"|"daily", "everyMinutes"|"at"}; - stdin',
    )
    for name, text in (
        ("show", "a schedule and the due time of its latest fire"),
        ("enable", "enable a schedule: it fires for due times from now on"),
        ("disable", "disable a schedule: it fires no more until enabled"),
        ("delete", "delete a schedule"),
    ):
        action = actions.add_parser(name, parents=[tenant], help=text)
        action.add_argument("id", help="the schedule's ID (sch_...)")


def schedules(args: argparse.Namespace) -> int:
    """List, show, create, enable, disable or delete schedules in the local product database,
    as a platform operator: every tenant's, or ``--tenant``'s. Exit status: 2 no such
    schedule, 3 the name holds other content, 1 an invalid file or value."""
    from rhumbatron.errors import ScheduleConflictError, ScheduleNotFoundError
    from rhumbatron.reactions.schedule_registry import ScheduleRegistry

    return run_registry_command(
        "schedules",
        "schedule",
        lambda app: _schedule_action(
            ScheduleRegistry(app.product(), app.clock, project_tenant=app.project_tenant), args
        ),
        not_found=(ScheduleNotFoundError,),
        cannot=(ScheduleConflictError,),
    )


def _schedule_action(registry: ScheduleRegistry, args: argparse.Namespace) -> int:
    if args.action == "list":
        return _list(registry, args)
    if args.action == "create":
        return _create(registry, args)
    print_json(_schedule_wire(registry, _change(registry, args)))
    return 0


def _list(registry: ScheduleRegistry, args: argparse.Namespace) -> int:
    records = registry.list(args.tenant, enabled_only=args.enabled_only)
    if args.json:
        print_json([_schedule_wire(registry, r) for r in records])
    for r in () if args.json else records:
        state = "enabled" if r.enabled else "disabled"
        timing = r.timing
        when = (
            f"every {timing.every_minutes} min"
            if timing.mode == "interval"
            else (f"daily at {timing.at} UTC")
        )
        print(f"{r.schedule_id}  {r.tenant_id}  {r.name}  {state}  {when}  -> {r.project_id}")
    if not (args.json or records):
        print("no schedules")
    return 0


def _create(registry: ScheduleRegistry, args: argparse.Namespace) -> int:
    from rhumbatron.api.schedule_schemas import CreateScheduleRequest
    from rhumbatron.reactions.schedule_models import ScheduleTiming

    raw = read_json_object(args.file, "schedules")
    if raw is None:
        return EXIT_ERROR
    body = CreateScheduleRequest.model_validate(raw)
    timing = ScheduleTiming.of(body.mode, every_minutes=body.every_minutes, at=body.at)
    outcome = registry.create(args.tenant, body.name, body.project_id, timing, enabled=body.enabled)
    print_json(_schedule_wire(registry, outcome.record))
    return 0


def _change(registry: ScheduleRegistry, args: argparse.Namespace) -> ScheduleRecord:
    """The schedule ``show`` names, or the one ``delete``, ``enable`` or ``disable``
    changed, as it is now (a deleted one as it was)."""
    from rhumbatron.errors import ScheduleNotFoundError

    if args.action == "show":
        record = registry.get(args.tenant, args.id)
        if record is None:
            raise ScheduleNotFoundError(
                f"no schedule {args.id!r}; `rhumbatron schedules list` shows them"
            )
        return record
    if args.action == "delete":
        return registry.delete(args.tenant, args.id)
    return registry.set_enabled(args.tenant, args.id, args.action == "enable")


def _schedule_wire(registry: ScheduleRegistry, record: ScheduleRecord) -> dict[str, Any]:
    """A schedule as the HTTP API shows it."""
    from rhumbatron.api.schedule_schemas import ScheduleBody

    body = ScheduleBody.of(record, last_fired_for=registry.last_fired(record.schedule_id))
    return body.model_dump(mode="json", by_alias=True)
