"""Reactions: what reacts to the facts on the log (spec "Event plumbing", second document).

This first piece is the vocabulary every reaction shares:

* :mod:`~rhumbatron.reactions.kinds`: the kind grammar, a read-only view over ``EVENT_TYPES``
  giving each kind its subject, what it is about, whether it can trigger reactions, and its
  payload model (``rhumbatron kinds`` lists it);
* :mod:`~rhumbatron.reactions.selectors`: the :class:`Selector` (kind patterns plus a filter)
  and :func:`event_selector_matches`, the one matcher that subscriptions and agent triggers
  both use.
"""

from __future__ import annotations

from rhumbatron.errors import SelectorError
from rhumbatron.reactions.kinds import (
    KIND_GRAMMAR,
    NOT_TRIGGERABLE,
    REACTION_FAMILY,
    TRIGGERABLE_EVENT_KINDS,
    Kind,
    KindGrammar,
    SubjectType,
    list_kinds,
)
from rhumbatron.reactions.selectors import Selector, event_selector_matches

__all__ = [
    "KIND_GRAMMAR",
    "NOT_TRIGGERABLE",
    "REACTION_FAMILY",
    "TRIGGERABLE_EVENT_KINDS",
    "Kind",
    "KindGrammar",
    "Selector",
    "SelectorError",
    "SubjectType",
    "event_selector_matches",
    "list_kinds",
]
