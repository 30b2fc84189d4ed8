"""The ``rhumbatron`` command: ``outbox`` (inspect, requeue), ``streams``, ``dead-letters``
(list, show, retry, dismiss), ``kinds`` (the Event kind grammar), ``subscriptions`` and
``schedules`` (list, show, create, enable, disable, delete), ``api`` (serve the operator API);
and ``demo``, ``up`` (the local stack, API and dashboard) and ``invoke`` (one function of
``template.yaml``, here), which run the development package :mod:`rhumbatron_dev`, imported
only when they run (the Lambda layer leaves it out).

``dead-letters`` acts on the local state directory and NATS (``RHUMBATRON_*`` settings)
through the same operator functions as the HTTP API, as a platform operator: it sees every
tenant's letters. Exit status, so scripts can tell the failures apart:

==  =====================================================================================
0   done (a Retry that finds its attempt already sent is done: it sends nothing)
1   anything else went wrong (bad settings, an unreadable product file), with the reason
2   no dead letter with that ID (or a usage error, as argparse reports it)
3   the letter cannot take that action: it is closed, or it can only be dismissed
4   NATS did not take the Retry (down, or JetStream refused it); nothing is reserved
==  =====================================================================================
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rhumbatron.operator import Inspection, RetryOutcome
    from rhumbatron.product.dead_letters import DeadLetter
    from rhumbatron.reactions.schedule_models import ScheduleRecord
    from rhumbatron.reactions.schedule_registry import ScheduleRegistry
    from rhumbatron.reactions.subscription_models import SubscriptionRecord
    from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = [
    "EXIT_CANNOT",
    "EXIT_ERROR",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "main",
]

EXIT_ERROR = 1
EXIT_NOT_FOUND = 2
EXIT_CANNOT = 3
EXIT_UNAVAILABLE = 4


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


# -- dead letters ------------------------------------------------------------------------------


def _dead_letters(args: argparse.Namespace) -> int:
    """Run one dead-letter action; map the operator's errors to the exit statuses above."""
    from rhumbatron.errors import (
        DeadLetterError,
        DeadLetterNotFoundError,
        MessagingError,
        RhumbatronError,
    )
    from rhumbatron.runtime.bootstrap import bootstrap

    # nats-py logs every failed connect attempt with a traceback; this command says in one
    # line that NATS did not answer (exit 4), so the library's retries are only noise here.
    logging.getLogger("nats").setLevel(logging.CRITICAL)

    async def run() -> int:
        # One event loop for the whole action: the runtime's NATS connection (a Retry) opens
        # on it and must be drained on it.
        app = bootstrap()
        try:
            return await _dead_letter_action(app, args)
        finally:
            await app.close()

    try:
        return asyncio.run(run())
    except DeadLetterNotFoundError as exc:
        return _fail(
            EXIT_NOT_FOUND, f"{exc}; `rhumbatron dead-letters list --status all` shows all"
        )
    except DeadLetterError as exc:
        # Closed, a poison event, or a body that is no Command: the API's 409.
        return _fail(EXIT_CANNOT, str(exc))
    except MessagingError as exc:
        return _fail(EXIT_UNAVAILABLE, str(exc))
    except RhumbatronError as exc:
        return _fail(EXIT_ERROR, str(exc))


def _fail(status: int, message: str, *, command: str = "dead-letters") -> int:
    print(f"rhumbatron {command}: {message}", file=sys.stderr)
    return status


async def _dead_letter_action(app: Rhumbatron, args: argparse.Namespace) -> int:
    from rhumbatron import operator
    from rhumbatron.product.dead_letters import DeadLetterKind

    tenant = operator.ANY_TENANT
    if args.action == "list":
        letters = _all_letters(app, args)
        if args.json:
            _print_json([_wire(letter) for letter in letters])
        else:
            _print_table(letters, args.status)
    elif args.action == "show":
        inspection = operator.inspect_dead_letter(app, args.id, tenant_id=tenant)
        if args.json:
            _print_json(_wire_detail(inspection))
        else:
            _print_inspection(inspection)
    elif args.action == "retry":
        # An unknown, closed or poison letter is answered as such (2, 3) even while NATS is
        # down; retry_dead_letter checks again, in the transaction that reserves the Retry.
        inspection = operator.inspect_dead_letter(app, args.id, tenant_id=tenant)
        _refuse_retry_early(inspection)
        if inspection.letter.kind is not DeadLetterKind.REACTION:
            await _ensure_streams(app)  # a webhook delivery's Retry sends nothing on NATS
        outcome = await operator.retry_dead_letter(app, args.id, tenant_id=tenant)
        if args.json:
            from rhumbatron.api.schemas import RetryBody

            _print_json(RetryBody.of(outcome).model_dump(mode="json", by_alias=True))
        else:
            print(_retry_line(outcome))
    else:
        letter = operator.dismiss_dead_letter(app, args.id, tenant_id=tenant)
        if args.json:
            _print_json(_wire(letter))
        else:
            print(f"dead letter {letter.dead_letter_id} dismissed: closed, resolution dismissed")
    return 0


