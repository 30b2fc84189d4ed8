"""What a message or a log line may quote: the one rule, shared by every edge.

* :func:`describe_input` — how an error message may quote a value it refuses: never a
  secret's (a field whose name says it holds one), never a whole object or list (a
  model-level error's input is the request itself, secrets and all); a scalar of an
  ordinary field, shortened.
* :func:`redact_url` — a URL without user info, query or fragment, which may hold
  credentials (``https://user:pass@host/hook?token=...``).
* :func:`install_log_redaction` — a filter on the ``httpx`` logger, which logs every request
  with its full URL at INFO: the webhook URLs of agents and subscriptions are chosen by
  tenants and may carry credentials. Installed once, when :mod:`rhumbatron` is imported.

This module imports the standard library only: the API's errors, the envelopes and the
settings all use it, and ``import rhumbatron`` installs its filter on every cold start.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "SECRET_NAME",
    "describe_input",
    "install_log_redaction",
    "is_secret_location",
    "redact_url",
]

#: A field holds a secret when a part of its location matches this (case-insensitive):
#: ``secrets``, ``secret``, ``apiToken``, ``password``, ``Authorization``, ``api_key``,
#: ``privateKey``, ``credentials``. A bare ``key`` is not enough: selectors and filters name
#: ordinary fields ``...Key``.
SECRET_NAME: Final = re.compile(
    r"secret|token|passw(or)?d|authori[sz]ation|credential|api[_-]?key|private[_-]?key",
    re.IGNORECASE,
)

#: Values that hold other values: the input of an error about a whole object or list.
_WHOLES = (Mapping, list, tuple, set, frozenset)


def is_secret_location(loc: Sequence[object]) -> bool:
    """Whether a part of ``loc`` (a pydantic error's location) names a secret."""
    return any(isinstance(part, str) and SECRET_NAME.search(part) for part in loc)


def describe_input(loc: Sequence[object], value: object, *, limit: int = 80) -> str | None:
    """``value`` as an error message about ``loc`` may quote it, shortened to ``limit``
    characters; None when it may not be quoted at all: a secret's value, or an object or a
    list (the input of an error about a whole model is that model's input, every field
    of it)."""
    if is_secret_location(loc) or isinstance(value, _WHOLES) or hasattr(value, "model_dump"):
        return None
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def redact_url(url: str) -> str:
    """``url`` without user info, query or fragment; anything that does not parse as a URL
    with a host is returned unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    query = "..." if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


class _RedactUrls(logging.Filter):
    """Rewrites the URL arguments of a record (httpx passes an ``httpx.URL``) as
    :func:`redact_url` shows them; the record is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(arg) for arg in record.args)
        elif isinstance(record.msg, str) and "://" in record.msg and not record.args:
            record.msg = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), record.msg)
        return True


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def _redacted(arg: object) -> object:
    # httpx.URL is matched by name: importing httpx here would put it on every cold start.
    if type(arg).__name__ == "URL" or (isinstance(arg, str) and "://" in arg):
        return redact_url(str(arg))
    return arg


#: The loggers that log request URLs: httpx's request line (INFO).
_URL_LOGGERS: Final = ("httpx",)
_FILTER: Final = _RedactUrls()


def install_log_redaction() -> None:
    """Add the URL filter to the loggers of :data:`_URL_LOGGERS`, once (idempotent)."""
    for name in _URL_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
