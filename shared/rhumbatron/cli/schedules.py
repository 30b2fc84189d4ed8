"""``rhumbatron schedules`` (list, show, create, enable, disable, delete): the local product
database's schedules, as a platform operator."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rhumbatron.cli.common import (
    EXIT_ERROR,
    print_json,
    read_json_object,
    run_registry_command,
)
from rhumbatron.cli.guard import GuardedCommand
from rhumbatron.cli.options import JsonAlways, JsonFlag, TenantFilter

if TYPE_CHECKING:
    from rhumbatron.reactions.schedule_models import ScheduleRecord
    from rhumbatron.reactions.schedule_registry import ScheduleRegistry

__all__ = ["app", "schedules"]

app = typer.Typer(
    help="List, show, create, enable, disable or delete schedules (every tenant's unless "
    "--tenant). Each fire lands schedule.fired on its project's stream. Exit status: 2 no "
    "such schedule, 3 the name holds other content.",
    no_args_is_help=True,
)

ScheduleId = Annotated[str, typer.Argument(metavar="ID", help="The schedule's ID (sch_...).")]


def _run(action: str, **values: Any) -> int:
    return schedules(argparse.Namespace(action=action, **values))


@app.command("list", cls=GuardedCommand)
def list_command(
    tenant: TenantFilter = None,
    enabled_only: Annotated[
        bool, typer.Option("--enabled-only", help="Only the enabled schedules.")
    ] = False,
    json_: JsonFlag = False,
) -> int:
    """List schedules."""
    return _run("list", tenant=tenant, enabled_only=enabled_only, json=json_)


@app.command("create", cls=GuardedCommand)
def create_command(
    tenant: Annotated[str, typer.Option(help="The tenant that owns it.")],
    file: Annotated[
        str,
        typer.Option(
            help='The API\'s JSON body {"name", "projectId", "mode": "interval"|"daily", '
            '"everyMinutes"|"at"}; - stdin.'
        ),
    ],
    json_: JsonAlways = False,
) -> int:
    """Create a schedule from the API's JSON body (idempotent per name)."""
    return _run("create", tenant=tenant, file=file, json=json_)


@app.command("show", cls=GuardedCommand)
def show_command(sch_id: ScheduleId, tenant: TenantFilter = None, json_: JsonAlways = False) -> int:
    """A schedule and the due time of its latest fire (JSON)."""
    return _run("show", id=sch_id, tenant=tenant, json=json_)


@app.command("enable", cls=GuardedCommand)
def enable_command(
    sch_id: ScheduleId, tenant: TenantFilter = None, json_: JsonAlways = False
) -> int:
    """Enable a schedule: it fires for due times from now on."""
    return _run("enable", id=sch_id, tenant=tenant, json=json_)


@app.command("disable", cls=GuardedCommand)
def disable_command(
    sch_id: ScheduleId, tenant: TenantFilter = None, json_: JsonAlways = False
) -> int:
    """Disable a schedule: it fires no more until enabled."""
    return _run("disable", id=sch_id, tenant=tenant, json=json_)


@app.command("delete", cls=GuardedCommand)
def delete_command(
    sch_id: ScheduleId, tenant: TenantFilter = None, json_: JsonAlways = False
) -> int:
    """Delete a schedule; print it as it was."""
    return _run("delete", id=sch_id, tenant=tenant, json=json_)


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
