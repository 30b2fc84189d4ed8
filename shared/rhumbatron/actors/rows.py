"""Rows of an actor's tables as the domain's state dataclasses.

A state dataclass names its fields like the columns of its table, so one mapper builds any of
them from a ``sqlite3.Row``; the few columns stored in another form (JSON, a Unix timestamp,
an enum's value) say how to convert them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import fields
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["json_tuple", "row_to", "utc_timestamp"]

_State = TypeVar("_State", bound="DataclassInstance")


def row_to(cls: type[_State], row: sqlite3.Row, **convert: Callable[[Any], object]) -> _State:
    """``cls`` built from the columns of ``row`` named like its fields, each through its
    converter in ``convert`` when it has one. Columns that are no field (``updated_at``)
    are left out; a field with no column raises :class:`IndexError`."""
    return cls(
        **{
            name: convert[name](row[name]) if name in convert else row[name]
            for name in _field_names(cls)
        }
    )


@cache
def _field_names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    # Cached: every read of a row would otherwise walk the dataclass's fields again.
    return tuple(f.name for f in fields(cls))


def json_tuple(value: str) -> tuple[Any, ...]:
    """A JSON array column as a tuple (the state dataclasses are frozen)."""
    return tuple(json.loads(value))


def utc_timestamp(value: float) -> datetime:
    """A Unix-seconds column as an aware UTC datetime."""
    return datetime.fromtimestamp(value, UTC)
