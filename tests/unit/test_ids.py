"""Identities (spec "Envelopes", "Transactional outbox"): stableEventId, actor-minted IDs, and
the project → stream mapping, pinned by vectors computed outside the implementation.

How the vectors were made (DECISIONS: UTF-8, fields joined by \\x1f, absent = empty string):

* FNV-1a 32: the three published vectors of the FNV reference, and the others with a bash
  loop over ``od -An -tu1`` bytes: ``h=$(( ((h ^ b) * 16777619) & 0xFFFFFFFF ))`` from
  ``h=2166136261``.
* stable IDs: ``printf 'chg-1\\x1ftask.completed\\x1ftsk-1\\x1f' | sha256sum | cut -c1-32``,
  prefixed with ``evt_``.
"""

from __future__ import annotations

import re
import uuid

import pytest

from rhumbatron.protocol.ids import (
    event_stream_index,
    event_stream_name,
    event_stream_subject,
    fnv1a32,
    new_event_id,
    resource_shard_index,
    stable_event_id,
    stream_index,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0x811C9DC5),  # the offset basis
        ("a", 0xE40C292C),
        ("foobar", 0xBF9CF968),
    ],
)
def test_fnv1a32_matches_the_published_vectors(text: str, expected: int) -> None:
    assert fnv1a32(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("acme-web", 0xC8D18FD0),
        ("acme-billing", 0x142A9FD9),
        ("café", 0xA82B5049),  # UTF-8 bytes, not code points
        ("change:chg-1", 0x23A34C99),
    ],
)
def test_fnv1a32_hashes_the_utf8_bytes(text: str, expected: int) -> None:
    assert fnv1a32(text) == expected


@pytest.mark.parametrize(
    ("project_id", "expected"),
    [
        ("acme-web", 0),  # 0xc8d18fd0 mod 8
        ("acme-billing", 1),  # 0x142a9fd9 mod 8
        ("p1", 2),  # 0xa04ed67a mod 8
        ("a", 4),  # 0xe40c292c mod 8
        ("", 5),  # 0x811c9dc5 mod 8
        ("demo", 6),  # 0xaefd3536 mod 8
        ("projé-1", 4),  # 0x6eb02674 mod 8
    ],
)
def test_stream_index_is_fnv1a32_of_the_project_mod_8(project_id: str, expected: int) -> None:
    assert stream_index(project_id) == expected


def test_stream_index_never_changes_for_a_project() -> None:
    # One Project always maps to one stream (S0-039): same input, same stream, every time.
    assert {stream_index("acme-web") for _ in range(100)} == {0}


def test_stream_names_and_subjects_are_zero_padded() -> None:
    assert [event_stream_name(i) for i in range(8)] == [f"EVENTS_0{i}" for i in range(8)]
    assert [event_stream_subject(i) for i in range(8)] == [f"events.0{i}" for i in range(8)]
    with pytest.raises(ValueError, match=r"outside 0\.\.7"):
        event_stream_name(8)


def test_an_event_streams_index_is_read_back_from_its_name_and_any_other_name_is_refused() -> None:
    assert [event_stream_index(f"EVENTS_0{i}") for i in range(8)] == list(range(8))
    with pytest.raises(ValueError) as refused:
        event_stream_index("EVENTS_08")
    assert str(refused.value) == "'EVENTS_08' is no event stream: EVENTS_00 … EVENTS_07"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("chg-1", "task.completed", "tsk-1"), "evt_b842dd8af0a9b557c516a6417d20c1ba"),
        (("chg-1", "change.created"), "evt_2d2562607bcb3e01099f680c0b4c6b2a"),
        (("chg-1", "task.completed", "tsk-1", "retry-2"), "evt_9f994238d873d3134949226728816a5d"),
        (("chg-2", "change.planned"), "evt_ec82eeffd68a7ec9dc4fd01f67f64ada"),
        (("chg-7", "candidate.created", None, "base-3"), "evt_798b92cf19906f2ff8d21d932c5f2883"),
        (("ünï", "change.created"), "evt_2201ddfac478cb2420af76224dd590e9"),
    ],
)
def test_stable_event_id_matches_vectors_computed_with_sha256sum(
    args: tuple[str, ...], expected: str
) -> None:
    assert stable_event_id(*args) == expected


def test_stable_event_id_is_deterministic_and_sensitive_to_every_part() -> None:
    # GIVEN the same inputs twice
    first = stable_event_id("chg-1", "task.completed", "tsk-1", "k")
    # THEN the ID is the same (a retried step repeats it, S0-018)
    assert stable_event_id("chg-1", "task.completed", "tsk-1", "k") == first
    # AND any changed part changes the ID
    others = {
        stable_event_id("chg-2", "task.completed", "tsk-1", "k"),
        stable_event_id("chg-1", "task.failed", "tsk-1", "k"),
        stable_event_id("chg-1", "task.completed", "tsk-2", "k"),
        stable_event_id("chg-1", "task.completed", "tsk-1", "j"),
        stable_event_id("chg-1", "task.completed", "tsk-1"),
    }
    assert first not in others
    assert len(others) == 5


def test_stable_event_id_treats_absent_task_and_key_as_empty_strings() -> None:
    assert stable_event_id("chg-1", "change.created") == stable_event_id(
        "chg-1", "change.created", "", ""
    )


def test_new_event_id_is_evt_plus_32_hex_digits() -> None:
    assert re.fullmatch(r"evt_[0-9a-f]{32}", new_event_id())


def test_new_event_id_is_the_hex_of_a_random_uuid4() -> None:
    # The spec's crypto.randomUUID(); DECISIONS: a UUID4. Its version and variant bits are
    # fixed, so an ID made another way (a hash of the time, a UUID1) shows within a few IDs.
    for _ in range(64):
        minted = uuid.UUID(hex=new_event_id().removeprefix("evt_"))
        assert (minted.version, minted.variant) == (4, uuid.RFC_4122)


def test_new_event_ids_are_unique() -> None:
    ids = {new_event_id() for _ in range(10_000)}
    assert len(ids) == 10_000


@pytest.mark.parametrize(
    ("key", "expected"),
    [("change:chg-1", 9), ("change:chg-2", 0)],  # 0x23a34c99 mod 16, 0x20a347e0 mod 16
)
def test_resource_shard_index_is_fnv1a32_of_the_key_mod_the_shard_count(
    key: str, expected: int
) -> None:
    assert resource_shard_index(key, 16) == expected


def test_resource_shard_index_refuses_a_zero_shard_count() -> None:
    with pytest.raises(ValueError, match="shard_count"):
        resource_shard_index("change:chg-1", 0)
