"""The indexer, the ``indexing`` queue's handler (S0-139, S0-140, S0-171, S0-180, S0-181):
index.build indexes what is canonical, once per generation; index.purge deletes the index;
every failure is recorded in project_indexes and raised for the queue's retries."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.errors import DomainError
from rhumbatron.indexing import (
    PROJECT_INDEXES_SCHEMA,
    CanonicalSnapshot,
    Document,
    Indexer,
    IndexState,
)
from rhumbatron.messaging.queue_consumer import Delivery, Retry
from rhumbatron.protocol.envelopes import Command

PROJECT = "acme-web"
DELIVERY = Delivery(queue="indexing", stream_seq=1, delivered=1, max_deliveries=4, headers={})


@dataclass
class CanonicalFiles:
    """The canonical source port, held in memory: what a promotion made canonical."""

    snapshots: dict[str, CanonicalSnapshot] = field(default_factory=dict)
    broken: Exception | None = None

    def promote(self, project_id: str, generation: int, **files: str) -> None:
        documents = tuple(Document(path, text) for path, text in files.items())
        self.snapshots[project_id] = CanonicalSnapshot(generation, documents)

    def canonical_snapshot(self, project_id: str) -> CanonicalSnapshot | None:
        if self.broken is not None:
            raise self.broken
        return self.snapshots.get(project_id)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def source() -> CanonicalFiles:
    return CanonicalFiles()


@pytest.fixture
def indexer(tmp_path: Path, clock: ManualClock, source: CanonicalFiles) -> Iterator[Indexer]:
    settings = load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")
    store = SqliteStore(settings.state_dir / "product.sqlite", settings, PROJECT_INDEXES_SCHEMA)
    yield Indexer(settings=settings, store=store, clock=clock, source=source)
    store.close()


def build(project_id: str = PROJECT, generation: int | None = None) -> Command:
    return Command.create(
        command_id=f"cmd_index_{project_id}_{generation}",
        command_type="index.build",
        project_id=project_id,
        created_at=ManualClock().now(),
        payload={"generation": generation, "reason": "promotion"},
    )


def purge(project_id: str = PROJECT) -> Command:
    return Command.create(
        command_id=f"cmd_purge_{project_id}",
        command_type="index.purge",
        project_id=project_id,
        created_at=ManualClock().now(),
        payload={"reason": "archived"},
    )


async def test_a_build_indexes_the_canonical_artifacts_and_marks_the_index_ready(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN generation 4 canonical
    source.promote(PROJECT, 4, **{"README.md": "routes events", "app.py": "quick brown fox"})
    # WHEN index.build is handled
    assert await indexer(build(generation=4), DELIVERY) is None
    # THEN a search finds a word of a document, and the row says ready at 4
    assert [hit.path for hit in indexer.project_index(PROJECT).search("fox")] == ["app.py"]
    status = indexer.status(PROJECT)
    assert status is not None
    assert (status.status, status.generation, status.documents) == (IndexState.READY, 4, 2)
    assert indexer.ready_generation(PROJECT) == 4


async def test_a_new_generation_replaces_the_index(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN an index at generation 1 with "fox"
    source.promote(PROJECT, 1, **{"a.md": "fox"})
    await indexer(build(generation=1), DELIVERY)
    # WHEN generation 2 replaces "fox" with "dog" and is indexed
    source.promote(PROJECT, 2, **{"a.md": "dog"})
    await indexer(build(generation=2), DELIVERY)
    # THEN the old word is gone
    index = indexer.project_index(PROJECT)
    assert index.search("fox") == []
    assert [hit.path for hit in index.search("dog")] == ["a.md"]
    assert indexer.ready_generation(PROJECT) == 2


async def test_a_repeated_build_of_the_same_generation_does_nothing(
    indexer: Indexer, source: CanonicalFiles, clock: ManualClock
) -> None:
    # GIVEN generation 3 indexed (artifact.promoted's index.build)
    source.promote(PROJECT, 3, **{"a.md": "fox"})
    await indexer(build(generation=3), DELIVERY)
    first = indexer.project_index(PROJECT).meta()
    row = indexer.status(PROJECT)
    # WHEN the same generation comes again later (canonical.advanced's index.build)
    clock.advance(60)
    assert await indexer(build(generation=3), DELIVERY) is None
    # THEN neither the file nor the row was rewritten
    assert indexer.project_index(PROJECT).meta() == first
    assert indexer.status(PROJECT) == row


async def test_a_command_naming_an_older_generation_indexes_the_current_one(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN canonical has moved on to generation 7 since the command was queued
    source.promote(PROJECT, 7, **{"a.md": "current words"})
    # WHEN an index.build for generation 5 arrives
    assert await indexer(build(generation=5), DELIVERY) is None
    # THEN what is canonical is indexed
    assert indexer.ready_generation(PROJECT) == 7
    assert indexer.project_index(PROJECT).search("current") != []


async def test_a_command_ahead_of_the_source_indexes_what_is_there_and_asks_again(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN the source still at generation 2
    source.promote(PROJECT, 2, **{"a.md": "fox"})
    # WHEN an index.build names generation 3
    result = await indexer(build(generation=3), DELIVERY)
    # THEN generation 2 is indexed and the command comes back after the queue's 30 s
    assert indexer.ready_generation(PROJECT) == 2
    assert isinstance(result, Retry)
    assert result.delay_s == 30.0


async def test_a_failing_build_is_recorded_and_raised_for_a_retry(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN a canonical source that cannot be read
    source.broken = OSError("canonical store unreachable")
    # WHEN index.build is delivered twice
    for _ in range(2):
        with pytest.raises(OSError, match="unreachable"):
            await indexer(build(generation=1), DELIVERY)
    # THEN the row says failed, with the error and both attempts, and no ready index
    status = indexer.status(PROJECT)
    assert status is not None
    assert status.status is IndexState.FAILED
    assert status.error == "OSError: canonical store unreachable"
    assert status.attempts == 2
    assert indexer.ready_generation(PROJECT) is None


async def test_a_build_failing_on_its_last_delivery_is_recorded_too(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN a canonical source that cannot be read
    source.broken = OSError("canonical store unreachable")
    # WHEN index.build is delivered 1 + 3 times, the last with no retry left
    deliveries = [replace(DELIVERY, delivered=n) for n in range(1, 5)]
    for delivery in deliveries:
        with pytest.raises(OSError, match="unreachable"):
            await indexer(build(generation=1), delivery)
    # THEN the last delivery's failure is recorded as well: the row is what remains
    assert deliveries[-1].is_last
    status = indexer.status(PROJECT)
    assert status is not None
    assert status.status is IndexState.FAILED
    assert status.attempts == 4


async def test_a_build_after_a_failure_succeeds_and_clears_it(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN a failed build
    source.broken = RuntimeError("disk hiccup")
    with pytest.raises(RuntimeError):
        await indexer(build(generation=1), DELIVERY)
    # WHEN the retry finds the source readable
    source.broken = None
    source.promote(PROJECT, 1, **{"a.md": "fox"})
    await indexer(build(generation=1), DELIVERY)
    # THEN the index is ready and the failure cleared
    status = indexer.status(PROJECT)
    assert status is not None
    assert (status.status, status.generation, status.error, status.attempts) == (
        IndexState.READY,
        1,
        "",
        0,
    )


async def test_a_failed_rebuild_keeps_the_previous_index_searchable(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN generation 1 indexed, then generation 2 with the same path twice
    source.promote(PROJECT, 1, **{"a.md": "fox"})
    await indexer(build(generation=1), DELIVERY)
    source.snapshots[PROJECT] = CanonicalSnapshot(2, (Document("a", "x"), Document("a", "y")))
    # WHEN it is indexed
    with pytest.raises(DomainError, match="appears twice"):
        await indexer(build(generation=2), DELIVERY)
    # THEN the failure is recorded against the generation still served
    status = indexer.status(PROJECT)
    assert status is not None
    assert (status.status, status.generation, status.attempts) == (IndexState.FAILED, 1, 1)
    assert indexer.project_index(PROJECT).search("fox") != []


async def test_a_ready_row_without_its_file_is_rebuilt(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN a ready index whose file was lost
    source.promote(PROJECT, 1, **{"a.md": "fox"})
    await indexer(build(generation=1), DELIVERY)
    indexer.project_index(PROJECT).path.unlink()
    # WHEN the backfill queues index.build
    await indexer(build(), DELIVERY)
    # THEN the file is back
    assert indexer.project_index(PROJECT).search("fox") != []


async def test_a_project_with_nothing_canonical_is_left_alone(indexer: Indexer) -> None:
    assert await indexer(build(generation=1), DELIVERY) is None
    assert indexer.status(PROJECT) is None
    assert not indexer.project_index(PROJECT).path.exists()


async def test_purge_deletes_the_index_and_marks_it_purged(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN a ready index
    source.promote(PROJECT, 1, **{"a.md": "fox"})
    await indexer(build(generation=1), DELIVERY)
    # WHEN the project's index is purged
    assert await indexer(purge(), DELIVERY) is None
    # THEN the file is gone and the row says purged
    assert not indexer.project_index(PROJECT).path.exists()
    status = indexer.status(PROJECT)
    assert status is not None
    assert (status.status, status.generation) == (IndexState.PURGED, None)
    assert indexer.ready_generation(PROJECT) is None


async def test_purging_a_never_built_project_does_nothing(indexer: Indexer) -> None:
    assert await indexer(purge("never-built"), DELIVERY) is None
    assert indexer.status("never-built") is None
    assert not (indexer.settings.state_dir / "indexes").exists()


async def test_another_command_type_is_refused(indexer: Indexer) -> None:
    command = Command.create(
        command_id="cmd_forks",
        command_type="forks.sweep",
        project_id=PROJECT,
        created_at=ManualClock().now(),
        payload={},
    )
    with pytest.raises(DomainError, match=r"'forks\.sweep'"):
        await indexer(command, DELIVERY)
    assert indexer.status(PROJECT) is None


async def test_the_sweep_sees_which_projects_still_have_index_rows(
    indexer: Indexer, source: CanonicalFiles
) -> None:
    # GIVEN one ready, one failed and one purged index
    source.promote("ready-one", 1, **{"a.md": "x"})
    source.promote("purged-one", 1, **{"a.md": "x"})
    await indexer(build("ready-one", 1), DELIVERY)
    await indexer(build("purged-one", 1), DELIVERY)
    await indexer(purge("purged-one"), DELIVERY)
    source.snapshots["failed-one"] = CanonicalSnapshot(1, (Document("a", ""), Document("a", "")))
    with pytest.raises(DomainError):
        await indexer(build("failed-one", 1), DELIVERY)
    # WHEN the sweep asks
    # THEN ready and failed still have rows to purge; purged ones do not
    assert indexer.projects_with_index_rows() == ["failed-one", "ready-one"]
    assert indexer.projects_with_index_rows(["ready-one", "purged-one", "other"]) == ["ready-one"]
    assert indexer.projects_with_index_rows([]) == []
    # AND the backfill sees every project but the ready one as without a ready index
    assert indexer.projects_without_ready_index(
        ["purged-one", "ready-one", "failed-one", "new-one"]
    ) == ["purged-one", "failed-one", "new-one"]
