"""The safe value types of the wire: identifiers that may become a path or a key, and
integers that fit the stores they reach.

Every identifier that names a file, a directory, a SQLite key, a NATS message ID or the
material of a stable Event ID is one of the types below, and the payload models use them
themselves, so every entry path gets the same check: an API route, ``POST /commands`` and a
message read off a queue (issue #21, ../shared/RELIABILITY.md B9).

One alphabet serves them all: a letter or digit first, then letters, digits and ``_ . : -``.
So an identifier is always one path component (no ``/``, no ``\\``, never ``.`` or ``..``),
one line (no control character: no header or log injection), and never holds the unit
separator of :func:`~rhumbatron.protocol.ids.stable_event_id` (two different keys cannot
hash to one Event ID). Narrower kinds take a subset of it:

==============  ==============================================  ========================
type            alphabet                                        used for
==============  ==============================================  ========================
``Identifier``  ``[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}``            Change, Task, Candidate,
                                                                release, artifact, claim,
                                                                intent, challenge IDs
``AgentId``     ``[A-Za-z0-9][A-Za-z0-9._-]{0,99}``              agents
``NameId``      ``[A-Za-z0-9][A-Za-z0-9_-]{0,63}``               projects and apps (they
                                                                name directories and NATS
                                                                headers)
==============  ==============================================  ========================

Integers: SQLite stores a signed 64-bit integer; a larger one raises ``OverflowError`` in
the driver, far from the edge that let it in (a dead-letter consumer once gave up on an
``attempt`` of 2**63 and recorded no letter). :data:`Generation` and :data:`Attempt` are
bounded where they are parsed instead, by :data:`MAX_WIRE_INTEGER`.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field

__all__ = [
    "AGENT_ID",
    "IDENTIFIER",
    "MAX_ATTEMPT",
    "MAX_WIRE_INTEGER",
    "NAME_ID",
    "AgentId",
    "Attempt",
    "Generation",
    "Identifier",
    "NameId",
    "PromotedGeneration",
]

#: Change, Task, Candidate, release, claim, intent, challenge and changeset IDs, and the keys
#: clients choose (``clientRequestId``): one path component and one line, at most 128.
IDENTIFIER: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
#: Agent IDs: the identifier alphabet without ``:``, at most 100.
AGENT_ID: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
#: Project IDs and app names: letters, digits, ``_`` and ``-``, at most 64 (they name
#: directories and travel in NATS headers).
NAME_ID: Final = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"

#: The largest integer of the wire: every JSON reader holds it exactly (JavaScript's
#: ``Number.MAX_SAFE_INTEGER``; nats.js reads our streams), and it is far below SQLite's
#: signed 64-bit limit, so ``n + 1`` never overflows a column.
MAX_WIRE_INTEGER: Final = 2**53 - 1
#: A command's attempt. Retries count it up, and a sweep's re-sends use their round (a
#: minute count) as the attempt, so the bound is the wire's, not a small number.
MAX_ATTEMPT: Final = MAX_WIRE_INTEGER

Identifier = Annotated[str, Field(pattern=IDENTIFIER)]
AgentId = Annotated[str, Field(pattern=AGENT_ID)]
NameId = Annotated[str, Field(pattern=NAME_ID)]
#: A canonical generation, or a count like it, as stored in SQLite.
Generation = Annotated[int, Field(ge=0, le=MAX_WIRE_INTEGER)]
#: A promoted generation: 1 and up (0 is the empty canonical of a new project).
PromotedGeneration = Annotated[int, Field(ge=1, le=MAX_WIRE_INTEGER)]
Attempt = Annotated[int, Field(ge=1, le=MAX_ATTEMPT)]
