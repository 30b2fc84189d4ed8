"""The result of a domain transition: a patch to persist and the facts it produced."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from rhumbatron.errors import DomainError
from rhumbatron.protocol.envelopes import Event

__all__ = [
    "Delete",
    "Insert",
    "Mutation",
    "Transition",
    "Update",
    "Upsert",
    "combine",
    "parse_state",
]


@dataclass(frozen=True, slots=True)
class Insert:
    """Insert a row; with ``ignore_existing`` a row with the same key is left as it is."""

    table: str
    row: Mapping[str, Any]
    ignore_existing: bool = False


@dataclass(frozen=True, slots=True)
class Upsert:
    """Insert a row, or update the listed columns of the row with the same ``key`` columns."""

    table: str
    row: Mapping[str, Any]
    key: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Update:
    """Set ``values`` on the row whose ``key`` columns match; the row must exist."""

    table: str
    key: Mapping[str, Any]
    values: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the rows matching every column of ``where``."""

    table: str
    where: Mapping[str, Any]


Mutation = Insert | Upsert | Update | Delete


@dataclass(frozen=True, slots=True)
class Transition:
    """``(patch, facts)``: what to write and what happened, written in one transaction."""

    patch: tuple[Mutation, ...] = ()
    facts: tuple[Event, ...] = field(default=())


def combine(*transitions: Transition) -> Transition:
    """Several transitions of one aggregate's transaction, in order, as one."""
    return Transition(
        patch=tuple(m for t in transitions for m in t.patch),
        facts=tuple(f for t in transitions for f in t.facts),
    )


_State = TypeVar("_State", bound=StrEnum)


def parse_state(kind: type[_State], value: object) -> _State:
    """``value`` as a state of ``kind``, or a :class:`DomainError` naming the states."""
    try:
        return kind(str(value))
    except ValueError:
        states = ", ".join(member.value for member in kind)
        raise DomainError(f"{value!r} is not a {kind.__name__}; use one of {states}") from None
