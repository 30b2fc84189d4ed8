"""Identifiers that become paths or keys (issue #21, ../shared/RELIABILITY.md B9).

A probe with a tenant token posted ``app.provision`` with ``appName: "../../../../pwn-app"``
to ``POST /commands``: the answer was 202, a directory was created outside the state folder,
and the project listed the app. These tests hold the two walls that now stand in the way:

* the payload models themselves take only :mod:`rhumbatron.protocol.values` identifiers, so
  an API route, ``POST /commands`` and a message read off a queue all refuse the name;
* every file or directory named from input goes through :func:`rhumbatron.paths.path_under`,
  which refuses a name (or a planted symlink) that would lead outside its root.

The properties at the end check every pattern the API documents and every identifier field
of every command type: whatever a pattern accepts is one safe path component.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import uuid
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.errors import NotFoundError

from api.support import OPERATOR, PROJECT, SENDER, TENANT, bearer, command_letter
from rhumbatron.actors.actor import ActorKind, ActorRef
from rhumbatron.api import create_api
from rhumbatron.api.auth import StaticTokenAuth
from rhumbatron.errors import ActorError, DeadLetterError, EnvelopeError, UnsafePathError
from rhumbatron.lifecycle.apps import LocalApps
from rhumbatron.lifecycle.forks import ForkStore
from rhumbatron.messaging.queue_consumer import Delivery
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.paths import path_under
from rhumbatron.product.audit import list_audit
from rhumbatron.product.dead_letters import claim_retry
from rhumbatron.protocol.command_types import COMMAND_TYPES
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import stable_event_id
from rhumbatron.protocol.values import MAX_ATTEMPT, MAX_WIRE_INTEGER
from rhumbatron.runtime.bootstrap import Rhumbatron
from server_counts import settles_to

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration

CLIMBING = "../../../../pwn-app"


def _provision(app_name: str, *, attempt: int = 1) -> dict[str, Any]:
    return {
        "commandId": f"cmd_{uuid.uuid4().hex}",
        "commandType": "app.provision",
        "projectId": PROJECT,
        "attempt": attempt,
        "createdAt": "2026-01-01T00:00:00.000Z",
        "payload": {"appName": app_name},
    }


def _everything_under(root: Path) -> set[str]:
    """Every file and directory under ``root``, but the nats-server's own store."""
    return {
        str(p.relative_to(root)) for p in root.rglob("*") if p.relative_to(root).parts[0] != "nats"
    }


async def _stored_subjects(app: Rhumbatron) -> list[str]:
    """The subject of every message the COMMANDS stream holds (one removed while they are
    read is not)."""
    js = (await app.nats()).jetstream()
    info = await js.stream_info(COMMAND_STREAM)
    subjects = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        if info.state.messages == 0:
            break
        with contextlib.suppress(NotFoundError):
            subjects.append((await js.get_msg(COMMAND_STREAM, seq)).subject)
    return subjects


# -- the exploit, on every entry path --------------------------------------------------------


def test_post_commands_refuses_an_app_name_that_climbs_out_of_the_state_dir(
    client: TestClient, runtime: Rhumbatron, tmp_path: Path
) -> None:
    # GIVEN a tenant token with commands:send, and everything in the test's folder
    before = _everything_under(tmp_path)
    # WHEN it posts app.provision with an app name that climbs out of the state folder
    answer = client.post(
        "/commands",
        json={"queue": "integration", "command": _provision(CLIMBING)},
        headers=bearer(SENDER),
    )
    # THEN it is refused at the door, naming the payload, and nothing was queued or created
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["field"].startswith("command.payload")
    assert "appName" in error["message"]
    assert asyncio.run(_stored_subjects(runtime)) == []
    # (but the product database: the audit trail wrote the refusal there)
    product = {"state/product.sqlite", "state/product.sqlite-wal", "state/product.sqlite-shm"}
    assert _everything_under(tmp_path) - before <= product
    assert not any("pwn-app" in p for p in _everything_under(tmp_path.parent))
    (audited,) = list_audit(runtime.product().connection)
    assert (audited.operation, audited.status_code, audited.error_code) == (
        "send_command",
        422,
        "invalid_request",
    )


