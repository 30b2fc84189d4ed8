"""The agent registry on a real SQLite file: idempotent registration, URL checks, secrets
generated and rotated without a gap (at most two), agent IDs and tenants guarded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.agents.registry import AGENTS_SCHEMA, AgentKind, AgentRegistry
from rhumbatron.agents.signing import generate_secret
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import (
    AgentNotFoundError,
    AgentRegistryError,
    UnsafeWebhookUrlError,
    WebhookSecretError,
)

URL = "http://127.0.0.1:8123/agent"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url="nats://127.0.0.1:1",
        webhook_allowed_hosts=("127.0.0.1",),
    )


@pytest.fixture
def store(tmp_path: Path, settings: Settings) -> Iterator[SqliteStore]:
    store = SqliteStore(tmp_path / "product.sqlite", settings, AGENTS_SCHEMA)
    yield store
    store.close()


@pytest.fixture
def registry(store: SqliteStore, settings: Settings, clock: ManualClock) -> AgentRegistry:
    return AgentRegistry(store, settings, clock)


def test_a_webhook_agent_gets_a_generated_secret_and_is_read_back(
    registry: AgentRegistry, clock: ManualClock
) -> None:
    # WHEN a webhook agent registers without a secret
    record = registry.register_webhook("acme", "reviewer-1", URL)
    # THEN it has one generated whsec_ secret, and get() reads the same record back
    assert record.kind is AgentKind.WEBHOOK
    assert record.url == URL
    assert len(record.secrets) == 1 and record.secrets[0].startswith("whsec_")
    assert record.created_at == record.updated_at == clock.now()
    assert registry.get("acme", "reviewer-1") == record
    assert registry.get("acme", "nobody") is None


def test_registering_the_same_values_again_changes_nothing(
    registry: AgentRegistry, clock: ManualClock
) -> None:
    # GIVEN a registered webhook agent
    first = registry.register_webhook("acme", "reviewer-1", URL)
    clock.advance(60)
    # WHEN it registers again with the same URL and no secret (a deploy script rerun)
    again = registry.register_webhook("acme", "reviewer-1", URL)
    # THEN nothing changed: the secret the receiver holds is kept, updated_at did not move
    assert again == first
    assert registry.get("acme", "reviewer-1") == first


def test_registering_different_values_updates_the_agent(
    registry: AgentRegistry, clock: ManualClock
) -> None:
    first = registry.register_webhook("acme", "reviewer-1", URL)
    clock.advance(60)
    # WHEN the URL changes
    moved = registry.register_webhook("acme", "reviewer-1", "http://127.0.0.1:9000/v2")
    # THEN the URL and updated_at change; the secret and created_at stay
    assert moved.url == "http://127.0.0.1:9000/v2"
    assert moved.secrets == first.secrets
    assert (moved.created_at, moved.updated_at) == (first.created_at, clock.now())
    assert registry.get("acme", "reviewer-1") == moved


def test_given_secrets_replace_the_registered_ones(registry: AgentRegistry) -> None:
    registry.register_webhook("acme", "reviewer-1", URL)
    mine = generate_secret()
    record = registry.register_webhook("acme", "reviewer-1", URL, secrets=[mine])
    assert record.secrets == (mine,)
    assert registry.get("acme", "reviewer-1") == record


@pytest.mark.parametrize(
    ("secrets", "error", "problem"),
    [
        ([], AgentRegistryError, "give 1 or 2 secrets"),
        ([generate_secret() for _ in range(3)], AgentRegistryError, "give 1 or 2 secrets"),
        (["s3cret-without-prefix"], WebhookSecretError, "must start with 'whsec_'"),
        (["whsec_%%%"], WebhookSecretError, "not valid base64"),
    ],
)
def test_bad_secrets_are_refused(
    registry: AgentRegistry, secrets: list[str], error: type[Exception], problem: str
) -> None:
    with pytest.raises(error, match=problem):
        registry.register_webhook("acme", "reviewer-1", URL, secrets=secrets)
    assert registry.get("acme", "reviewer-1") is None


def test_the_same_secret_twice_is_refused(registry: AgentRegistry) -> None:
    secret = generate_secret()
    with pytest.raises(AgentRegistryError, match="given twice"):
        registry.register_webhook("acme", "reviewer-1", URL, secrets=[secret, secret])


def test_rotation_puts_the_new_secret_first_and_keeps_at_most_two(
    registry: AgentRegistry,
) -> None:
    # GIVEN an agent with one secret
    (original,) = registry.register_webhook("acme", "reviewer-1", URL).secrets
    # WHEN its secret rotates
    new = registry.rotate_secret("acme", "reviewer-1")
    # THEN both are valid, newest first
    record = registry.get("acme", "reviewer-1")
    assert record is not None and record.secrets == (new, original)
    # AND rotating again during the rotation drops the oldest: never more than two
    newer = registry.rotate_secret("acme", "reviewer-1")
    record = registry.get("acme", "reviewer-1")
    assert record is not None and record.secrets == (newer, new)


def test_dropping_the_old_secret_ends_the_rotation(
    registry: AgentRegistry, clock: ManualClock
) -> None:
    registry.register_webhook("acme", "reviewer-1", URL)
    new = registry.rotate_secret("acme", "reviewer-1")
    clock.advance(3600)
    # WHEN the old secret is dropped
    record = registry.drop_old_secret("acme", "reviewer-1")
    # THEN only the new one is left, and dropping again changes nothing
    assert record.secrets == (new,) and record.updated_at == clock.now()
    assert registry.get("acme", "reviewer-1") == record
    clock.advance(60)
    assert registry.drop_old_secret("acme", "reviewer-1") == record


def test_rotation_needs_a_registered_webhook_agent(registry: AgentRegistry) -> None:
    registry.register_scripted("acme", "script-1")
    with pytest.raises(AgentNotFoundError, match="tenant 'acme' has no agent 'ghost'"):
        registry.rotate_secret("acme", "ghost")
    with pytest.raises(AgentRegistryError, match="'script-1' is scripted, not webhook"):
        registry.rotate_secret("acme", "script-1")
    with pytest.raises(AgentRegistryError, match="'script-1' is scripted, not webhook"):
        registry.drop_old_secret("acme", "script-1")


def test_a_loopback_url_is_refused_at_registration_without_the_allow_list(
    store: SqliteStore, tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN settings with no allow-list
    strict = load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")
    registry = AgentRegistry(store, strict, clock)
    # WHEN a loopback URL registers
    with pytest.raises(UnsafeWebhookUrlError, match="RHUMBATRON_WEBHOOK_ALLOWED_HOSTS"):
        registry.register_webhook("acme", "reviewer-1", URL)
    # THEN nothing was registered
    assert registry.get("acme", "reviewer-1") is None


def test_a_metadata_url_is_refused_at_registration(registry: AgentRegistry) -> None:
    with pytest.raises(UnsafeWebhookUrlError, match="cloud metadata"):
        registry.register_webhook("acme", "reviewer-1", "http://169.254.169.254/latest/")


@pytest.mark.parametrize(
    "agent_id", ["", "a" * 101, "has space", "slash/y", "ünïcode", "a\n", ".", "..", "-x", "_x"]
)
def test_an_invalid_agent_id_is_refused(registry: AgentRegistry, agent_id: str) -> None:
    with pytest.raises(AgentRegistryError, match="is invalid: use 1 to 100 characters"):
        registry.register_scripted("acme", agent_id)


def test_the_longest_agent_id_and_its_alphabet_are_accepted(registry: AgentRegistry) -> None:
    agent_id = ("Ab9._-" * 17)[:100]  # a letter or digit first
    assert registry.register_scripted("acme", agent_id).agent_id == agent_id


def test_another_tenant_registers_its_own_agent_of_the_same_id(registry: AgentRegistry) -> None:
    # GIVEN acme's webhook agent reviewer-1
    mine = registry.register_webhook("acme", "reviewer-1", URL)
    # WHEN another tenant registers reviewer-1 at its own URL
    theirs = registry.register_webhook("evil", "reviewer-1", "http://127.0.0.1:9999/steal")
    # THEN each tenant reads its own agent, and acme's is untouched
    assert registry.get("acme", "reviewer-1") == mine
    assert registry.get("evil", "reviewer-1") == theirs
    assert theirs.url == "http://127.0.0.1:9999/steal" and theirs.secrets != mine.secrets
    # AND a rotation of one leaves the other's secrets alone
    registry.rotate_secret("evil", "reviewer-1")
    assert registry.get("acme", "reviewer-1") == mine


def test_an_agent_can_change_kind(registry: AgentRegistry) -> None:
    # GIVEN a scripted agent
    scripted = registry.register_scripted("acme", "worker-1")
    assert (scripted.kind, scripted.url, scripted.secrets) == (AgentKind.SCRIPTED, None, ())
    assert registry.register_scripted("acme", "worker-1") == scripted
    # WHEN it becomes a webhook agent, THEN it gets a secret; and back, THEN it loses it
    webhook = registry.register_webhook("acme", "worker-1", URL)
    assert webhook.kind is AgentKind.WEBHOOK and len(webhook.secrets) == 1
    back = registry.register_scripted("acme", "worker-1")
    assert (back.kind, back.url, back.secrets) == (AgentKind.SCRIPTED, None, ())


def test_agents_are_listed_by_tenant_in_id_order(registry: AgentRegistry) -> None:
    registry.register_scripted("acme", "b")
    registry.register_webhook("acme", "a", URL)
    registry.register_scripted("globex", "c")
    assert [r.agent_id for r in registry.list("acme")] == ["a", "b"]
    assert [r.agent_id for r in registry.list("globex")] == ["c"]
    assert registry.list("nobody") == []


def test_a_record_keeps_its_secrets_out_of_its_repr(registry: AgentRegistry) -> None:
    record = registry.register_webhook("acme", "reviewer-1", URL)
    assert record.secrets[0] not in repr(record)
