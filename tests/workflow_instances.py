"""Workflow instances as the operator's tests find them: one left running, as a process that
died inside a step leaves it (the API's and the MCP server's workflow tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings
from rhumbatron.workflows.in_process import InProcessEngine, WorkflowDefinition


class CutShort(BaseException):
    """Stands for the process dying inside a step: not an Exception, so no step failure,
    and the instance stays running."""


def left_running(settings: Settings, clock: Clock, candidate: str) -> None:
    """A verification of ``candidate`` left running in the state directory's workflow
    store, as a process that died inside its ``check`` step leaves it (the runtime's engine
    has the real steps; this one only has to stop in the first)."""

    async def dies(input: Mapping[str, Any], state: dict[str, Any]) -> None:
        raise CutShort

    engine = InProcessEngine(
        settings.state_dir / "workflows.sqlite",
        settings,
        clock,
        {"verification": WorkflowDefinition("verification", (("check", dies),))},
    )
    with pytest.raises(CutShort):
        asyncio.run(engine.start("verification", candidate, {"candidateId": candidate}))
    engine.close()