@pytest.mark.parametrize("name", ["..", "a.b", "a/b", "-x"])
def test_the_apps_route_and_post_commands_agree_on_app_names(client: TestClient, name: str) -> None:
    # GIVEN an app name the apps route refuses (or, for a.b, one outside its alphabet)
    # WHEN it is sent both ways
    by_route = client.post(
        f"/projects/{PROJECT}/apps", json={"appName": name}, headers=bearer(OPERATOR)
    )
    by_command = client.post(
        "/commands",
        json={"queue": "integration", "command": _provision(name)},
        headers=bearer(SENDER),
    )
    # THEN both refuse it: one rule, in the payload model, whatever the entry path
    assert by_route.status_code == 422, by_route.text
    assert by_command.status_code == 422, by_command.text


async def test_a_queue_message_with_a_climbing_app_name_becomes_a_dead_letter_not_a_directory(
    runtime: Rhumbatron, tmp_path: Path
) -> None:
    try:
        await _queue_message_with_a_climbing_app_name(runtime, tmp_path)
    finally:
        await runtime.close()


async def _queue_message_with_a_climbing_app_name(app: Rhumbatron, tmp_path: Path) -> None:
    # GIVEN someone with publish rights on NATS puts app.provision with a climbing name
    # straight onto the integration queue (no API in the way)
    await app.ensure_streams()
    js = (await app.nats()).jetstream()
    body = json.dumps(_provision(CLIMBING)).encode()
    await js.publish("cmd.integration", body, headers={"Nats-Msg-Id": f"raw-{uuid.uuid4()}"})
    before = _everything_under(tmp_path)
    runtime = await app.queue_runtime()
    handled: list[str] = []

    async def integration(command: Command, delivery: Delivery) -> None:
        handled.append(command.command_id)
        await app.lifecycle().integration(command, delivery)

    # WHEN the integration queue is polled with its real handler
    report = await runtime.poll("integration", integration)
    # THEN the handler never saw it; it went to the dead-letter queue, and no directory
    # appeared anywhere
    assert handled == []
    assert report.fetched == 1
    # (the server takes a terminate off a queue of its own: the original goes a moment after)
    await settles_to(lambda: _stored_subjects(app), ["cmd.dead-letter"])
    assert _everything_under(tmp_path) - before == set()
    # AND the dead-letter consumer records it as a letter of an undecodable body
    refused: list[str] = []

    async def undecodable(raw: bytes, delivery: Delivery, reason: str) -> None:
        refused.append(reason)

    async def never(command: Command, delivery: Delivery) -> None:
        raise AssertionError(f"{command.command_id} decoded")

    await runtime.poll("dead-letter", never, on_undecodable=undecodable)
    assert len(refused) == 1 and "appName" in refused[0]


# -- the second wall: paths named from input ---------------------------------------------------


@pytest.mark.parametrize(
    "name", [CLIMBING, "../x", "a/../../b", "/etc", "..", "a\x00b", "a\\..\\..\\b", ""]
)
async def test_local_apps_refuse_a_name_that_leads_outside_their_root(
    tmp_path: Path, name: str
) -> None:
    # GIVEN the local app provisioner, called past the models (a bug upstream)
    apps = LocalApps(tmp_path / "state" / "apps")
    # WHEN it is asked to provision and deploy an app of that name
    with pytest.raises(UnsafePathError):
        await apps.provision(PROJECT, name, attempt=1)
    with pytest.raises(UnsafePathError):
        await apps.deploy(PROJECT, name, 1, {"a.txt": "x"})
    # THEN nothing was created at all
    assert list(tmp_path.rglob("*")) == []


