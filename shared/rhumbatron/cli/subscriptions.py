"""``rhumbatron subscriptions`` (list, show, create, enable, disable, delete, deliveries,
replay-skipped): the local product database's subscriptions, as a platform operator."""

from __future__ import annotations

import argparse
from enum import StrEnum
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
    from rhumbatron.reactions.subscription_models import SubscriptionRecord
    from rhumbatron.reactions.subscription_registry import SubscriptionRegistry

__all__ = ["app", "subscriptions"]

app = typer.Typer(
    help="List, show, create, enable, disable or delete subscriptions (every tenant's unless "
    "--tenant); list a webhook's deliveries, replay its skipped ones. Exit status: 2 no such "
    "subscription, 3 the name holds other content.",
    no_args_is_help=True,
)

SubscriptionId = Annotated[
    str, typer.Argument(metavar="ID", help="The subscription's ID (sub_...).")
]
Cooldown = Annotated[int | None, typer.Option("--cooldown-s", help="Seconds between reactions.")]


class DeliveryState(StrEnum):
    DELIVERED = "delivered"
    RETRYING = "retrying"
    DEAD = "dead"
    SKIPPED = "skipped"


def _run(action: str, **values: Any) -> int:
    return subscriptions(argparse.Namespace(action=action, **values))


@app.command("list", cls=GuardedCommand)
def list_command(
    tenant: TenantFilter = None,
    enabled_only: Annotated[
        bool, typer.Option("--enabled-only", help="Only the enabled subscriptions.")
    ] = False,
    json_: JsonFlag = False,
) -> int:
    """List subscriptions."""
    return _run("list", tenant=tenant, enabled_only=enabled_only, json=json_)


@app.command("create", cls=GuardedCommand)
def create_command(
    tenant: Annotated[str, typer.Option(help="The tenant that owns it.")],
    file: Annotated[
        str,
        typer.Option(
            help='The API\'s JSON body {"name", "selector", "reaction", "governance"}; - stdin.'
        ),
    ],
    json_: JsonAlways = False,
) -> int:
    """Create a subscription from the API's JSON body (idempotent per name)."""
    return _run("create", tenant=tenant, file=file, json=json_)


@app.command("show", cls=GuardedCommand)
def show_command(
    sub_id: SubscriptionId, tenant: TenantFilter = None, json_: JsonAlways = False
) -> int:
    """A subscription, without its secrets (JSON)."""
    return _run("show", id=sub_id, tenant=tenant, json=json_)


@app.command("enable", cls=GuardedCommand)
def enable_command(
    sub_id: SubscriptionId,
    tenant: TenantFilter = None,
    cooldown_s: Cooldown = None,
    json_: JsonAlways = False,
) -> int:
    """Enable a subscription (and maybe set its cooldown)."""
    return _run("enable", id=sub_id, tenant=tenant, cooldown_s=cooldown_s, json=json_)


@app.command("disable", cls=GuardedCommand)
def disable_command(
    sub_id: SubscriptionId,
    tenant: TenantFilter = None,
    cooldown_s: Cooldown = None,
    json_: JsonAlways = False,
) -> int:
    """Disable a subscription: it matches nothing until enabled."""
    return _run("disable", id=sub_id, tenant=tenant, cooldown_s=cooldown_s, json=json_)


@app.command("delete", cls=GuardedCommand)
def delete_command(
    sub_id: SubscriptionId, tenant: TenantFilter = None, json_: JsonAlways = False
) -> int:
    """Delete a subscription; print it as it was."""
    return _run("delete", id=sub_id, tenant=tenant, json=json_)


