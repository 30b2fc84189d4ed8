"""``rhumbatron subscriptions`` (list, show, create, enable, disable, delete, deliveries,
replay-skipped): the local product database's subscriptions, as a platform operator."""

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
    from rhumbatron.reactions.subscription_models import SubscriptionRecord
    from rhumbatron.reactions.subscription_registry import SubscriptionRegistry

__all__ = ["add_parser", "subscriptions"]


def add_parser(sub: Any) -> None:
    subs = sub.add_parser(
        "subscriptions",
        help="list, show, create, enable, disable or delete subscriptions (every tenant's); "
        "list a webhook's deliveries, replay its skipped ones",
        description="Subscriptions in the local product database, every tenant's unless "
        "--tenant. Exit status: 2 no such subscription, 3 the name holds other content.",
    )
    actions = subs.add_subparsers(dest="action", required=True)
    tenant = argparse.ArgumentParser(add_help=False)
    tenant.add_argument("--tenant", help="only this tenant's subscriptions")
    listing = actions.add_parser("list", parents=[tenant], help="list subscriptions")
    listing.add_argument("--enabled-only", action="store_true")
    listing.add_argument("--json", action="store_true", help="print the API's JSON form")
    create = actions.add_parser(
        "create", help="create a subscription from the API's JSON body (idempotent per name)"
    )
    create.add_argument("--tenant", required=True, help="the tenant that owns it")
    create.add_argument(
        "--file", required=True, help='{"name", "selector", "reaction", "governance"}; - stdin'
    )
    for name, text in (
        ("show", "a subscription, without its secrets"),
        ("enable", "enable a subscription (and maybe set its cooldown)"),
        ("disable", "disable a subscription: it matches nothing until enabled"),
        ("delete", "delete a subscription"),
    ):
        action = actions.add_parser(name, parents=[tenant], help=text)
        action.add_argument("id", help="the subscription's ID (sub_...)")
        if name in ("enable", "disable"):
            action.add_argument("--cooldown-s", type=int, help="seconds between reactions")
    _add_delivery_parsers(actions, tenant)


def _add_delivery_parsers(actions: Any, tenant: argparse.ArgumentParser) -> None:
    deliveries = actions.add_parser(
        "deliveries", parents=[tenant], help="a webhook subscription's deliveries, newest first"
    )
    deliveries.add_argument("id", help="the subscription's ID (sub_...)")
    deliveries.add_argument(
        "--status",
        action="append",
        choices=["delivered", "retrying", "dead", "skipped"],
        help="only these (repeatable)",
    )
    deliveries.add_argument("--limit", type=int, default=100)
    replay = actions.add_parser(
        "replay-skipped",
        parents=[tenant],
        help="make the deliveries kept while its endpoint was disabled due again",
    )
    replay.add_argument("id", help="the subscription's ID (sub_...); enable it first")


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