def test_a_symlink_planted_in_the_state_dir_is_not_followed_out(tmp_path: Path) -> None:
    # GIVEN a fork directory of a project that is a symlink to somewhere outside
    outside = tmp_path / "outside"
    outside.mkdir()
    forks = ForkStore(tmp_path / "state" / "forks")
    forks.root.mkdir(parents=True)
    (forks.root / PROJECT).symlink_to(outside, target_is_directory=True)
    # WHEN a fork is written there
    with pytest.raises(UnsafePathError, match="outside"):
        forks.write(PROJECT, "cand_1", {"a.txt": "x"})
    # THEN nothing was written outside
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("candidate", ["../../../etc/passwd", "../x", "a/b"])
def test_a_fork_cannot_be_read_or_deleted_outside_its_root(tmp_path: Path, candidate: str) -> None:
    # GIVEN a file next to the forks' root
    forks = ForkStore(tmp_path / "state" / "forks")
    secret = tmp_path / "state" / "secret.json"
    secret.parent.mkdir(parents=True)
    secret.write_text('{"k": "v"}')
    # WHEN a Candidate ID climbs out of it
    for act in (forks.read, forks.delete):
        with pytest.raises(UnsafePathError):
            act(PROJECT, candidate)
    # THEN the file is still there, unread
    assert secret.exists()


# -- integers and dates that reach SQLite ---------------------------------------------------------


def test_an_attempt_beyond_the_wire_bound_is_refused_at_parse() -> None:
    # GIVEN a command whose attempt would overflow SQLite's 64-bit column
    raw = _provision("web", attempt=2**63)
    # WHEN it is parsed (the dead-letter consumer's first step)
    # THEN it is an envelope error naming attempt, so it is recorded as an undecodable letter
    with pytest.raises(EnvelopeError, match="attempt"):
        Command.parse(json.dumps(raw))
    assert Command.parse(json.dumps(_provision("web", attempt=MAX_ATTEMPT))).attempt == MAX_ATTEMPT


def test_a_letter_at_the_last_attempt_can_only_be_dismissed(runtime: Rhumbatron) -> None:
    # GIVEN a command letter at the largest attempt a command may have
    cmd = Command.parse(json.dumps(_provision("web", attempt=MAX_ATTEMPT)))
    letter_id = command_letter(runtime, cmd)
    # WHEN a Retry is reserved
    # THEN it is refused with the reason, instead of sending attempt + 1 that nothing can read
    with runtime.product().transaction() as db, pytest.raises(DeadLetterError, match="dismissed"):
        claim_retry(db, letter_id, now_s=0.0)


@pytest.mark.parametrize(
    ("command_type", "payload"),
    [
        ("release.start", {"releaseId": "rel-1", "generation": MAX_WIRE_INTEGER + 1}),
        ("index.build", {"generation": 2**63}),
        ("candidates.recompose", {"generation": 2**64}),
    ],
)
def test_a_generation_beyond_the_wire_bound_is_refused(
    command_type: str, payload: dict[str, Any]
) -> None:
    with pytest.raises(EnvelopeError, match="generation"):
        Command.create(
            command_id="cmd_x",
            command_type=command_type,
            project_id=PROJECT,
            created_at=datetime(2026, 1, 1, tzinfo=UTC),
            payload=payload,
        )


def test_a_command_created_past_year_9999_in_utc_is_refused_not_a_crash() -> None:
    raw = _provision("web") | {"createdAt": "9999-12-31T23:59:59-05:00"}
    with pytest.raises(EnvelopeError, match="createdAt"):
        Command.parse(json.dumps(raw))


# -- keys: the stable Event ID's material ------------------------------------------------------


def test_task_ids_cannot_carry_the_stable_ids_separator() -> None:
    # GIVEN two different (task, key) pairs that join to the same material with \x1f
    # THEN they would share one stable Event ID, so one fact would swallow the other
    assert stable_event_id("chg-1", "task.ready", "t\x1fk", "x") == stable_event_id(
        "chg-1", "task.ready", "t", "k\x1fx"
    )
    # AND the envelope refuses such a Task ID, so no Event can carry it
    with pytest.raises(EnvelopeError, match="taskId"):
        Event.create(
            event_id=stable_event_id("chg-1", "task.ready", "t\x1fk", "x"),
            event_type="task.ready",
            event_version=1,
            tenant_id=TENANT,
            project_id=PROJECT,
            change_id="chg-1",
            task_id="t\x1fk",
            actor="system:test",
            correlation_id="c",
            timestamp=datetime(2026, 1, 1, tzinfo=UTC),
            payload={},
        )