@app.command("deliveries", cls=GuardedCommand)
def deliveries_command(
    sub_id: SubscriptionId,
    tenant: TenantFilter = None,
    status: Annotated[
        list[DeliveryState] | None, typer.Option(help="Only these (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    json_: JsonAlways = False,
) -> int:
    """A webhook subscription's deliveries, newest first (JSON)."""
    statuses = [s.value for s in status] if status else None
    return _run("deliveries", id=sub_id, tenant=tenant, status=statuses, limit=limit, json=json_)


@app.command("replay-skipped", cls=GuardedCommand)
def replay_skipped_command(
    sub_id: Annotated[
        str, typer.Argument(metavar="ID", help="The subscription's ID (sub_...); enable it first.")
    ],
    tenant: TenantFilter = None,
    json_: JsonFlag = False,
) -> int:
    """Make the deliveries kept while its endpoint was disabled due again."""
    return _run("replay-skipped", id=sub_id, tenant=tenant, json=json_)


def subscriptions(args: argparse.Namespace) -> int:
    """List, show, create, enable, disable or delete subscriptions in the local product
    database, as a platform operator: every tenant's, or ``--tenant``'s; list a webhook's
    deliveries and replay its skipped ones. Exit status: 2 no such subscription, 3 the name
    holds other content (or a replay of a disabled one), 1 an invalid file or value."""
    from rhumbatron.errors import (
        SubscriptionConflictError,
        SubscriptionDisabledError,
        SubscriptionNotFoundError,
    )
    from rhumbatron.reactions.subscription_registry import SubscriptionRegistry

    return run_registry_command(
        "subscriptions",
        "subscription",
        lambda app: _subscription_action(
            SubscriptionRegistry(app.product(), app.settings, app.clock), args
        ),
        not_found=(SubscriptionNotFoundError,),
        cannot=(SubscriptionConflictError, SubscriptionDisabledError),
    )


def _subscription_action(registry: SubscriptionRegistry, args: argparse.Namespace) -> int:
    if args.action == "list":
        return _list(registry, args)
    if args.action == "create":
        return _create(registry, args)
    if args.action == "deliveries":
        return _deliveries(registry, args)
    if args.action == "replay-skipped":
        return _replay_skipped(registry, args)
    print_json(_subscription_wire(_change(registry, args)))
    return 0


def _list(registry: SubscriptionRegistry, args: argparse.Namespace) -> int:
    records = registry.list(args.tenant, enabled_only=args.enabled_only)
    if args.json:
        print_json([_subscription_wire(r) for r in records])
    for r in () if args.json else records:
        state = "enabled" if r.governance.enabled else "disabled"
        kinds = ",".join(r.selector.kinds)
        reaction = r.reaction.kind
        print(f"{r.subscription_id}  {r.tenant_id}  {r.name}  {state}  {kinds}  -> {reaction}")
    if not (args.json or records):
        print("no subscriptions")
    return 0


def _create(registry: SubscriptionRegistry, args: argparse.Namespace) -> int:
    from pydantic import TypeAdapter

    from rhumbatron.reactions.selectors import Selector
    from rhumbatron.reactions.subscription_models import Governance, Reaction

    raw = read_json_object(args.file, "subscriptions")
    if raw is None:
        return EXIT_ERROR
    outcome = registry.create(
        args.tenant,
        str(raw.get("name", "")),
        Selector.parse(raw.get("selector") or {}),
        TypeAdapter(Reaction).validate_python(raw.get("reaction")),
        Governance.model_validate(raw.get("governance") or {}),
    )
    print_json(_subscription_wire(outcome.record, outcome.generated_secret))
    return 0


def _change(registry: SubscriptionRegistry, args: argparse.Namespace) -> SubscriptionRecord:
    """The subscription ``show`` names, or the one ``delete``, ``enable`` or ``disable``
    changed, as it is now (a deleted one as it was)."""
    from rhumbatron.errors import SubscriptionNotFoundError

    if args.action == "show":
        record = registry.get(args.tenant, args.id)
        if record is None:
            raise SubscriptionNotFoundError(
                f"no subscription {args.id!r}; `rhumbatron subscriptions list` shows them"
            )
        return record
    if args.action == "delete":
        return registry.delete(args.tenant, args.id)
    enabled = args.action == "enable"
    return registry.set_governance(
        args.tenant, args.id, enabled=enabled, cooldown_s=args.cooldown_s
    )


def _deliveries(registry: SubscriptionRegistry, args: argparse.Namespace) -> int:
    from rhumbatron.api.subscription_schemas import DeliveryBody
    from rhumbatron.reactions.webhook_ledger import DeliveryStatus

    deliveries = registry.deliveries(
        args.tenant,
        args.id,
        statuses=[DeliveryStatus(s) for s in args.status or ()],
        limit=args.limit,
    )
    print_json([DeliveryBody.of(d).model_dump(mode="json", by_alias=True) for d in deliveries])
    return 0


def _replay_skipped(registry: SubscriptionRegistry, args: argparse.Namespace) -> int:
    replayed = registry.replay_skipped(args.tenant, args.id)
    if args.json:
        print_json({"id": args.id, "replayed": replayed})
        return 0
    print(
        f"{replayed} skipped deliveries of {args.id} are due again; the next sweep tick "
        "sends them (a batch per tick, through the admission gate)"
    )
    return 0


def _subscription_wire(record: SubscriptionRecord, secret: str | None = None) -> dict[str, Any]:
    """A subscription as the HTTP API shows it: no secret, except one just generated."""
    from rhumbatron.api.subscription_schemas import SubscriptionBody

    body = SubscriptionBody.of(record, generated_secret=secret)
    return body.model_dump(mode="json", by_alias=True)
