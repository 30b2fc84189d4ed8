"""How a selector filter compares values: one rule for validation and for matching."""

from __future__ import annotations

__all__ = ["same_value"]


def same_value(actual: object, expected: object) -> bool:
    """Equal, and a bool never equals an int (``True == 1`` in Python, not in a filter)."""
    return isinstance(actual, bool) == isinstance(expected, bool) and actual == expected