# -- properties ----------------------------------------------------------------------------------

#: Patterns the API documents for values that are never a file, directory or key name:
#: each with the reason. Every other pattern must accept only safe path components.
_NOT_NAMES = {
    r"^[^\x00\r\n]{1,1024}$": "a resource (a claimed path); compared as text, never opened",
    r"^(agent|user|system|workflow|operator):[^\s\x00-\x1f\x7f]{1,200}$": "an actor: text",
    r"^([01][0-9]|2[0-3]):[0-5][0-9]$": "a time of day",
    r"^\d{4}-\d{2}-\d{2}$": "a date",
    r"^[a-z][a-z_]{0,31}$": "a schedule mode word",
}

#: Building blocks of hostile names: separators, dot runs, NUL, lookalikes, encodings.
_HOSTILE = st.lists(
    st.sampled_from(
        [
            "a",
            "Z",
            "0",
            ".",
            "..",
            "_",
            "-",
            ":",
            "/",
            "\\",
            "\x00",
            "\n",
            "%2e",
            "%2f",
            "\u2024",
            "\uff0e",
            "\u2215",
            " ",
            "é",
        ]
    ),
    min_size=1,
    max_size=8,
).map("".join)


def _patterns(schema: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every ``pattern`` in a JSON schema (or OpenAPI document), with where it was found."""
    if isinstance(schema, dict):
        if isinstance(schema.get("pattern"), str):
            yield where, schema["pattern"]
        for key, value in schema.items():
            yield from _patterns(value, f"{where}.{key}" if where else str(key))
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            yield from _patterns(value, f"{where}[{index}]")


def _name_patterns(schema: Any) -> dict[str, str]:
    """Where each name pattern is used, by pattern (the not-a-name ones left out)."""
    found: dict[str, str] = {}
    for where, pattern in _patterns(schema):
        if pattern not in _NOT_NAMES:
            found.setdefault(pattern, where)
    return found


def _api_patterns(runtime: Rhumbatron) -> dict[str, str]:
    api = create_api(runtime, StaticTokenAuth(runtime.settings.api_tokens))
    return _name_patterns(api.openapi())


def _command_patterns() -> dict[str, str]:
    found: dict[str, str] = {}
    for name, spec in COMMAND_TYPES.items():
        for pattern, where in _name_patterns(spec.payload.model_json_schema()).items():
            found.setdefault(pattern, f"{name}: {where}")
    for pattern, where in _name_patterns(Command.model_json_schema()).items():
        found.setdefault(pattern, f"Command: {where}")
    return found


def _accepts(pattern: str, value: str) -> bool:
    # pydantic matches with Rust's regex, where $ is the end of the text: fullmatch is the
    # same in Python (a bare re.match would let a final newline through).
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value) is not None


def _assert_one_safe_component(root: Path, value: str, where: str) -> None:
    assert value not in ("", ".", ".."), f"{where} accepts {value!r}"
    assert not set(value) & {"/", "\\", "\x00", "\n", "\r"}, f"{where} accepts {value!r}"
    path = path_under(root, value)  # raises UnsafePathError if it would leave root
    assert path.parent.resolve() == root.resolve(), f"{where} accepts {value!r}"
    assert os.path.basename(path) == value


#: Fields named like identifiers that are not names of anything stored by name, each with why.
_NOT_IDENTIFIERS = {
    ("project.provision", "tenantId"): "a tenant the platform granted (a token or an IdP "
    "claim), compared with the project's owner; never a path",
    ("project.provision", "name"): "the project's display name: text",
    ("agent.wake", "eventId"): "an Event ID: its own stricter pattern (evt_ + 32 hex)",
}


def _string_fields(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each property of a payload schema that holds strings (itself, or as list items)."""
    for name, prop in schema.get("properties", {}).items():
        options = prop.get("anyOf", [prop])
        for option in options:
            item = option.get("items", option) if option.get("type") == "array" else option
            if item.get("type") == "string":
                yield name, item


def test_every_identifier_field_of_every_command_type_has_a_name_pattern() -> None:
    # GIVEN every command type's payload; a field named like an identifier (…Id, …Ids,
    # …Name) could become a path or a key. THEN it takes an identifier type (a pattern),
    # unless it is listed above with the reason it names nothing.
    unguarded = []
    for command_type, spec in COMMAND_TYPES.items():
        for name, item in _string_fields(spec.payload.model_json_schema()):
            named_like_an_id = name.endswith(("Id", "Ids", "Name")) or name == "name"
            exempt = (command_type, name) in _NOT_IDENTIFIERS
            if named_like_an_id and "pattern" not in item and not exempt:
                unguarded.append(f"{command_type}.{name}")
    assert unguarded == []
    # AND the exemptions are still real fields (a renamed field must be judged again)
    fields = {
        (t, name)
        for t, s in COMMAND_TYPES.items()
        for name, _ in _string_fields(s.payload.model_json_schema())
    }
    assert set(_NOT_IDENTIFIERS) <= fields


def test_every_pattern_of_the_api_and_the_commands_is_known(runtime: Rhumbatron) -> None:
    # The properties below draw from these; a new pattern must be judged, not skipped.
    patterns = {**_api_patterns(runtime), **_command_patterns()}
    assert len(patterns) >= 6, patterns
    assert r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$" in patterns  # Identifier
    assert r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$" in patterns  # project IDs and app names


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_identifier_a_route_or_command_accepts_names_a_path_outside_the_root(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = _ROOT.setdefault("root", tmp_path_factory.mktemp("state-root"))
    patterns = _PATTERNS.setdefault("patterns", _command_patterns() | _CACHED_API_PATTERNS)
    pattern = data.draw(st.sampled_from(sorted(patterns)), label="pattern")
    where = patterns[pattern]
    # Values the pattern accepts, and hostile ones that it may or may not accept.
    accepted = data.draw(st.from_regex(pattern, fullmatch=True), label="accepted")
    assert _accepts(pattern, accepted)
    _assert_one_safe_component(root, accepted, where)
    hostile = data.draw(_HOSTILE, label="hostile")
    if _accepts(pattern, hostile):
        _assert_one_safe_component(root, hostile, where)


@settings(max_examples=300, deadline=None)
@given(project=_HOSTILE | st.text(max_size=70), shard=st.integers(min_value=0, max_value=99))
def test_an_actor_file_is_always_under_the_projects_dir_or_refused(
    project: str, shard: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    state = _ROOT.setdefault("actors", tmp_path_factory.mktemp("actors"))
    for ref_args in ((ActorKind.PROJECT_ROOT, project), (ActorKind.RESOURCE_SHARD, project, shard)):
        try:
            path = ActorRef(*ref_args).path(state)  # type: ignore[arg-type]
        except (ActorError, UnsafePathError):
            continue
        assert path.resolve().parent.parent == (state / "projects").resolve()


_ROOT: dict[str, Path] = {}
_PATTERNS: dict[str, dict[str, str]] = {}
#: Filled once by the fixture below: building the OpenAPI document needs a runtime.
_CACHED_API_PATTERNS: dict[str, str] = {}


@pytest.fixture(autouse=True, scope="module")
def _api_patterns_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    from rhumbatron.actors.alarms import RecordingAlarmSink
    from rhumbatron.core.clock import ManualClock
    from rhumbatron.core.settings import load_settings
    from rhumbatron.runtime.bootstrap import bootstrap

    state = tmp_path_factory.mktemp("openapi") / "state"
    app = bootstrap(
        load_settings(state_dir=state, nats_url="nats://127.0.0.1:1"),
        clock=ManualClock(),
        alarms=RecordingAlarmSink(),
    )
    _CACHED_API_PATTERNS.update(_api_patterns(app))
