"""The syncs a test watches (``monkeypatch``): the paths the code makes durable, and a disk
that fails the sync of one file. Every other sync still runs for real.

The package makes a file durable through the ``os`` module — ``os.fsync`` for a folder's
entries (``storage.fsync_directory``), ``os.fdatasync`` for the view store's WAL
(``StreamViews.sync``; ``os.fsync`` where the platform has no ``fdatasync``) — so patching
both (:func:`watch_syncs`) reaches every one of them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = ["SYNC_CALLS", "fail_fsyncs_of", "path_of", "record_fsyncs", "watch_syncs"]

#: The ``os`` calls that make a file durable, of those this platform has.
SYNC_CALLS = tuple(name for name in ("fsync", "fdatasync") if hasattr(os, name))

Sync = Callable[[int], None]


def path_of(descriptor: int) -> str:
    """The path an open file descriptor of this process names (Linux's ``/proc``)."""
    return os.readlink(f"/proc/self/fd/{descriptor}")


def watch_syncs(monkeypatch: pytest.MonkeyPatch, watch: Callable[[Sync], Sync]) -> None:
    """Replace each of :data:`SYNC_CALLS` by ``watch(the real call)``."""
    for name in SYNC_CALLS:
        monkeypatch.setattr(os, name, watch(getattr(os, name)))


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every sync (``fsync`` or ``fdatasync``) from now on, in order (the real
    call still runs)."""
    synced: list[str] = []

    def watch(sync: Sync) -> Sync:
        def recorded(descriptor: int) -> None:
            synced.append(path_of(descriptor))
            sync(descriptor)

        return recorded

    watch_syncs(monkeypatch, watch)
    return synced


def fail_fsyncs_of(monkeypatch: pytest.MonkeyPatch, path: str | Path) -> None:
    """From now on a sync of ``path`` fails as a disk's I/O error does (EIO)."""

    def watch(sync: Sync) -> Sync:
        def failing(descriptor: int) -> None:
            if path_of(descriptor) == str(path):
                raise OSError(5, "Input/output error")
            sync(descriptor)

        return failing

    watch_syncs(monkeypatch, watch)
