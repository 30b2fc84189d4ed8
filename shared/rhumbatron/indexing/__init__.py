"""Per-project full-text indexes of the canonical artifacts, and the ``indexing`` queue's
handler that builds and purges them.

:class:`ProjectIndex` is one project's SQLite FTS5 file; :class:`Indexer` handles
``index.build`` and ``index.purge`` and keeps the ``project_indexes`` table the sweep reads.
"""

from rhumbatron.indexing.index import Document, IndexMeta, ProjectIndex, SearchHit, index_path
from rhumbatron.indexing.indexer import (
    PROJECT_INDEXES_SCHEMA,
    CanonicalDocuments,
    CanonicalSnapshot,
    Indexer,
    IndexState,
    IndexStatus,
)

__all__ = [
    "PROJECT_INDEXES_SCHEMA",
    "CanonicalDocuments",
    "CanonicalSnapshot",
    "Document",
    "IndexMeta",
    "IndexState",
    "IndexStatus",
    "Indexer",
    "ProjectIndex",
    "SearchHit",
    "index_path",
]
