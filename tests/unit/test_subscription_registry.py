"""The subscription registry on a real SQLite file: creation idempotent per (tenant, name),
other content under a taken name refused, per-tenant listing, matching through the one
selector matcher, disabled subscriptions silent, webhook URLs checked against SSRF, agent
reactions only for the tenant's own agents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.agents.registry import AGENTS_SCHEMA, AgentRegistry
from rhumbatron.agents.signing import generate_secret
from rhumbatron.cli import EXIT_CANNOT, EXIT_NOT_FOUND, main
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import (
    SubscriptionConflictError,
    SubscriptionNotFoundError,
    SubscriptionRegistryError,
    UnsafeWebhookUrlError,
)
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import (
    AgentReaction,
    Governance,
    SubscriptionRecord,
    WebhookReaction,
    WorkflowReaction,
)
from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
from rhumbatron.reactions.subscription_table import SUBSCRIPTIONS_SCHEMA

TENANT, OTHER = "acme", "globex"
LOCAL_URL = "http://127.0.0.1:8123/hook"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url="nats://127.0.0.1:1",
        webhook_allowed_hosts=("127.0.0.1",),
    )


@pytest.fixture
def store(tmp_path: Path, settings: Settings) -> Iterator[SqliteStore]:
    store = SqliteStore(tmp_path / "product.sqlite", settings, AGENTS_SCHEMA + SUBSCRIPTIONS_SCHEMA)
    yield store
    store.close()


@pytest.fixture
def registry(store: SqliteStore, settings: Settings, clock: ManualClock) -> SubscriptionRegistry:
    return SubscriptionRegistry(store, settings, clock)


def _fact(kind: str, payload: dict[str, Any], *, tenant: str = TENANT) -> Event:
    context = FactContext(Caller(tenant, "agent:builder-1", "corr-1"), "web", NOW)
    return context.fact(kind, payload, change_id="c1", task_id="t1")


def _on_failures() -> Selector:
    return Selector.create(["task.failed"])


def test_creating_the_same_subscription_again_returns_the_stored_one(
    registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    # GIVEN a subscription created once
    created_at = clock.now()
    first = registry.create(TENANT, "ci", _on_failures(), WorkflowReaction(workflow="bisect"))
    clock.advance(60)
    # WHEN the same content is created again under the same name
    again = registry.create(TENANT, "ci", _on_failures(), WorkflowReaction(workflow="bisect"))
    # THEN the first is returned unchanged, and only one is stored
    assert first.created is True and again.created is False
    assert again.record == first.record
    assert first.record.subscription_id.startswith("sub_")
    assert first.record.created_at == first.record.updated_at == created_at
    assert registry.list(TENANT) == [first.record]


def test_other_content_under_a_taken_name_is_a_conflict(registry: SubscriptionRegistry) -> None:
    # GIVEN a subscription named ci
    registry.create(TENANT, "ci", _on_failures(), WorkflowReaction(workflow="bisect"))
    # WHEN another selector, reaction or governance is created under that name
    # THEN each is refused, naming the tenant and the name, and the first stays
    for selector, reaction, governance in (
        (Selector.create(["task.completed"]), WorkflowReaction(workflow="bisect"), None),
        (_on_failures(), WorkflowReaction(workflow="rerun"), None),
        (_on_failures(), WorkflowReaction(workflow="bisect"), Governance(enabled=False)),
    ):
        with pytest.raises(SubscriptionConflictError) as caught:
            registry.create(TENANT, "ci", selector, reaction, governance)
        assert "'acme' has a subscription named 'ci'" in str(caught.value)
        assert caught.value.field == "name"
    [stored] = registry.list(TENANT)
    assert stored.reaction == WorkflowReaction(workflow="bisect")


def test_the_same_name_in_two_tenants_is_two_subscriptions(
    registry: SubscriptionRegistry,
) -> None:
    # GIVEN two tenants each with a subscription named ci
    mine = registry.create(TENANT, "ci", _on_failures(), WorkflowReaction(workflow="a")).record
    theirs = registry.create(OTHER, "ci", _on_failures(), WorkflowReaction(workflow="b")).record
    # WHEN each tenant lists and reads
    # THEN each sees only its own; another tenant's ID is not found
    assert registry.list(TENANT) == [mine]
    assert registry.list(OTHER) == [theirs]
    assert registry.list(None) == [mine, theirs]
    assert registry.get(TENANT, theirs.subscription_id) is None
    assert registry.get(None, theirs.subscription_id) == theirs
    with pytest.raises(SubscriptionNotFoundError):
        registry.delete(TENANT, theirs.subscription_id)
    with pytest.raises(SubscriptionNotFoundError):
        registry.set_governance(TENANT, theirs.subscription_id, enabled=False)


def test_matching_uses_the_selector_over_kinds_and_filter(registry: SubscriptionRegistry) -> None:
    # GIVEN subscriptions on every task failure, on one agent's completions, and on releases
    failures = registry.create(TENANT, "failures", Selector.create(["task.failed"]), _flow()).record
    builder = registry.create(
        TENANT,
        "builder-done",
        Selector.create(["*.completed"], {"payload.agentId": "builder-1"}),
        _flow(),
    ).record
    registry.create(TENANT, "releases", Selector.create(["release.*"]), _flow())
    # WHEN facts are offered
    # THEN each matches exactly the subscriptions whose selector holds
    assert registry.matching(TENANT, _fact("task.failed", {"reason": "boom"})) == [failures]
    assert registry.matching(TENANT, _fact("task.completed", {"agentId": "builder-1"})) == [builder]
    assert registry.matching(TENANT, _fact("task.completed", {"agentId": "other"})) == []


def test_a_fact_of_another_tenant_matches_none_of_the_tenants_subscriptions(
    registry: SubscriptionRegistry,
) -> None:
    # GIVEN a subscription of acme on task failures
    registry.create(TENANT, "failures", _on_failures(), _flow())
    # WHEN a failure of another tenant is offered to acme's subscriptions
    fact = _fact("task.failed", {"reason": "boom"}, tenant=OTHER)
    # THEN nothing matches
    assert registry.matching(TENANT, fact) == []
    assert registry.matching(OTHER, fact) == []


def test_a_disabled_subscription_never_matches_until_enabled_again(
    registry: SubscriptionRegistry, clock: ManualClock
) -> None:
    # GIVEN a subscription on task failures
    record = registry.create(TENANT, "failures", _on_failures(), _flow()).record
    fact = _fact("task.failed", {"reason": "boom"})
    # WHEN it is disabled
    clock.advance(5)
    disabled = registry.set_governance(TENANT, record.subscription_id, enabled=False)
    # THEN a matching fact matches nothing; it is still listed, but not among the enabled
    assert not disabled.governance.enabled and disabled.updated_at == clock.now()
    assert registry.matching(TENANT, fact) == []
    assert registry.list(TENANT) == [disabled]
    assert registry.list(TENANT, enabled_only=True) == []
    # AND enabled again (with a cooldown) it matches again; the same again changes nothing
    enabled = registry.set_governance(TENANT, record.subscription_id, enabled=True, cooldown_s=30)
    assert enabled.governance == Governance(enabled=True, cooldown_s=30)
    assert registry.matching(TENANT, fact) == [enabled]
    clock.advance(5)
    assert registry.set_governance(TENANT, record.subscription_id, cooldown_s=30) == enabled


def test_a_negative_cooldown_is_refused(registry: SubscriptionRegistry) -> None:
    # GIVEN a subscription  WHEN its cooldown is set below zero  THEN pydantic refuses it
    record = registry.create(TENANT, "failures", _on_failures(), _flow()).record
    with pytest.raises(ValidationError, match="cooldown_s"):
        registry.set_governance(TENANT, record.subscription_id, cooldown_s=-1)


def test_deleting_removes_the_subscription_and_frees_its_name(
    registry: SubscriptionRegistry,
) -> None:
    # GIVEN a subscription
    record = registry.create(TENANT, "ci", _on_failures(), _flow()).record
    # WHEN it is deleted
    assert registry.delete(TENANT, record.subscription_id) == record
    # THEN it is gone, a second delete finds nothing, and the name takes other content
    assert registry.get(TENANT, record.subscription_id) is None
    with pytest.raises(SubscriptionNotFoundError, match=record.subscription_id):
        registry.delete(TENANT, record.subscription_id)
    created = registry.create(TENANT, "ci", _on_failures(), WorkflowReaction(workflow="other"))
    assert created.created


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/admin",
        "http://localhost:9000/hook",
    ],
)
def test_a_webhook_at_a_metadata_or_private_address_is_refused(
    registry: SubscriptionRegistry, url: str
) -> None:
    # GIVEN a webhook reaction to an internal address that is not allow-listed
    # WHEN it is created  THEN it is refused naming the URL, and nothing is stored
    with pytest.raises(UnsafeWebhookUrlError, match="refused"):
        registry.create(TENANT, "hook", _on_failures(), WebhookReaction(url=url))
    assert registry.list(TENANT) == []


def test_an_allow_listed_host_passes_but_a_metadata_address_never_does(
    store: SqliteStore, clock: ManualClock, tmp_path: Path
) -> None:
    # GIVEN settings that allow-list a private host and the metadata address
    settings = load_settings(
        state_dir=tmp_path / "state",
        nats_url="nats://127.0.0.1:1",
        webhook_allowed_hosts=("10.0.0.5", "169.254.169.254"),
    )
    registry = SubscriptionRegistry(store, settings, clock)
    # WHEN webhooks to both are created
    created = registry.create(
        TENANT, "hook", _on_failures(), WebhookReaction(url="http://10.0.0.5/hook")
    )
    # THEN the allow-listed private host is taken, the metadata address is still refused
    assert created.created
    with pytest.raises(UnsafeWebhookUrlError, match="metadata"):
        registry.create(
            TENANT, "meta", _on_failures(), WebhookReaction(url="http://169.254.169.254/")
        )


def test_a_webhook_without_secrets_gets_one_generated_once(
    registry: SubscriptionRegistry,
) -> None:
    # GIVEN a webhook reaction without secrets
    reaction = WebhookReaction(url=LOCAL_URL)
    # WHEN it is created, then created again the same way
    first = registry.create(TENANT, "hook", _on_failures(), reaction)
    again = registry.create(TENANT, "hook", _on_failures(), reaction)
    # THEN the first call generates one whsec_ secret and says so; the second keeps it and
    # shows none (the same content: no secrets given means the stored ones)
    assert first.generated_secret is not None and first.generated_secret.startswith("whsec_")
    assert isinstance(first.record.reaction, WebhookReaction)
    assert first.record.reaction.secrets == (first.generated_secret,)
    assert again.created is False and again.generated_secret is None
    assert again.record == first.record
    # AND the secret is kept out of the record's repr
    assert first.generated_secret not in repr(first.record)


def test_given_secrets_are_stored_and_a_malformed_one_is_refused_without_quoting_it(
    registry: SubscriptionRegistry,
) -> None:
    # GIVEN two well-formed secrets (a rotation)
    secrets = (generate_secret(), generate_secret())
    created = registry.create(
        TENANT, "hook", _on_failures(), WebhookReaction(url=LOCAL_URL, secrets=secrets)
    )
    # THEN they are stored as given, and nothing is generated
    assert isinstance(created.record.reaction, WebhookReaction)
    assert created.record.reaction.secrets == secrets and created.generated_secret is None
    # WHEN a malformed secret is given  THEN the model refuses it, without quoting it
    with pytest.raises(ValidationError) as caught:
        WebhookReaction(url=LOCAL_URL, secrets=("not-a-secret-value",))
    [problem] = caught.value.errors()
    assert problem["loc"] == ("secrets",)
    assert "whsec_" in problem["msg"] and "not-a-secret-value" not in problem["msg"]


def test_a_webhook_timeout_longer_than_the_platform_bound_is_refused(
    registry: SubscriptionRegistry, settings: Settings
) -> None:
    # GIVEN a webhook asking for more time than webhook_timeout_s
    reaction = WebhookReaction(url=LOCAL_URL, timeout_s=settings.webhook_timeout_s + 1)
    # WHEN it is created  THEN it is refused, naming the field and the bound
    with pytest.raises(SubscriptionRegistryError) as caught:
        registry.create(TENANT, "hook", _on_failures(), reaction)
    assert caught.value.field == "reaction.timeout_s"
    assert str(caught.value) == (
        f"webhook timeout_s={reaction.timeout_s} is longer than the platform's bound of "
        f"{settings.webhook_timeout_s} s (RHUMBATRON_WEBHOOK_TIMEOUT_S); ask for at most that, "
        "or leave it out to use it"
    )
    # AND the bound itself is taken
    at_bound = WebhookReaction(url=LOCAL_URL, timeout_s=settings.webhook_timeout_s)
    assert registry.create(TENANT, "hook", _on_failures(), at_bound).created


def test_an_agent_reaction_needs_an_agent_of_the_same_tenant(
    registry: SubscriptionRegistry, store: SqliteStore, settings: Settings, clock: ManualClock
) -> None:
    # GIVEN an agent of acme and an agent of another tenant
    agents = AgentRegistry(store, settings, clock)
    agents.register_scripted(TENANT, "reviewer")
    agents.register_scripted(OTHER, "their-reviewer")
    # WHEN acme subscribes its own agent, the other tenant's, and one never registered
    mine = registry.create(TENANT, "review", _on_failures(), AgentReaction(agent_id="reviewer"))
    # THEN only its own is taken; the others are refused alike, naming the agent
    assert mine.created
    for agent_id in ("their-reviewer", "nobody"):
        with pytest.raises(SubscriptionRegistryError) as caught:
            registry.create(
                TENANT, f"r-{agent_id}", _on_failures(), AgentReaction(agent_id=agent_id)
            )
        assert f"agent {agent_id!r} is not one of tenant 'acme'" in str(caught.value)
        assert caught.value.field == "reaction.agent_id"
    assert [r.name for r in registry.list(TENANT)] == ["review"]


@pytest.mark.parametrize("name", ["", "-leading-dash", "has space", "x" * 101, "a\n"])
def test_an_invalid_name_is_refused_naming_it(registry: SubscriptionRegistry, name: str) -> None:
    # GIVEN a name outside the alphabet  WHEN a subscription is created  THEN it is refused
    with pytest.raises(SubscriptionRegistryError, match="subscription name") as caught:
        registry.create(TENANT, name, _on_failures(), _flow())
    assert caught.value.field == "name"


def test_the_reaction_union_is_closed_and_told_apart_by_kind() -> None:
    # GIVEN the wire form of each reaction kind and of an unknown one
    base = {
        "subscription_id": "sub_" + "0" * 32,
        "tenant_id": TENANT,
        "name": "x",
        "selector": {"kinds": ["task.failed"]},
        "governance": {},
        "created_at": NOW,
        "updated_at": NOW,
    }
    # WHEN records are validated  THEN each kind becomes its model; another kind is refused
    agent = SubscriptionRecord.model_validate(
        {**base, "reaction": {"kind": "agent", "agent_id": "a"}}
    )
    assert isinstance(agent.reaction, AgentReaction)
    flow = SubscriptionRecord.model_validate(
        {**base, "reaction": {"kind": "workflow", "workflow": "w"}}
    )
    assert isinstance(flow.reaction, WorkflowReaction)
    with pytest.raises(ValidationError, match="mattermost"):
        SubscriptionRecord.model_validate({**base, "reaction": {"kind": "mattermost"}})
    # (even when it carries another kind's fields: the kind alone says which, and an unknown
    # one is no kind at all)
    for fields in ({"agent_id": "a"}, {"workflow": "w"}):
        with pytest.raises(ValidationError, match="mattermost"):
            SubscriptionRecord.model_validate(
                {**base, "reaction": {"kind": "mattermost", **fields}}
            )
    # AND a stored webhook always carries a secret
    with pytest.raises(ValidationError, match="needs 1 or 2 secrets"):
        SubscriptionRecord.model_validate({**base, "reaction": {"kind": "webhook", "url": "x"}})


def _flow() -> WorkflowReaction:
    return WorkflowReaction(workflow="triage")


def test_the_cli_creates_lists_disables_and_deletes_as_a_platform_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a state directory and a subscription's JSON in the API's form
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "cli-state"))
    body = {
        "name": "ci",
        "selector": {"kinds": ["task.failed"]},
        "reaction": {"kind": "workflow", "workflow": "bisect"},
        "governance": {"cooldownS": 10},
    }
    (tmp_path / "sub.json").write_text(json.dumps(body))
    # WHEN it is created for a tenant
    assert (
        main(["subscriptions", "create", "--tenant", TENANT, "--file", str(tmp_path / "sub.json")])
        == 0
    )
    created = json.loads(capsys.readouterr().out)
    sub_id = created["subscriptionId"]
    # THEN it is listed, disabled, hidden from another tenant, and deleted
    assert created["governance"] == {"cooldownS": 10, "enabled": True}
    assert main(["subscriptions", "list"]) == 0
    assert f"{sub_id}  {TENANT}  ci  enabled  task.failed  -> workflow" in capsys.readouterr().out
    assert main(["subscriptions", "disable", sub_id]) == 0
    assert json.loads(capsys.readouterr().out)["governance"]["enabled"] is False
    assert main(["subscriptions", "show", sub_id, "--tenant", OTHER]) == EXIT_NOT_FOUND
    assert sub_id in capsys.readouterr().err
    # AND other content under the name is refused (3); after delete, nothing is listed
    body["reaction"] = {"kind": "workflow", "workflow": "other"}
    (tmp_path / "sub.json").write_text(json.dumps(body))
    assert (
        main(["subscriptions", "create", "--tenant", TENANT, "--file", str(tmp_path / "sub.json")])
        == EXIT_CANNOT
    )
    assert main(["subscriptions", "delete", sub_id]) == 0
    capsys.readouterr()
    assert main(["subscriptions", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_each_refusal_of_the_registry_says_word_for_word_what_to_do(
    registry: SubscriptionRegistry,
) -> None:
    # GIVEN a tenant's disabled subscription named ci
    record = registry.create(
        TENANT, "ci", _on_failures(), WorkflowReaction(workflow="a"), Governance(enabled=False)
    ).record
    sub = record.subscription_id

    def refusal(call: Any) -> tuple[str, str | None]:
        with pytest.raises(SubscriptionRegistryError) as caught:
            call()
        return str(caught.value), caught.value.field

    # WHEN other content is asked for under its name, another tenant reads its deliveries,
    # an unknown agent is named, and its skipped deliveries are replayed while it is off
    # THEN each refusal names what is wrong and the way out
    assert refusal(
        lambda: registry.create(TENANT, "ci", _on_failures(), WorkflowReaction(workflow="b"))
    ) == (
        f"tenant 'acme' has a subscription named 'ci' ({sub}) with other content; choose "
        "another name, or delete that one first",
        "name",
    )
    # (a webhook without secrets under the name of a workflow is other content too)
    webhook = WebhookReaction(url="http://127.0.0.1/h")
    assert refusal(lambda: registry.create(TENANT, "ci", _on_failures(), webhook))[1] == "name"
    assert refusal(lambda: registry.deliveries(OTHER, sub)) == (
        f"no subscription {sub!r}; `GET /subscriptions` (or `rhumbatron subscriptions list`) "
        "lists them",
        None,
    )
    assert refusal(
        lambda: registry.create(TENANT, "wake", _on_failures(), AgentReaction(agent_id="ghost"))
    ) == (
        "agent 'ghost' is not one of tenant 'acme''s agents; register it first (POST /agents), "
        "or name one of yours",
        "reaction.agent_id",
    )
    assert refusal(
        lambda: registry.create("t" * 65, "x", _on_failures(), WorkflowReaction(workflow="a"))
    ) == (f"a subscription needs a tenant ID of 1 to 64 characters, got {'t' * 65!r}", "tenant_id")
    assert registry.create("t" * 64, "x", _on_failures(), WorkflowReaction(workflow="a")).created
    long_tenant = refusal(
        lambda: registry.create("t" * 100, "x", _on_failures(), WorkflowReaction(workflow="a"))
    )
    assert long_tenant[0].endswith(f"got {'t' * 80!r}")
    assert (
        refusal(lambda: registry.create(" ", "x", _on_failures(), WorkflowReaction(workflow="a")))[
            1
        ]
        == "tenant_id"
    )
    assert refusal(
        lambda: registry.create(TENANT, "_" * 130, _on_failures(), WorkflowReaction(workflow="a"))
    ) == (
        f"subscription name {'_' * 120!r} is invalid: use 1 to 100 characters of A-Z, a-z, "
        "0-9, '.', '_' and '-', starting with a letter or digit",
        "name",
    )
    assert refusal(lambda: registry.replay_skipped(TENANT, sub)) == (
        f"subscription {sub} is disabled; enable it first (PATCH /subscriptions/{{id}} with "
        "enabled=true, or `rhumbatron subscriptions enable`), then replay its skipped "
        "deliveries",
        "governance.enabled",
    )


def test_a_webhook_updated_without_secrets_keeps_the_stored_ones(
    registry: SubscriptionRegistry,
) -> None:
    # GIVEN a webhook subscription with a secret
    secret = generate_secret()
    first = registry.create(
        TENANT, "hook", _on_failures(), WebhookReaction(url="http://127.0.0.1/h", secrets=(secret,))
    )
    # WHEN the same is asked for again without secrets  THEN it is the same subscription,
    # its secret kept
    again = registry.create(
        TENANT, "hook", _on_failures(), WebhookReaction(url="http://127.0.0.1/h")
    )
    assert again.created is False and again.record == first.record
    assert isinstance(again.record.reaction, WebhookReaction)
    assert again.record.reaction.secrets == (secret,)
    # AND asked for with another secret, it is other content
    other = WebhookReaction(url="http://127.0.0.1/h", secrets=(generate_secret(),))
    with pytest.raises(SubscriptionConflictError):
        registry.create(TENANT, "hook", _on_failures(), other)
