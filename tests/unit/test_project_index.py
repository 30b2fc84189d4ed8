"""One project's FTS5 index file: build replaces everything at once, search takes the query
as a parameter, purge deletes the file (spec: the ``indexing`` queue's indexer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import ActorError, DomainError
from rhumbatron.indexing import Document, ProjectIndex

PROJECT = "acme-web"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")


@pytest.fixture
def index(settings: Settings) -> ProjectIndex:
    return ProjectIndex(settings, PROJECT, ManualClock())


DOCS = (
    Document("README.md", "Rhumbatron routes events between agents and projects."),
    Document("src/app.py", "def handler(event):\n    return 'the quick brown fox'\n"),
)


def test_a_built_index_finds_a_word_of_a_document(index: ProjectIndex, settings: Settings) -> None:
    # GIVEN an index built at generation 3
    meta = index.build(3, DOCS)
    # WHEN a word of one document is searched
    hits = index.search("fox")
    # THEN that document comes back with the word marked, from the project's own file
    assert [hit.path for hit in hits] == ["src/app.py"]
    assert "[fox]" in hits[0].snippet
    assert meta.generation == index.generation == 3
    assert meta.documents == 2
    assert index.path == settings.state_dir / "indexes" / f"{PROJECT}.sqlite"


def test_a_rebuild_replaces_the_whole_index(index: ProjectIndex) -> None:
    # GIVEN an index at generation 1
    index.build(1, DOCS)
    # WHEN generation 2 holds other documents
    index.build(2, [Document("NOTES.md", "a lazy dog")])
    # THEN the old words are gone and the new ones found
    assert index.search("fox") == []
    assert [hit.path for hit in index.search("dog")] == ["NOTES.md"]
    assert index.generation == 2


def test_a_failed_build_leaves_the_previous_index_whole(index: ProjectIndex) -> None:
    # GIVEN an index at generation 1
    index.build(1, DOCS)
    # WHEN a rebuild fails after it has deleted the old rows (content SQLite cannot store)
    broken = [Document("NOTES.md", "a lazy dog"), Document("bad", object())]  # type: ignore[arg-type]
    with pytest.raises(ActorError, match="cannot build the index"):
        index.build(2, broken)
    # THEN the transaction rolled back: generation 1 answers, whole
    assert index.generation == 1
    assert [hit.path for hit in index.search("fox")] == ["src/app.py"]
    assert index.search("dog") == []


def test_a_path_given_twice_is_refused(index: ProjectIndex) -> None:
    with pytest.raises(DomainError, match=r"'a\.md' appears twice"):
        index.build(1, [Document("a.md", "x"), Document("a.md", "y")])


def test_results_come_best_first_and_respect_the_limit(index: ProjectIndex) -> None:
    # GIVEN three documents mentioning "fox" once, twice and three times
    index.build(
        1,
        [
            Document("one.md", "fox and many other words of filler text here"),
            Document("three.md", "fox fox fox"),
            Document("two.md", "fox fox and some filler"),
        ],
    )
    # WHEN two hits are asked for
    hits = index.search("fox", limit=2)
    # THEN the densest documents come first
    assert [hit.path for hit in hits] == ["three.md", "two.md"]
    assert hits[0].rank <= hits[1].rank


def test_a_quoted_phrase_with_punctuation_is_found(index: ProjectIndex) -> None:
    index.build(1, [Document("a.md", "use foo-bar here")])
    assert [hit.path for hit in index.search('"foo-bar"')] == ["a.md"]


@pytest.mark.parametrize("query", ["foo-bar", '"unterminated', "AND", "", "(x"])
def test_a_malformed_query_names_itself_and_how_to_quote(index: ProjectIndex, query: str) -> None:
    # GIVEN an index
    index.build(1, DOCS)
    # WHEN the query is not valid FTS5 syntax
    with pytest.raises(DomainError) as caught:
        index.search(query)
    # THEN the error names the query and says how to quote
    assert repr(query) in str(caught.value)
    assert "double quotes" in str(caught.value)


def test_a_query_is_a_parameter_not_sql(index: ProjectIndex) -> None:
    index.build(1, DOCS)
    assert index.search('"x\'); DROP TABLE documents; --"') == []
    assert index.search("fox") != []


def test_searching_a_project_without_an_index_finds_nothing_and_creates_no_file(
    index: ProjectIndex,
) -> None:
    assert index.search("fox") == []
    assert index.generation is None
    assert not index.path.exists()


@pytest.mark.parametrize("bad_id", ["../escape", "a/b", "a\\b", "..", ".hidden", ""])
def test_a_project_id_that_is_not_a_safe_file_name_is_refused(
    settings: Settings, bad_id: str
) -> None:
    with pytest.raises(DomainError, match="no path separators"):
        ProjectIndex(settings, bad_id)


def test_purge_deletes_the_file_and_its_journal(index: ProjectIndex) -> None:
    # GIVEN a built index (with WAL files beside it)
    index.build(1, DOCS)
    index.path.with_name(index.path.name + "-wal").touch()
    # WHEN it is purged
    assert index.purge() is True
    # THEN no file of it remains, and a second purge has nothing to do
    assert list(index.path.parent.iterdir()) == []
    assert index.generation is None
    assert index.purge() is False
