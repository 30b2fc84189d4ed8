"""Progress on long work (replay, views rebuild, reconcile): a rich progress bar on stderr,
drawn from the operation's own :class:`~rhumbatron.core.progress.ProgressCallback`.

The bar is drawn only when stderr is a terminal and the command was not asked for
``--json``: a script reading the output, or a log file, never sees it. The views rebuild,
which printed a line per stream before it had a bar, still prints the operation's notes as
lines where stderr is no terminal (``notes_off_terminal``), so its log shows how far it got.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rhumbatron.core.progress import ProgressCallback

__all__ = ["progress_on_stderr"]


@contextlib.contextmanager
def progress_on_stderr(
    label: str, *, json_output: bool, notes_off_terminal: bool = False
) -> Iterator[ProgressCallback | None]:
    """A progress callback for the operation, labelled ``label``: a rich bar on a terminal;
    elsewhere nothing, or the operation's notes as lines with ``notes_off_terminal``; None
    (nothing at all) with ``--json``. The bar is removed when the block ends, so only the
    command's own output stays on the screen."""
    if json_output:
        yield None
        return
    if not sys.stderr.isatty():
        yield _note_lines if notes_off_terminal else None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def advance(done: int, total: int | None, note: str = "") -> None:
            bar.update(task, completed=done, total=total, description=note or label)

        yield advance


def _note_lines(done: int, total: int | None, note: str = "") -> None:
    if note:
        print(note, file=sys.stderr, flush=True)
