"""Resource overlap: does a resource Event touch what an active Agent works on?

Resources are paths (``src/app.py``, ``src/``) or keys with a scheme (``file:src/app.py``).
Two resources overlap **exactly** when they name the same thing, and **by prefix only** when
one contains the other at a path-segment boundary (``src/`` and ``src/app.py``, ``src/auth``
and ``src/auth/login.py``, but not ``src/app`` and ``src/application.py``). Deterministic rules
act on an exact overlap; only a prefix-only overlap is a question for Clef-flash.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

__all__ = ["Overlap", "classify_overlap", "normalise_resource"]


class Overlap(StrEnum):
    EXACT = "exact"
    PREFIX = "prefix"
    NONE = "none"


def normalise_resource(resource: str) -> tuple[str, ...]:
    """The resource as path segments: the scheme (``file:``) and empty segments dropped, so
    ``file:src//app.py``, ``./src/app.py`` and ``src/app.py`` are the same resource."""
    _, colon, rest = resource.partition(":")
    path = rest if colon and "/" not in _ else resource
    return tuple(part for part in path.split("/") if part not in ("", "."))


def _pair(a: tuple[str, ...], b: tuple[str, ...]) -> Overlap:
    if not a or not b:
        return Overlap.NONE
    if a == b:
        return Overlap.EXACT
    shorter, longer = (a, b) if len(a) < len(b) else (b, a)
    return Overlap.PREFIX if longer[: len(shorter)] == shorter else Overlap.NONE


def classify_overlap(resource: str, agent_resources: Iterable[str]) -> Overlap:
    """The strongest overlap between ``resource`` and any of ``agent_resources``."""
    target = normalise_resource(resource)
    best = Overlap.NONE
    for other in agent_resources:
        found = _pair(target, normalise_resource(other))
        if found is Overlap.EXACT:
            return found
        if found is Overlap.PREFIX:
            best = found
    return best
