"""``os.fsync`` watched by a test (``monkeypatch``): the paths the code makes durable, and a
disk that fails the fsync of one file. Every other fsync still runs for real.

The package calls ``os.fsync`` through the module (``storage.fsync_directory``,
``StreamViews.sync``), so patching ``os.fsync`` reaches every one of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["fail_fsyncs_of", "path_of", "record_fsyncs"]


def path_of(descriptor: int) -> str:
    """The path an open file descriptor of this process names (Linux's ``/proc``)."""
    return os.readlink(f"/proc/self/fd/{descriptor}")


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every fsync from now on, in order (the real fsync still runs)."""
    synced: list[str] = []
    fsync = os.fsync

    def recorded(descriptor: int) -> None:
        synced.append(path_of(descriptor))
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recorded)
    return synced


def fail_fsyncs_of(monkeypatch: pytest.MonkeyPatch, path: str | Path) -> None:
    """From now on an fsync of ``path`` fails as a disk's I/O error does (EIO)."""
    fsync = os.fsync

    def failing(descriptor: int) -> None:
        if path_of(descriptor) == str(path):
            raise OSError(5, "Input/output error")
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", failing)
