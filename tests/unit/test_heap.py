"""A warm process's startup heap, frozen out of the collector's way (``core.heap``), and the
Lambda runtime that freezes it at a container's first warm invocation (``runtime.process``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from rhumbatron.core.heap import freeze_startup_heap, thaw_heap
from rhumbatron.runtime import process


class _Node:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Each test starts and ends with nothing frozen, as the rest of the suite expects."""
    thaw_heap()
    yield
    thaw_heap()


def test_the_garbage_of_the_start_is_collected_before_the_heap_is_frozen() -> None:
    # GIVEN a cycle nobody holds any more, left by the start
    node = _Node()
    gone = weakref.ref(node)
    del node
    # WHEN the heap is frozen
    frozen = freeze_startup_heap()
    # THEN the cycle was collected first, not kept for good, and the rest is frozen
    assert gone() is None
    assert frozen == gc.get_freeze_count() > 0


def test_what_the_start_built_is_out_of_the_collectors_reach_until_thawed() -> None:
    # GIVEN a cycle still held when the heap is frozen
    node = _Node()
    kept = weakref.ref(node)
    freeze_startup_heap()
    # WHEN it is let go and the collector runs
    del node
    gc.collect()
    # THEN the collector did not traverse it: it is still there
    assert kept() is not None
    # AND once thawed, as in a fresh process, it is collected as any garbage
    thaw_heap()
    gc.collect()
    assert kept() is None


def test_a_container_freezes_its_cold_starts_heap_at_its_first_warm_invocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a fresh container's environment
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "state"))
    process.reset_for_tests()
    try:
        # WHEN the cold start's invocation asks for the runtime
        app = process.process_runtime()
        # THEN nothing is frozen yet: that invocation still imports and opens what it needs
        assert gc.get_freeze_count() == 0
        # WHEN the next (warm) invocation asks for it
        assert process.process_runtime() is app
        # THEN the heap the cold start left is frozen, once
        frozen = gc.get_freeze_count()
        assert frozen > 0
        process.process_runtime()
        assert gc.get_freeze_count() == frozen
    finally:
        # AND a fresh container (the tests' reset) starts with nothing frozen
        process.reset_for_tests()
    assert gc.get_freeze_count() == 0
