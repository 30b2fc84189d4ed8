"""The workflow-step role: everything ``functions/workflow_step/app.py`` runs.

In the cloud the verification and release workflows are Step Functions state machines
(``statemachines/*.asl.json``); each of their Task states invokes this function with one
step to run:

``{"workflow": "verification", "step": "check", "input": {...}, "state": {...}}``
(:class:`RunStep`) — ``input`` is the execution's input (the starting command's
``workflow_input``: ``projectId``, ``changeId`` and the payload), ``state`` what the earlier
steps returned. The step is the same coroutine the in-process engine runs locally
(:meth:`~rhumbatron.lifecycle.workflows.LifecycleWorkflows.definitions`), and the answer is
``{"state": <state merged with what the step returned>}``, which the state machine hands to
the next step.

A step that raises fails the invocation; the state machine retries it (30 s, 3 attempts,
backoff 2), then fails the execution. Every step is idempotent, so a retry after a step that
did its work but timed out changes nothing twice. Steps touch only the actor files and the
forks on EFS: this role opens no NATS connection (the outbox publisher's schedule publishes
the facts a step wrote).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from rhumbatron.core import event_loop
from rhumbatron.entrypoints._lambda import (
    InvocationContext,
    flush_metrics,
    validate_event,
)
from rhumbatron.errors import EnvelopeError

if TYPE_CHECKING:
    from rhumbatron.entrypoints.ports import RuntimeProvider, WorkflowStepRuntime
    from rhumbatron.workflows.in_process import StepFunction, WorkflowDefinition

__all__ = [
    "InvocationContext",
    "RunStep",
    "handle",
    "parse_invocation",
]

_ROLE = "workflow step"
_SHAPES = (
    'expected {"workflow": "verification" | "release", "step": "<step>", "input": {...}, '
    '"state": {...}} (a Task state of the workflow\'s state machine)'
)


class RunStep(BaseModel):
    """Run one step of a workflow: ``{"workflow", "step", "input", "state"}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow: str = Field(min_length=1)
    step: str = Field(min_length=1)
    input: dict[str, Any]
    state: dict[str, Any] = Field(default_factory=dict)


def parse_invocation(event: object) -> RunStep:
    """Validate the Lambda event's shape; raise :class:`EnvelopeError` naming the bad field.

    Whether the workflow and the step exist is checked by :func:`handle`, against the
    definitions the runtime holds.
    """
    return validate_event(RunStep, event, role=_ROLE, shapes=_SHAPES)


def handle(
    event: object,
    context: InvocationContext | None,
    *,
    runtime: RuntimeProvider[WorkflowStepRuntime],
) -> dict[str, Any]:
    """Run the event's step; return ``{"state": merged}``.

    Raises :class:`EnvelopeError` for a bad event, an unknown workflow or an unknown step
    (naming the ones there are), and whatever the step raises (the state machine retries).
    """
    invocation = parse_invocation(event)
    app = runtime()
    step = _step(app.lifecycle().workflows.definitions(), invocation)
    try:
        return event_loop.run(_run(step, invocation))
    finally:
        flush_metrics(app)


async def _run(step: StepFunction, invocation: RunStep) -> dict[str, Any]:
    from rhumbatron.workflows.engine import step_span

    # A fresh copy for the step, as the in-process engine gives it: only what the step
    # returns is merged into the state.
    with step_span(invocation.workflow, invocation.step, invocation.input):
        result = await step(invocation.input, json.loads(json.dumps(invocation.state)))
    return {"state": {**invocation.state, **dict(result or {})}}


def _step(definitions: Mapping[str, WorkflowDefinition], invocation: RunStep) -> StepFunction:
    definition = definitions.get(invocation.workflow)
    if definition is None:
        raise EnvelopeError(
            f"invalid {_ROLE} event: field 'workflow'={invocation.workflow!r}: unknown "
            f"workflow; workflows are {', '.join(sorted(definitions))}"
        )
    steps: dict[str, StepFunction] = dict(definition.steps)
    step = steps.get(invocation.step)
    if step is None:
        raise EnvelopeError(
            f"invalid {_ROLE} event: field 'step'={invocation.step!r}: workflow "
            f"{invocation.workflow!r} has no such step; its steps are {', '.join(steps)}"
        )
    return step
