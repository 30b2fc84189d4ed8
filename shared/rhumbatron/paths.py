"""Paths named from input, kept under the root they belong to.

Identifiers are checked where they are parsed (:mod:`rhumbatron.protocol.values`), so no
valid one can climb out of a directory. This is the second wall, at the file system itself:
every file or directory whose name comes from a request, a command or an event is built by
:func:`path_under`, which resolves the result (symlinks too) and refuses anything that does
not stay inside its root. A bug that lets a bad identifier through the models, or a symlink
planted in the state directory, then fails loudly instead of writing elsewhere
(../shared/RELIABILITY.md B9).
"""

from __future__ import annotations

from pathlib import Path

from rhumbatron.errors import UnsafePathError

__all__ = ["path_under"]

_UNSAFE_IN_A_NAME = frozenset("/\\\x00")


def path_under(root: Path, *parts: str) -> Path:
    """``root / part / …``, once it is certain to stay under ``root``.

    Each part must be one plain name: not empty, not ``.`` or ``..``, without ``/``, ``\\``
    or NUL. The joined path, resolved with its symlinks, must be inside ``root``. Raises
    :class:`~rhumbatron.errors.UnsafePathError` naming the part and the root otherwise.
    Nothing is created: callers make directories only after the check.
    """
    for part in parts:
        if part in ("", ".", "..") or not _UNSAFE_IN_A_NAME.isdisjoint(part):
            raise UnsafePathError(
                f"the name {part[:120]!r} cannot be used under {root}: a name is one path "
                "component, not '.' or '..', without '/', '\\' or NUL; use an ID of letters, "
                "digits, '_', '.', ':' and '-'"
            )
    candidate = root.joinpath(*parts)
    base = root.resolve()
    resolved = candidate.resolve()
    if not resolved.is_relative_to(base):
        raise UnsafePathError(
            f"{candidate} resolves to {resolved}, outside {base}; a symlink under the state "
            "directory points out of it: remove it"
        )
    return candidate