def _all_letters(app: Rhumbatron, args: argparse.Namespace) -> list[DeadLetter]:
    """Every letter the filters match, oldest first, page after page."""
    from rhumbatron import operator
    from rhumbatron.product.dead_letters import DeadLetterKind, DeadLetterStatus

    letters: list[DeadLetter] = []
    after: str | None = None
    while True:
        page = operator.list_dead_letters(
            app,
            tenant_id=operator.ANY_TENANT,
            status=None if args.status == "all" else DeadLetterStatus(args.status),
            kind=DeadLetterKind(args.kind) if args.kind else None,
            queue=args.queue,
            project_id=args.project,
            after=after,
            limit=operator.MAX_PAGE,
        )
        letters += page.letters
        if page.next_after is None:
            return letters
        after = page.next_after


def _refuse_retry_early(inspection: Inspection) -> None:
    """Raise what the Retry itself would for a closed letter or one that can only be
    dismissed, before the command opens a NATS connection it will not need."""
    from rhumbatron.errors import DeadLetterClosedError, DeadLetterError
    from rhumbatron.product.dead_letters import DeadLetterKind, DeadLetterStatus

    letter = inspection.letter
    if letter.status is DeadLetterStatus.CLOSED:
        raise DeadLetterClosedError(
            f"dead letter {letter.dead_letter_id} is already closed ({letter.resolution})"
        )
    if letter.kind is DeadLetterKind.POISON_EVENT:
        raise DeadLetterError(
            f"dead letter {letter.dead_letter_id} is a poison event of {letter.consumer}; it "
            f"can only be dismissed: rhumbatron dead-letters dismiss {letter.dead_letter_id}"
        )
    if letter.kind is DeadLetterKind.REACTION:
        return  # a webhook delivery: its Retry re-arms it, there is no Command to check
    if inspection.command is None:
        raise DeadLetterError(
            f"dead letter {letter.dead_letter_id} holds no valid Command "
            f"({inspection.body_problem}); it can only be dismissed"
        )


async def _ensure_streams(app: Rhumbatron) -> None:
    """The COMMANDS stream must exist before a Retry reserves anything, as the API makes
    sure before its first send; NATS down here means nothing was reserved."""
    from nats.errors import Error as NatsError

    from rhumbatron.errors import NatsUnavailableError

    try:
        await app.ensure_streams()
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"cannot reach JetStream at {app.settings.nats_url}: {type(exc).__name__}: {exc}; "
            "nothing was retried"
        ) from exc


def _retry_line(outcome: RetryOutcome) -> str:
    letter = outcome.letter
    if outcome.queue == "reactions":
        if not outcome.sent:
            return (
                f"dead letter {letter.dead_letter_id}: webhook delivery {outcome.message_id} "
                f"was already retried as attempt {outcome.already_retried_as}; nothing changed"
            )
        return (
            f"dead letter {letter.dead_letter_id}: webhook delivery {outcome.message_id} is due "
            "again; the next sweep tick sends it with the same webhook-id (the letter closes "
            "when it is delivered, and opens again if it fails)"
        )
    what = f"{letter.command_type} {letter.command_id}"
    if outcome.sent:
        return (
            f"dead letter {letter.dead_letter_id}: sent {what} again as attempt "
            f"{outcome.attempt} on {outcome.queue} (message {outcome.message_id}); the letter "
            "closes as succeeded when it succeeds, and opens again if it fails again"
        )
    if outcome.duplicate:
        return (
            f"dead letter {letter.dead_letter_id}: attempt {outcome.attempt} of {what} had "
            f"already reached {outcome.queue} (message {outcome.message_id}); nothing new sent"
        )
    return (
        f"dead letter {letter.dead_letter_id}: already retried as attempt "
        f"{outcome.already_retried_as} on {outcome.queue}; nothing sent (a Retry sends once)"
    )


