"""What the API tests share: tokens, commands, real dead letters, and a reader of the
COMMANDS stream that looks at what JetStream really stored."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats
from nats.js.errors import NotFoundError

from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.product.dead_letters import (
    command_dead_letter_id,
    poison_dead_letter_id,
    record_command_dead_letter,
    record_poison_event,
)
from rhumbatron.protocol.envelopes import Command
from rhumbatron.runtime.bootstrap import Rhumbatron

TENANT = "tenant-a"
OTHER_TENANT = "tenant-b"
PROJECT = "acme-web"

#: Static tokens (at least 16 characters) and what each may do.
OPERATOR = "operator-token-aaaaaaaaaaaa"
READER = "reader-token-aaaaaaaaaaaaaa"
SENDER = "sender-token-aaaaaaaaaaaaaa"
OTHER_OPERATOR = "operator-token-bbbbbbbbbbbb"
PLATFORM = "platform-token-ffffffffffff"
ALL_SCOPES = [
    "dead-letters:read",
    "dead-letters:write",
    "commands:send",
    "projects:read",
    "projects:write",
    "changes:read",
    "changes:write",
    "agents:read",
    "agents:write",
    "replay:write",
    "consumers:read",
    "audit:read",
]
TOKENS: dict[str, dict[str, Any]] = {
    OPERATOR: {"tenant": TENANT, "scopes": ALL_SCOPES},
    READER: {"tenant": TENANT, "scopes": ["dead-letters:read"]},
    SENDER: {"tenant": TENANT, "scopes": ["commands:send"]},
    OTHER_OPERATOR: {"tenant": OTHER_TENANT, "scopes": ALL_SCOPES},
    PLATFORM: {"tenant": "*", "scopes": ALL_SCOPES},
}

_PAYLOADS: dict[str, dict[str, Any]] = {
    "agent.wake": {"agentId": "agent-1", "reason": "task.ready"},
    "change.settle": {"reason": "task_failed"},
    "verification.start": {"candidateId": "cand-1"},
    "release.start": {"releaseId": "rel-1", "generation": 3},
    "forks.sweep": {},
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def command(command_type: str = "change.settle", *, project: str = PROJECT) -> Command:
    """A valid command with a fresh ID."""
    return Command.create(
        command_id=f"cmd_{uuid.uuid4().hex}",
        command_type=command_type,
        project_id=project,
        change_id="chg-1",
        task_id="tsk-1",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        payload=_PAYLOADS[command_type],
    )


def command_letter(
    app: Rhumbatron,
    cmd: Command,
    *,
    tenant: str | None = TENANT,
    queue: str | None = None,
    reason: str = "RuntimeError: the handler failed",
) -> str:
    """What the dead-letter consumer writes for ``cmd`` (its attempt, its body)."""
    with app.product().transaction() as db:
        record_command_dead_letter(
            db,
            command_id=cmd.command_id,
            command_type=cmd.command_type,
            queue=queue or cmd.spec.queue,
            attempt=cmd.attempt,
            reason=reason,
            body=cmd.to_json().decode(),
            now_s=app.clock.now().timestamp(),
            tenant_id=tenant,
            project_id=cmd.project_id,
            change_id=cmd.change_id,
            task_id=cmd.task_id,
        )
    return command_dead_letter_id(cmd.command_id)


def undecodable_letter(app: Rhumbatron, *, tenant: str = TENANT) -> str:
    """A command letter whose body never decoded as a Command."""
    command_id = f"cmd_{uuid.uuid4().hex}"
    with app.product().transaction() as db:
        record_command_dead_letter(
            db,
            command_id=command_id,
            command_type="change.settle",
            queue="integration",
            attempt=1,
            reason="EnvelopeError: not JSON",
            body="{not json",
            now_s=app.clock.now().timestamp(),
            tenant_id=tenant,
        )
    return command_dead_letter_id(command_id)


def poison_letter(app: Rhumbatron, *, tenant: str = TENANT) -> str:
    """What the router writes for an event a subscription failed to apply 5 times."""
    consumer, event_key = "projection-view", f"evt_{uuid.uuid4().hex}"
    with app.product().transaction() as db:
        record_poison_event(
            db,
            consumer=consumer,
            event_key=event_key,
            stream="EVENTS_03",
            stream_seq=42,
            reason="ValueError: cannot apply",
            body=json.dumps({"eventId": event_key, "eventType": "task.completed"}),
            now_s=app.clock.now().timestamp(),
            tenant_id=tenant,
            project_id=PROJECT,
        )
    return poison_dead_letter_id(consumer, event_key)


def reservation(app: Rhumbatron, dead_letter_id: str) -> tuple[int | None, float | None]:
    row = (
        app.product()
        .connection.execute(
            "SELECT retried_attempt, retried_at_s FROM dead_letters WHERE dead_letter_id = ?",
            (dead_letter_id,),
        )
        .fetchone()
    )
    return row[0], row[1]


@dataclass(frozen=True)
class Queued:
    """One message JetStream holds on the COMMANDS stream."""

    subject: str
    message_id: str
    command: dict[str, Any]


def queued(url: str, command_id: str | None = None) -> list[Queued]:
    """Every message on COMMANDS (of ``command_id`` if given), read over its own connection."""

    async def read() -> list[Queued]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            state = (await js.stream_info(COMMAND_STREAM)).state
            found = []
            for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
                try:
                    msg = await js.get_msg(COMMAND_STREAM, seq)
                except NotFoundError:
                    continue
                found.append(
                    Queued(msg.subject, (msg.headers or {})["Nats-Msg-Id"], json.loads(msg.data))
                )
            return found
        finally:
            await nc.close()

    messages = asyncio.run(read())
    return [m for m in messages if command_id is None or m.command["commandId"] == command_id]


def publish_command(url: str, cmd: Command) -> None:
    """Put ``cmd`` on its queue as a producer inside the system does (the command bus's
    subject and message ID), over a connection of its own: a command ``POST /commands``
    would refuse at the door (its subject does not exist) can still reach a queue that way."""

    async def publish() -> None:
        nc = await nats.connect(url)
        try:
            queue = cmd.spec.queue
            await nc.jetstream().publish(
                f"cmd.{queue}", cmd.to_json(), headers={"Nats-Msg-Id": f"{queue}:{cmd.command_id}"}
            )
        finally:
            await nc.close()

    asyncio.run(publish())


def wait_until(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    """Poll a condition another thread or process makes true (a reconnect), bounded."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(0.02)
