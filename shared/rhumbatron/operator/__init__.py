"""What an operator may do: list, inspect, retry and dismiss dead letters; send a command.

The operator API (:mod:`rhumbatron.api`) and the CLI both call these functions; neither
holds any logic of its own. Every function takes the caller's tenant: a letter (or a
project) of another tenant is "not found", exactly as one that does not exist, so an
operator cannot learn what other tenants have. The tenant ``"*"``
(:data:`~rhumbatron.core.settings.ANY_TENANT`) sees every tenant: a platform operator,
who also sees the letters that carry no tenant (a ``forks.sweep`` command has none).

Retry (spec: "Dead-letter path"; RELIABILITY F14)
    One product transaction checks the tenant and reserves the Retry as attempt
    ``attempt + 1`` (:func:`~rhumbatron.product.dead_letters.claim_retry`). Only the caller
    that won the reservation sends the command again, on ``agent-wakeups`` for
    ``agent.wake`` and ``integration`` for every other type, under the message ID
    ``<queue>:<commandId>:<attempt>``: a new ID, so the 2-hour duplicate window does not
    swallow it, and the same ID for every send of that attempt, so a repeat is dropped. A
    double click or a second operator finds the attempt reserved and sends nothing. If the
    send fails, the reservation is undone so the operator can click again. The letter
    stays open: the queue runtime closes it as ``succeeded`` when the command succeeds,
    and the dead-letter consumer updates and reopens it when it fails again.

    A process that dies between the reservation and the send would leave the attempt
    reserved and never sent. A later Retry that finds a reservation older than
    ``api_retry_resend_after_s`` (longer than any connect plus send) and still inside the
    duplicate window therefore sends it again under the same message ID: JetStream drops
    it if the first send did arrive (``duplicate``), so there is still one message.
"""

from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.operator.commands import send_command
from rhumbatron.operator.context import OperatorContext
from rhumbatron.operator.letters import (
    MAX_PAGE,
    DeadLetterPage,
    Inspection,
    dismiss_dead_letter,
    inspect_dead_letter,
    list_dead_letters,
)
from rhumbatron.operator.retry import RetryOutcome, retry_dead_letter

__all__ = [
    "ANY_TENANT",
    "MAX_PAGE",
    "DeadLetterPage",
    "Inspection",
    "OperatorContext",
    "RetryOutcome",
    "dismiss_dead_letter",
    "inspect_dead_letter",
    "list_dead_letters",
    "retry_dead_letter",
    "send_command",
]