def _wire(letter: DeadLetter) -> dict[str, Any]:
    """A letter as the HTTP API shows it in a list."""
    from rhumbatron.api.schemas import DeadLetterSummary

    return DeadLetterSummary.of(letter).model_dump(mode="json", by_alias=True)


def _wire_detail(inspection: Inspection) -> dict[str, Any]:
    """A letter as the HTTP API shows it on its own, with its body."""
    from rhumbatron.api.schemas import DeadLetterDetail

    return DeadLetterDetail.of_inspection(inspection).model_dump(mode="json", by_alias=True)


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


def _at(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one_line(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _print_table(letters: Sequence[DeadLetter], status: str) -> None:
    if not letters:
        print(f"no dead letters (status {status})")
        return
    rows = [
        (
            letter.dead_letter_id,
            letter.status.value,
            letter.resolution or "-",
            letter.kind.value,
            letter.queue or letter.consumer or "-",
            letter.command_type or letter.event_id or "-",
            str(letter.attempt) if letter.attempt is not None else "-",
            _at(letter.created_at_s),
            _one_line(letter.reason, 60),
        )
        for letter in letters
    ]
    header = ("ID", "STATUS", "RESOLUTION", "KIND", "QUEUE", "TYPE", "ATTEMPT", "CREATED", "REASON")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    for row in (header, *rows):
        print("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]))
    print(f"{len(letters)} dead letter(s) (status {status})")


def _print_inspection(inspection: Inspection) -> None:
    from rhumbatron.product.dead_letters import DeadLetterKind, DeadLetterStatus

    letter = inspection.letter
    retried = (
        f", retried as attempt {letter.retried_attempt} at {_at(letter.retried_at_s)}"
        if letter.retried_attempt is not None
        else ""
    )
    fields = [
        ("id", letter.dead_letter_id),
        ("kind", letter.kind.value),
        ("status", letter.status.value),
        ("resolution", letter.resolution or "-"),
        ("tenant", letter.tenant_id or "-"),
        ("project", letter.project_id or "-"),
        ("change", letter.change_id or "-"),
        ("task", letter.task_id or "-"),
    ]
    if letter.kind is DeadLetterKind.COMMAND:
        fields += [
            ("command", f"{letter.command_type} {letter.command_id}"),
            ("queue", letter.queue or "-"),
            ("attempt", f"{letter.attempt}{retried}"),
        ]
    else:
        fields += [
            ("consumer", letter.consumer or "-"),
            ("event", letter.event_id or "-"),
            ("stream", f"{letter.stream} seq {letter.stream_seq}"),
        ]
    fields += [
        ("created", _at(letter.created_at_s)),
        ("updated", _at(letter.updated_at_s)),
        ("closed", _at(letter.closed_at_s)),
        ("last error", letter.reason),
    ]
    for label, value in fields:
        print(f"{label + ':':<12}{value}")
    if inspection.body_problem:
        print(f"{'body:':<12}not a valid Command: {inspection.body_problem}")
    print("command:" if inspection.command is not None else "body:")
    if inspection.command is not None:
        print(json.dumps(inspection.command.to_wire(), indent=2))
    elif inspection.body_json is not None:
        print(json.dumps(inspection.body_json, indent=2))
    else:
        print(letter.body)
    if letter.status is DeadLetterStatus.OPEN:
        actions = ["dismiss"]
        if letter.kind is DeadLetterKind.COMMAND and inspection.command is not None:
            actions.insert(0, "retry")
        commands = [f"rhumbatron dead-letters {a} {letter.dead_letter_id}" for a in actions]
        print("next: " + " | ".join(commands))


# -- the kind grammar --------------------------------------------------------------------------


def _kinds(args: argparse.Namespace) -> int:
    """Print every Event kind: subject, whether it can trigger reactions, its payload."""
    from rhumbatron.reactions.kinds import kinds_table, list_kinds

    rows = list_kinds()
    if args.json:
        _print_json(rows)
    else:
        print(kinds_table(rows))
    return 0


# -- replay ------------------------------------------------------------------------------------


def _replay(args: argparse.Namespace) -> int:
    """Rewind a subscription over a stream, or replay an archive range, through its claims:
    only events it never applied take effect. ``--dry-run`` counts and changes nothing."""
    import dataclasses
    from datetime import datetime

    from rhumbatron.errors import ReplayError, RhumbatronError
    from rhumbatron.router.replay import run_replay
    from rhumbatron.runtime.bootstrap import bootstrap

    def when(value: str | None, option: str) -> datetime | None:
        if value is None:
            return None
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ReplayError(f"{option} {value!r} is not an ISO-8601 time") from None
        if moment.tzinfo is None:
            raise ReplayError(f"{option} {value!r} needs a timezone (e.g. 2026-11-29T10:00Z)")
        return moment

    async def run() -> int:
        app = bootstrap()
        try:
            report = await run_replay(
                app,
                source=args.source,
                subscription=args.subscription,
                dry_run=args.dry_run,
                stream=args.stream,
                to_seq=args.to_seq,
                to_time=when(args.to_time, "--to-time"),
                start=when(args.start, "--start"),
                end=when(args.end, "--end"),
            )
        finally:
            await app.close()
        print(json.dumps(dataclasses.asdict(report), indent=2, default=str))
        return EXIT_ERROR if report.failed else 0

    # nats-py logs each failed connect with a traceback; the one-line error below says it.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    try:
        return asyncio.run(run())
    except ReplayError as exc:
        return _fail(EXIT_CANNOT, str(exc), command="replay")
    except RhumbatronError as exc:
        return _fail(EXIT_ERROR, str(exc), command="replay")


# -- subscriptions -----------------------------------------------------------------------------


def _subscriptions(args: argparse.Namespace) -> int:
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

    return _registry_command(
        "subscriptions",
        "subscription",
        lambda app: _subscription_action(
            SubscriptionRegistry(app.product(), app.settings, app.clock), args
        ),
        not_found=(SubscriptionNotFoundError,),
        cannot=(SubscriptionConflictError, SubscriptionDisabledError),
    )


def _registry_command(
    command: str,
    what: str,
    act: Callable[[Rhumbatron], int],
    *,
    not_found: tuple[type[Exception], ...],
    cannot: tuple[type[Exception], ...],
) -> int:
    """Run ``act`` on a runtime of the local state (subscriptions, schedules), answering its
    refusals with the exit statuses: 2 not found, 3 cannot, 1 an invalid value or anything
    else."""
    from pydantic import ValidationError

    from rhumbatron.errors import RhumbatronError
    from rhumbatron.runtime.bootstrap import bootstrap

    try:
        app = bootstrap()
        try:
            return act(app)
        finally:
            app.product().close()
    except not_found as exc:
        return _fail(EXIT_NOT_FOUND, str(exc), command=command)
    except cannot as exc:
        return _fail(EXIT_CANNOT, str(exc), command=command)
    except ValidationError as exc:
        # Location and message only: pydantic's own text quotes the input, maybe a secret.
        problems = "; ".join(
            ".".join(str(part) for part in error["loc"]) + ": " + error["msg"]
            for error in exc.errors(include_url=False)
        )
        return _fail(EXIT_ERROR, f"invalid {what}: {problems}", command=command)
    except RhumbatronError as exc:
        return _fail(EXIT_ERROR, str(exc), command=command)


def _subscription_action(registry: SubscriptionRegistry, args: argparse.Namespace) -> int:
    from pathlib import Path

    from pydantic import TypeAdapter

    from rhumbatron.errors import SubscriptionNotFoundError
    from rhumbatron.reactions.selectors import Selector
    from rhumbatron.reactions.subscription_models import Governance, Reaction

    if args.action == "list":
        records = registry.list(args.tenant, enabled_only=args.enabled_only)
        if args.json:
            _print_json([_subscription_wire(r) for r in records])
        for r in () if args.json else records:
            state = "enabled" if r.governance.enabled else "disabled"
            kinds = ",".join(r.selector.kinds)
            reaction = r.reaction.kind
            print(f"{r.subscription_id}  {r.tenant_id}  {r.name}  {state}  {kinds}  -> {reaction}")
        if not (args.json or records):
            print("no subscriptions")
        return 0
    if args.action == "create":
        try:
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
            raw = json.loads(text)
        except (OSError, ValueError) as exc:
            return _fail(
                EXIT_ERROR, f"cannot read {args.file!r} as JSON: {exc}", command="subscriptions"
            )
        if not isinstance(raw, dict):
            return _fail(
                EXIT_ERROR, f"{args.file!r} must hold a JSON object", command="subscriptions"
            )
        outcome = registry.create(
            args.tenant,
            str(raw.get("name", "")),
            Selector.parse(raw.get("selector") or {}),
            TypeAdapter(Reaction).validate_python(raw.get("reaction")),
            Governance.model_validate(raw.get("governance") or {}),
        )
        _print_json(_subscription_wire(outcome.record, outcome.generated_secret))
        return 0
    if args.action == "show":
        record = registry.get(args.tenant, args.id)
        if record is None:
            raise SubscriptionNotFoundError(
                f"no subscription {args.id!r}; `rhumbatron subscriptions list` shows them"
            )
    elif args.action == "delete":
        record = registry.delete(args.tenant, args.id)
    elif args.action == "deliveries":
        from rhumbatron.api.subscription_schemas import DeliveryBody
        from rhumbatron.reactions.webhook_ledger import DeliveryStatus

        deliveries = registry.deliveries(
            args.tenant,
            args.id,
            statuses=[DeliveryStatus(s) for s in args.status or ()],
            limit=args.limit,
        )
        _print_json([DeliveryBody.of(d).model_dump(mode="json", by_alias=True) for d in deliveries])
        return 0
    elif args.action == "replay-skipped":
        replayed = registry.replay_skipped(args.tenant, args.id)
        print(
            f"{replayed} skipped deliveries of {args.id} are due again; the next sweep tick "
            "sends them (a batch per tick, through the admission gate)"
        )
        return 0
    else:
        enabled = args.action == "enable"
        record = registry.set_governance(
            args.tenant, args.id, enabled=enabled, cooldown_s=args.cooldown_s
        )
    _print_json(_subscription_wire(record))
    return 0


def _subscription_wire(record: SubscriptionRecord, secret: str | None = None) -> dict[str, Any]:
    """A subscription as the HTTP API shows it: no secret, except one just generated."""
    from rhumbatron.api.subscription_schemas import SubscriptionBody

    body = SubscriptionBody.of(record, generated_secret=secret)
    return body.model_dump(mode="json", by_alias=True)


def _subscriptions_parser(sub: Any) -> None:
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


# -- schedules ---------------------------------------------------------------------------------


def _schedules(args: argparse.Namespace) -> int:
    """List, show, create, enable, disable or delete schedules in the local product database,
    as a platform operator: every tenant's, or ``--tenant``'s. Exit status: 2 no such
    schedule, 3 the name holds other content, 1 an invalid file or value."""
    from rhumbatron.errors import ScheduleConflictError, ScheduleNotFoundError
    from rhumbatron.reactions.schedule_registry import ScheduleRegistry

    return _registry_command(
        "schedules",
        "schedule",
        lambda app: _schedule_action(
            ScheduleRegistry(app.product(), app.clock, project_tenant=app.project_tenant), args
        ),
        not_found=(ScheduleNotFoundError,),
        cannot=(ScheduleConflictError,),
    )


def _schedule_action(registry: ScheduleRegistry, args: argparse.Namespace) -> int:
    from pathlib import Path

    from rhumbatron.api.schedule_schemas import CreateScheduleRequest
    from rhumbatron.errors import ScheduleNotFoundError
    from rhumbatron.reactions.schedule_models import ScheduleTiming

    if args.action == "list":
        records = registry.list(args.tenant, enabled_only=args.enabled_only)
        if args.json:
            _print_json([_schedule_wire(registry, r) for r in records])
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
    if args.action == "create":
        try:
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
            raw = json.loads(text)
        except (OSError, ValueError) as exc:
            return _fail(
                EXIT_ERROR, f"cannot read {args.file!r} as JSON: {exc}", command="schedules"
            )
        if not isinstance(raw, dict):
            return _fail(EXIT_ERROR, f"{args.file!r} must hold a JSON object", command="schedules")
        body = CreateScheduleRequest.model_validate(raw)
        timing = ScheduleTiming.of(body.mode, every_minutes=body.every_minutes, at=body.at)
        outcome = registry.create(
            args.tenant, body.name, body.project_id, timing, enabled=body.enabled
        )
        _print_json(_schedule_wire(registry, outcome.record))
        return 0
    if args.action == "show":
        record = registry.get(args.tenant, args.id)
        if record is None:
            raise ScheduleNotFoundError(
                f"no schedule {args.id!r}; `rhumbatron schedules list` shows them"
            )
    elif args.action == "delete":
        record = registry.delete(args.tenant, args.id)
    else:
        record = registry.set_enabled(args.tenant, args.id, args.action == "enable")
    _print_json(_schedule_wire(registry, record))
    return 0


def _schedule_wire(registry: ScheduleRegistry, record: ScheduleRecord) -> dict[str, Any]:
    """A schedule as the HTTP API shows it."""
    from rhumbatron.api.schedule_schemas import ScheduleBody

    body = ScheduleBody.of(record, last_fired_for=registry.last_fired(record.schedule_id))
    return body.model_dump(mode="json", by_alias=True)


def _schedules_parser(sub: Any) -> None:
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


# -- the operator API --------------------------------------------------------------------------


def _api(args: argparse.Namespace) -> int:
    """Serve the operator API with uvicorn until interrupted. Exit status 1 (``EXIT_ERROR``),
    with one line on stderr naming the variable, when a setting cannot work (a
    ``RHUMBATRON_API_TOKENS`` that is not a JSON object of grants, ...): checked before any
    port is bound."""
    try:
        import uvicorn
    except ImportError:
        print(
            "rhumbatron api: uvicorn is not installed; install the local extra "
            "(pip install -e '.[local]')",
            file=sys.stderr,
        )
        return EXIT_ERROR
    from rhumbatron.api import authenticator_from_settings, create_api
    from rhumbatron.errors import RhumbatronError
    from rhumbatron.runtime.bootstrap import bootstrap

    try:
        app = bootstrap()
        api = create_api(app, authenticator_from_settings(app.settings, app.clock))
    except RhumbatronError as exc:
        print(f"rhumbatron api: {exc}", file=sys.stderr)
        return EXIT_ERROR
    settings = app.settings
    if settings.api_auth_mode == "static" and not settings.api_tokens:
        print(
            "rhumbatron api: RHUMBATRON_API_TOKENS is empty, so every request but /health is "
            "refused (401); set it to JSON such as "
            '\'{"<token>": {"tenant": "*", "scopes": ["dead-letters:read", '
            '"dead-letters:write", "commands:send"]}}\'',
            file=sys.stderr,
        )
    print(
        f"rhumbatron api: http://{args.host}:{args.port} (OpenAPI at /openapi.json, docs at "
        f"/docs), {settings.api_auth_mode} bearer tokens, NATS {settings.nats_url}, state "
        f"{settings.state_dir}",
        file=sys.stderr,
    )
    # The app's lifespan ensures the streams at start-up and drains NATS at shutdown.
    # uvicorn shuts down gracefully on Ctrl-C, then raises the signal again; the operator
    # asked for the stop, so it is no error and needs no traceback.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.run(api, host=args.host, port=args.port, log_level=args.log_level)
    return 0


# -- entry point -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rhumbatron")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the sample project's Change lifecycle locally", add_help=False)
    sub.add_parser(
        "up",
        help="the embedded stack, the API and a live dashboard on 127.0.0.1, every role on "
        "its schedule (--root, --port, --duration); Ctrl-C stops",
        add_help=False,
    )
    outbox = sub.add_parser("outbox", help="inspect outboxes, or requeue failed rows")
    outbox.add_argument("action", choices=["status", "requeue"])
    outbox.add_argument("--event-id", action="append", help="requeue only these events")
    sub.add_parser("streams", help="create or reconcile the JetStream streams")

    letters = sub.add_parser(
        "dead-letters",
        help="list, show, retry or dismiss dead letters (every tenant's)",
        description="Dead letters in the local product database, every tenant's. Exit "
        "status: 2 no such letter, 3 closed (or a letter that can only be dismissed), "
        "4 NATS did not take a Retry.",
    )
    actions = letters.add_subparsers(dest="action", required=True)
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print the API's JSON form")
    listing = actions.add_parser("list", parents=[json_flag], help="list letters, oldest first")
    listing.add_argument("--status", choices=["open", "closed", "all"], default="open")
    listing.add_argument("--queue", help="only letters of commands that failed on this queue")
    listing.add_argument("--kind", choices=["command", "poison_event", "reaction"])
    listing.add_argument("--project", help="only this project's letters")
    for name, text in (
        ("show", "a letter with its full command payload and last error"),
        ("retry", "send the command again as attempt + 1 (exactly once)"),
        ("dismiss", "close an open letter as dismissed"),
    ):
        action = actions.add_parser(name, parents=[json_flag], help=text)
        action.add_argument("id", help="the dead letter's ID (dl_...)")

    kinds = sub.add_parser(
        "kinds", help="list the Event kinds: subject, triggerable, owner, payload fields"
    )
    kinds.add_argument("--json", action="store_true", help="print the kinds as a JSON list")

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

    _subscriptions_parser(sub)
    _schedules_parser(sub)

    api = sub.add_parser("api", help="serve the operator HTTP API with uvicorn")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8080)
    api.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )

    invoke = sub.add_parser(
        "invoke",
        help="run one function of template.yaml with an event, here (sam local without Docker)",
        description="Run a template function's real handler with an event file against the "
        "embedded stack (nats-server + moto S3). Prints what it mapped and the handler's logs "
        "on stderr, the response on stdout. Exit status: 1 the handler failed or overran its "
        "Timeout, 2 an unknown function, parameter or event file.",
    )
    invoke.add_argument("function", help="the function's logical ID (SweepFunction, ...)")
    invoke.add_argument("--event", "-e", required=True, help="the event's JSON file")
    invoke.add_argument("--template", "-t", default="template.yaml")
    invoke.add_argument("--root", default=".rhumbatron/invoke", help="stack store and /mnt/*")
    invoke.add_argument("--nats-url", help="use this NATS instead of starting nats-server")
    invoke.add_argument("--s3-endpoint-url", help="use this S3 instead of starting moto")
    invoke.add_argument("--parameter", action="append", help="a template parameter NAME=VALUE")
    invoke.add_argument("--env-vars", "-n", help="variable overrides (sam local's JSON file)")
    invoke.add_argument(
        "--keep-stack", action="store_true", help="keep the stack running until Ctrl-C"
    )
    return parser


def _dev_package_missing(command: str, exc: ModuleNotFoundError) -> int:
    """Exit status 1 (``EXIT_ERROR``), with one line on stderr naming what to install, when
    ``rhumbatron <command>`` cannot import the development code it runs: ``demo``, ``up`` and
    ``invoke`` run :mod:`rhumbatron_dev` (the embedded stack, the demo), which the Lambda
    layer leaves out and which needs the ``local`` extra."""
    missing = exc.name or str(exc)
    if missing.partition(".")[0] == "rhumbatron_dev":
        missing = "rhumbatron_dev"
    print(
        f"rhumbatron {command}: {missing} is not installed; this command runs the "
        "development package rhumbatron_dev, which needs the local extra: install both from "
        "a checkout (pip install -e '.[local]', or make venv)",
        file=sys.stderr,
    )
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rhumbatron`` command; returns the exit status."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        try:
            from rhumbatron_dev.demo import main as demo_main
        except ModuleNotFoundError as exc:
            return _dev_package_missing(args.command, exc)
        return demo_main(rest)
    if args.command == "up":
        try:
            from rhumbatron_dev.local.up import main as up_main
        except ModuleNotFoundError as exc:
            return _dev_package_missing(args.command, exc)
        return up_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "outbox":
        return _outbox(args)
    if args.command == "dead-letters":
        return _dead_letters(args)
    if args.command == "kinds":
        return _kinds(args)
    if args.command == "api":
        return _api(args)
    if args.command == "replay":
        return _replay(args)
    if args.command == "subscriptions":
        return _subscriptions(args)
    if args.command == "schedules":
        return _schedules(args)
    if args.command == "invoke":
        try:
            from rhumbatron_dev.local.invoke import run_command
        except ModuleNotFoundError as exc:
            return _dev_package_missing(args.command, exc)
        return run_command(args)
    return _streams(args)


if __name__ == "__main__":
    sys.exit(main())
