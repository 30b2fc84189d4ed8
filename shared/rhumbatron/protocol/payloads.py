"""The base of every payload model: frozen, strict about unknown fields, camelCase on the wire."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

__all__ = ["WIRE_MODEL_CONFIG", "Payload"]

#: Shared by envelopes and payloads: immutable, no unknown fields, camelCase JSON, and
#: snake_case accepted too so Python callers can use field names.
WIRE_MODEL_CONFIG = ConfigDict(
    frozen=True,
    extra="forbid",
    alias_generator=to_camel,
    populate_by_name=True,
    str_strip_whitespace=False,
)


class Payload(BaseModel):
    """The payload of one Event or Command type. Add fields compatibly: new ones optional."""

    model_config = WIRE_MODEL_CONFIG
