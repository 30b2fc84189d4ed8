"""An actor's patch language and its names (doc 002 §1: a transition's patch is written in the
transaction that writes its facts).

Each mutation kind is compiled to one SQL statement on the actor's own tables: these tests
run every kind against a table with a two-column key, where a key joined wrongly, a conflict
target dropped or an ``OR IGNORE`` lost shows; and they pin the errors that name a bad
patch, key or actor reference, since those messages are what an operator reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from rhumbatron.actors.actor import Actor, ActorKind, ActorRef
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.transition import Delete, Insert, Mutation, Transition, Update, Upsert
from rhumbatron.errors import ActorError, DomainError


class PairsActor(Actor):
    """An actor whose state is keyed by two columns, and a table that is all key."""

    KIND = ActorKind.RESOURCE_SHARD
    STATE_SCHEMA = """
    CREATE TABLE IF NOT EXISTS pairs (
        left_id  TEXT NOT NULL,
        right_id TEXT NOT NULL,
        note     TEXT,
        PRIMARY KEY (left_id, right_id)
    );
    CREATE TABLE IF NOT EXISTS links (
        left_id  TEXT NOT NULL,
        right_id TEXT NOT NULL,
        PRIMARY KEY (left_id, right_id)
    );
    """
    STATE_TABLES: ClassVar[frozenset[str]] = frozenset({"pairs", "links"})

    def patch(self, *mutations: Mutation) -> None:
        self.transact(lambda _: Transition(patch=mutations))

    def rows(self, table: str) -> list[tuple[object, ...]]:
        return [tuple(r) for r in self.connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2")]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")


@pytest.fixture
def actor(settings: Settings) -> Iterator[PairsActor]:
    with PairsActor(ActorRef(ActorKind.RESOURCE_SHARD, "acme-web", 3), settings) as opened:
        opened.patch(
            Insert("pairs", {"left_id": "a", "right_id": "x", "note": "ax"}),
            Insert("pairs", {"left_id": "a", "right_id": "y", "note": "ay"}),
            Insert("pairs", {"left_id": "b", "right_id": "x", "note": "bx"}),
        )
        yield opened


def test_an_insert_that_ignores_existing_rows_leaves_the_row_and_a_plain_one_is_refused(
    actor: PairsActor,
) -> None:
    actor.patch(
        Insert("pairs", {"left_id": "a", "right_id": "x", "note": "again"}, ignore_existing=True)
    )
    assert ("a", "x", "ax") in actor.rows("pairs")
    with pytest.raises(DomainError, match=r"the change to pairs breaks a constraint"):
        actor.patch(Insert("pairs", {"left_id": "a", "right_id": "x", "note": "again"}))
    assert len(actor.rows("pairs")) == 3


def test_an_upsert_on_a_two_column_key_updates_only_that_row(actor: PairsActor) -> None:
    actor.patch(
        Upsert(
            "pairs", {"left_id": "a", "right_id": "y", "note": "new"}, key=("left_id", "right_id")
        )
    )
    actor.patch(
        Upsert(
            "pairs", {"left_id": "c", "right_id": "z", "note": "cz"}, key=("left_id", "right_id")
        )
    )
    assert actor.rows("pairs") == [
        ("a", "x", "ax"),
        ("a", "y", "new"),
        ("b", "x", "bx"),
        ("c", "z", "cz"),
    ]


def test_an_upsert_of_a_row_that_is_all_key_does_nothing_when_it_exists(
    actor: PairsActor,
) -> None:
    link = {"left_id": "a", "right_id": "x"}
    actor.patch(Upsert("links", link, key=("left_id", "right_id")))
    actor.patch(Upsert("links", link, key=("left_id", "right_id")))
    assert actor.rows("links") == [("a", "x")]


def test_an_update_matches_every_key_column_and_must_match_one_row(actor: PairsActor) -> None:
    actor.patch(Update("pairs", key={"left_id": "a", "right_id": "y"}, values={"note": "set"}))
    assert actor.rows("pairs") == [("a", "x", "ax"), ("a", "y", "set"), ("b", "x", "bx")]
    with pytest.raises(
        ActorError,
        match=re.escape("update of pairs {'left_id': 'c', 'right_id': 'x'} matched 0 rows"),
    ):
        actor.patch(Update("pairs", key={"left_id": "c", "right_id": "x"}, values={"note": "-"}))


def test_a_delete_matches_every_column_of_its_where_and_never_deletes_every_row(
    actor: PairsActor,
) -> None:
    actor.patch(Delete("pairs", {"left_id": "a", "right_id": "x"}))
    assert actor.rows("pairs") == [("a", "y", "ay"), ("b", "x", "bx")]
    with pytest.raises(ActorError, match=r"^refusing to delete every row of pairs$"):
        actor.patch(Delete("pairs", {}))
    assert len(actor.rows("pairs")) == 2


def test_a_patch_of_a_table_the_actor_does_not_own_is_refused_naming_the_actor(
    actor: PairsActor,
) -> None:
    with pytest.raises(
        ActorError,
        match=re.escape(
            "PairsActor has no table 'outbox' to patch; its tables are ['links', 'pairs']"
        ),
    ):
        actor.patch(Insert("outbox", {"event_id": "evt"}))


def test_a_column_name_that_is_not_a_plain_identifier_is_refused_by_name(
    actor: PairsActor,
) -> None:
    with pytest.raises(
        ActorError,
        match=re.escape("column name 'note; DROP TABLE pairs' is not a plain identifier"),
    ):
        actor.patch(Insert("pairs", {"left_id": "d", "right_id": "d", "note; DROP TABLE pairs": 1}))
    assert len(actor.rows("pairs")) == 3


def test_a_bad_project_id_is_refused_saying_what_an_id_may_hold() -> None:
    with pytest.raises(ActorError) as refused:
        ActorRef(ActorKind.PROJECT_ROOT, "../etc")
    assert str(refused.value) == (
        "project id '../etc' is not valid: use 1-64 letters, digits, '_' or '-', "
        "starting with a letter or digit"
    )


@pytest.mark.parametrize(
    ("kind", "shard"), [(ActorKind.PROJECT_ROOT, 2), (ActorKind.RESOURCE_SHARD, None)]
)
def test_a_shard_number_goes_with_resource_shards_only(kind: ActorKind, shard: int | None) -> None:
    with pytest.raises(ActorError) as refused:
        ActorRef(kind, "acme-web", shard)
    assert str(refused.value) == (
        f"a {kind} actor of 'acme-web' cannot have shard {shard}: "
        "resource shards have a shard number, project roots do not"
    )


@pytest.mark.parametrize(
    "key",
    [
        "resource_shard:acme-web",  # a shard without its number
        "project_root:acme-web:01",  # a root with one
        "project_root",
        "resource_shard:acme-web:one",
        "queue:acme-web",
    ],
)
def test_an_actor_key_of_the_wrong_shape_is_refused_naming_both_shapes(key: str) -> None:
    with pytest.raises(ActorError) as refused:
        ActorRef.parse(key)
    assert str(refused.value) == (
        f"actor key {key!r} is not 'project_root:<project>' or 'resource_shard:<project>:<shard>'"
    )


def test_an_actor_key_reads_back_as_the_ref_that_wrote_it() -> None:
    for ref in (
        ActorRef(ActorKind.PROJECT_ROOT, "acme-web"),
        ActorRef(ActorKind.RESOURCE_SHARD, "acme-web", 7),
    ):
        assert ActorRef.parse(ref.key) == ref
