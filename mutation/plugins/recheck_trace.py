"""A pytest plugin for the mutation re-checks (``-p recheck_trace``): each test's node ID is
appended to the file ``RECHECK_TRACE`` names as the test starts.

A re-check stops at its first failure (``-x``), and a test that runs into the per-test limit
ends the interpreter at once (pytest-timeout's thread method) before any report is written,
so the last line is the test that failed or hung: its confirmation runs that test alone.
"""

from __future__ import annotations

import os

TRACE_VARIABLE = "RECHECK_TRACE"


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    """Append ``nodeid`` to the trace file, closed at once so a hard exit loses nothing."""
    path = os.environ.get(TRACE_VARIABLE)
    if path:
        with open(path, "a", encoding="utf-8") as trace:
            trace.write(nodeid + "\n")
