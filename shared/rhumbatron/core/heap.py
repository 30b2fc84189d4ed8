"""A warm process's startup heap, kept out of the garbage collector's way.

A warm container keeps what its cold start built for as long as it lives: the imported
modules, pydantic's schemas, botocore's service models, the runtime and its open files — about
72,000 objects in a router-nudge container. CPython's collector traverses every one of them at
each full collection, and the router's hot path makes full collections frequent: each decoded
Event lives on in the process's decode cache for a while (``router.records.DecodedEvents``),
so it outlives the young generations and piles up in the oldest, which the collector then
traverses whole. One such collection measured 63 ms in a
projector run of 10,000 events that took about 950 ms (``docs/performance.md``, issue #16,
session 28).

:func:`freeze_startup_heap` collects once and moves every object the process holds to the
permanent generation (``gc.freeze``): later collections traverse only what was allocated
after it, and whatever of that becomes garbage is collected as before. The cold start's
objects are never freed, which is what a warm process wants of them anyway.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap", "thaw_heap"]


def freeze_startup_heap() -> int:
    """Collect what the start left as garbage, then freeze every object left (``gc.freeze``);
    returns how many objects the permanent generation holds. Call it once the process is warm
    (its first unit of work done); calling it again freezes what was built since."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> None:
    """Give the frozen objects back to the collector (``gc.unfreeze``), as a fresh process
    would have them: for tests that rebuild a process's runtime."""
    gc.unfreeze()
