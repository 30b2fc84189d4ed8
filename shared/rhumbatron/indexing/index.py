"""One project's full-text index: a SQLite file with an FTS5 table of its canonical artifacts.

The file is ``<state_dir>/indexes/<project_id>.sqlite``. :meth:`ProjectIndex.build` replaces
everything in one transaction, so a reader (the search API, another process on EFS) sees the
old index or the new one, never half of each. Every call opens its own connection and closes
it: :meth:`ProjectIndex.purge` deletes the file, and a connection kept open would keep
writing into an unlinked file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rhumbatron.actors.storage import (
    fsync_directory,
    open_with_schema,
    sqlite_error,
    write_transaction,
)
from rhumbatron.core.clock import Clock, SystemClock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import DomainError
from rhumbatron.paths import path_under
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN

__all__ = ["INDEX_SCHEMA", "Document", "IndexMeta", "ProjectIndex", "SearchHit", "index_path"]

#: ``remove_diacritics 2``: "café" finds "cafe". ``path`` is indexed too, so ``path:readme``
#: narrows a search to matching file names.
INDEX_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS documents USING fts5(
    path, content, tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TABLE IF NOT EXISTS index_meta (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    generation INTEGER NOT NULL,
    documents  INTEGER NOT NULL,
    built_at_s REAL NOT NULL
);
"""
_SCHEMA_VERSION = 1
_SNIPPET_TOKENS = 16
_QUOTING_HINT = (
    'put words with punctuation (-, :, *, ", parentheses) in double quotes, e.g. "foo-bar", '
    'and double a quote inside quotes ("say ""hi""")'
)
_JOURNAL_SUFFIXES = ("-wal", "-shm", "-journal")


