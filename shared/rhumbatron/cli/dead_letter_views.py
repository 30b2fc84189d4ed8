"""How ``rhumbatron dead-letters`` shows letters: a table, one letter in full, the line a
Retry answers with, and the HTTP API's JSON forms (``--json``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rhumbatron.operator import Inspection, RetryOutcome
    from rhumbatron.product.dead_letters import DeadLetter

__all__ = ["print_inspection", "print_table", "retry_line", "wire", "wire_detail"]


def retry_line(outcome: RetryOutcome) -> str:
    letter = outcome.letter
    if outcome.queue == "reactions":
        if not outcome.sent:
            return (
                f"dead letter {letter.dead_letter_id}: webhook delivery {outcome.message_id} "
                f"was already retried as attempt {outcome.already_retried_as}; nothing changed"
            )
        return (
            f"dead letter {letter.dead_letter_id}: webhook delivery {outcome.message_id} is due "
            "again; the next sweep tick sends it with the same webhook-id (the letter closes "
            "when it is delivered, and opens again if it fails)"
        )
    what = f"{letter.command_type} {letter.command_id}"
    if outcome.sent:
        return (
            f"dead letter {letter.dead_letter_id}: sent {what} again as attempt "
            f"{outcome.attempt} on {outcome.queue} (message {outcome.message_id}); the letter "
            "closes as succeeded when it succeeds, and opens again if it fails again"
        )
    if outcome.duplicate:
        return (
            f"dead letter {letter.dead_letter_id}: attempt {outcome.attempt} of {what} had "
            f"already reached {outcome.queue} (message {outcome.message_id}); nothing new sent"
        )
    return (
        f"dead letter {letter.dead_letter_id}: already retried as attempt "
        f"{outcome.already_retried_as} on {outcome.queue}; nothing sent (a Retry sends once)"
    )


def wire(letter: DeadLetter) -> dict[str, Any]:
    """A letter as the HTTP API shows it in a list."""
    from rhumbatron.api.schemas import DeadLetterSummary

    return DeadLetterSummary.of(letter).model_dump(mode="json", by_alias=True)


def wire_detail(inspection: Inspection) -> dict[str, Any]:
    """A letter as the HTTP API shows it on its own, with its body."""
    from rhumbatron.api.schemas import DeadLetterDetail

    return DeadLetterDetail.of_inspection(inspection).model_dump(mode="json", by_alias=True)


def _at(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one_line(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def print_table(letters: Sequence[DeadLetter], status: str) -> None:
    if not letters:
        print(f"no dead letters (status {status})")
        return
    rows = [
        (
            letter.dead_letter_id,
            letter.status.value,
            letter.resolution or "-",
            letter.kind.value,
            letter.queue or letter.consumer or "-",
            letter.command_type or letter.event_id or "-",
            str(letter.attempt) if letter.attempt is not None else "-",
            _at(letter.created_at_s),
            _one_line(letter.reason, 60),
        )
        for letter in letters
    ]
    header = ("ID", "STATUS", "RESOLUTION", "KIND", "QUEUE", "TYPE", "ATTEMPT", "CREATED", "REASON")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    for row in (header, *rows):
        print("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]))
    print(f"{len(letters)} dead letter(s) (status {status})")


def print_inspection(inspection: Inspection) -> None:
    from rhumbatron.product.dead_letters import DeadLetterStatus

    letter = inspection.letter
    for label, value in _fields(letter):
        print(f"{label + ':':<12}{value}")
    if inspection.body_problem:
        print(f"{'body:':<12}not a valid Command: {inspection.body_problem}")
    print("command:" if inspection.command is not None else "body:")
    if inspection.command is not None:
        print(json.dumps(inspection.command.to_wire(), indent=2))
    elif inspection.body_json is not None:
        print(json.dumps(inspection.body_json, indent=2))
    else:
        print(letter.body)
    if letter.status is DeadLetterStatus.OPEN:
        print("next: " + " | ".join(_next_commands(inspection)))


def _fields(letter: DeadLetter) -> list[tuple[str, str]]:
    """The letter's fields as ``rhumbatron dead-letters show`` lists them, label and value."""
    from rhumbatron.product.dead_letters import DeadLetterKind

    retried = (
        f", retried as attempt {letter.retried_attempt} at {_at(letter.retried_at_s)}"
        if letter.retried_attempt is not None
        else ""
    )
    fields = [
        ("id", letter.dead_letter_id),
        ("kind", letter.kind.value),
        ("status", letter.status.value),
        ("resolution", letter.resolution or "-"),
        ("tenant", letter.tenant_id or "-"),
        ("project", letter.project_id or "-"),
        ("change", letter.change_id or "-"),
        ("task", letter.task_id or "-"),
    ]
    if letter.kind is DeadLetterKind.COMMAND:
        fields += [
            ("command", f"{letter.command_type} {letter.command_id}"),
            ("queue", letter.queue or "-"),
            ("attempt", f"{letter.attempt}{retried}"),
        ]
    else:
        fields += [
            ("consumer", letter.consumer or "-"),
            ("event", letter.event_id or "-"),
            ("stream", f"{letter.stream} seq {letter.stream_seq}"),
        ]
    return [
        *fields,
        ("created", _at(letter.created_at_s)),
        ("updated", _at(letter.updated_at_s)),
        ("closed", _at(letter.closed_at_s)),
        ("last error", letter.reason),
    ]


def _next_commands(inspection: Inspection) -> list[str]:
    """The commands an open letter can take next: retry (a valid Command) and dismiss."""
    from rhumbatron.product.dead_letters import DeadLetterKind

    letter = inspection.letter
    actions = ["dismiss"]
    if letter.kind is DeadLetterKind.COMMAND and inspection.command is not None:
        actions.insert(0, "retry")
    return [f"rhumbatron dead-letters {a} {letter.dead_letter_id}" for a in actions]