@dataclass(frozen=True, slots=True)
class Document:
    """One canonical artifact: its path in the project and its text."""

    path: str
    content: str


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One match: the artifact's path, an excerpt with the matches in ``[brackets]``, and
    its BM25 rank (lower is a better match; hits come best first)."""

    path: str
    snippet: str
    rank: float


@dataclass(frozen=True, slots=True)
class IndexMeta:
    """What the index file holds: the canonical generation, how many documents, and when."""

    generation: int
    documents: int
    built_at: datetime


def index_path(settings: Settings, project_id: str) -> Path:
    """``<state_dir>/indexes/<project_id>.sqlite``; refuses an ID that is not a safe file name.

    The ID becomes a file name, so ``../x`` or ``a/b`` would write outside the folder.
    """
    if not PROJECT_ID_PATTERN.fullmatch(project_id):
        raise DomainError(
            f"project ID {project_id!r} cannot name an index file: it must match "
            f"{PROJECT_ID_PATTERN.pattern} (no path separators, no '..'); use the Project's ID"
        )
    return path_under(settings.state_dir / "indexes", f"{project_id}.sqlite")


@dataclass
class ProjectIndex:
    """The FTS5 index of one project's canonical artifacts (see the module docstring)."""

    settings: Settings
    project_id: str
    clock: Clock = field(default_factory=SystemClock)
    path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.path = index_path(self.settings, self.project_id)

    @property
    def generation(self) -> int | None:
        """The canonical generation the file holds; None when there is no index."""
        meta = self.meta()
        return None if meta is None else meta.generation

    def meta(self) -> IndexMeta | None:
        """The file's meta row; None when the project has no index (never built, purged)."""
        with self._reading() as connection:
            if connection is None:
                return None
            row = connection.execute(
                "SELECT generation, documents, built_at_s FROM index_meta WHERE singleton = 1"
            ).fetchone()
        if row is None:
            return None
        return IndexMeta(
            generation=int(row[0]),
            documents=int(row[1]),
            built_at=datetime.fromtimestamp(float(row[2]), UTC),
        )

    def build(self, generation: int, documents: Sequence[Document]) -> IndexMeta:
        """Replace the whole index with ``documents`` at ``generation``, in one transaction.

        Raises :class:`DomainError` for a negative generation or a path given twice (the
        index would answer with both copies); the old index then stays as it was.
        """
        if generation < 0:
            raise DomainError(
                f"generation {generation} of {self.project_id} is negative; "
                "index a canonical generation (0 or more)"
            )
        seen: set[str] = set()
        for document in documents:
            if document.path in seen:
                raise DomainError(
                    f"path {document.path!r} appears twice in generation {generation} of "
                    f"{self.project_id}; give each artifact once"
                )
            seen.add(document.path)
        meta = IndexMeta(generation, len(documents), self.clock.now())
        connection = open_with_schema(
            self.path,
            self.settings,
            INDEX_SCHEMA,
            version=_SCHEMA_VERSION,
            what="index",
            new_dirs_to_sync=2,  # indexes/ may be new too
        )
        with closing(connection), write_transaction(connection, self.path):
            try:
                # A plain FTS5 table (it stores its own content) supports DELETE.
                connection.execute("DELETE FROM documents")
                connection.executemany(
                    "INSERT INTO documents (path, content) VALUES (?, ?)",
                    ((document.path, document.content) for document in documents),
                )
                # One b-tree instead of one per insert batch: searches read less.
                connection.execute("INSERT INTO documents (documents) VALUES ('optimize')")
                connection.execute(
                    "INSERT OR REPLACE INTO index_meta "
                    "(singleton, generation, documents, built_at_s) VALUES (1, ?, ?, ?)",
                    (meta.generation, meta.documents, meta.built_at.timestamp()),
                )
            except sqlite3.Error as exc:
                raise sqlite_error(exc, self.path, "cannot build the index") from exc
        return meta

    def search(self, query: str, limit: int = 10) -> list[SearchHit]:
        """The best ``limit`` matches of the FTS5 ``query``; ``[]`` when there is no index.

        Raises :class:`DomainError` naming the query when it is not valid FTS5 syntax.
        """
        if limit < 1:
            raise DomainError(f"search limit {limit} must be at least 1")
        with self._reading() as connection:
            if connection is None:
                return []
            try:
                rows = connection.execute(
                    "SELECT path, snippet(documents, -1, '[', ']', '…', ?), bm25(documents) "
                    "FROM documents WHERE documents MATCH ? ORDER BY bm25(documents) LIMIT ?",
                    (_SNIPPET_TOKENS, query, limit),
                ).fetchall()
            except sqlite3.OperationalError as exc:
                if _is_bad_query(query):
                    raise DomainError(
                        f"search query {query!r} is not valid full-text syntax ({exc}); "
                        + _QUOTING_HINT
                    ) from None
                raise sqlite_error(exc, self.path, "cannot search the index") from exc
        return [SearchHit(str(row[0]), str(row[1]), float(row[2])) for row in rows]

    def purge(self) -> bool:
        """Delete the index file and its journal files; whether there was anything to delete."""
        removed = False
        for path in (
            self.path,
            *(self.path.with_name(self.path.name + s) for s in _JOURNAL_SUFFIXES),
        ):
            try:
                path.unlink()
                removed = True
            except FileNotFoundError:
                continue
        if removed:
            # The deletion must survive a crash, or the sweep would see the index again.
            fsync_directory(self.path.parent)
        return removed

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection | None]:
        """A connection to the index file, or None when there is no index to read.

        Reading never creates the file: a search of a never-built project finds nothing.
        """
        connection = self._open_existing()
        if connection is None:
            yield None
            return
        with closing(connection):
            try:
                version = connection.execute("PRAGMA user_version").fetchone()[0]
            except sqlite3.Error as exc:
                raise sqlite_error(exc, self.path, "cannot read the index") from exc
            # A file without the schema is being created by a first build right now.
            yield connection if version == _SCHEMA_VERSION else None

    def _open_existing(self) -> sqlite3.Connection | None:
        try:
            # mode=rw: a reader must never create the file (open_database would), or a
            # search racing a purge would leave an empty index behind.
            return sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=rw",
                uri=True,
                timeout=self.settings.sqlite_busy_timeout_ms / 1000,
                check_same_thread=False,
            )
        except sqlite3.OperationalError as exc:
            if not self.path.exists():
                return None
            raise sqlite_error(exc, self.path, "cannot open the index") from exc


def _is_bad_query(query: str) -> bool:
    """Whether ``query`` itself is what SQLite refused: it fails on an empty FTS5 table too.

    SQLite's messages for a bad query vary ("fts5: syntax error", "no such column",
    "unterminated string"); asking a throwaway table tells a bad query from a bad file
    without matching on them.
    """
    with closing(sqlite3.connect(":memory:")) as probe:
        probe.execute("CREATE VIRTUAL TABLE documents USING fts5(path, content)")
        try:
            probe.execute("SELECT 1 FROM documents WHERE documents MATCH ?", (query,)).fetchall()
        except sqlite3.OperationalError:
            return True
    return False
