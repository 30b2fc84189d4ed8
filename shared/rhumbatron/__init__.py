"""Rhumbatron: event-and-command plumbing.

Facts (Events) leave an actor's SQLite transaction through a transactional outbox and reach
eight NATS JetStream streams; requests for work (Commands) travel on one work-queue stream.
All logic lives in this package; the Lambda handlers in ``functions/`` only wire it.

The names in ``__all__`` are the public API: :func:`bootstrap` builds the runtime
(:class:`Rhumbatron`) from :class:`Settings` (:func:`load_settings` reads them from the
environment); :class:`Event` and :class:`Command` are the two envelopes; :class:`RhumbatronError`
is the base of every error raised on purpose, and each of its families is here too (the whole
tree is in :mod:`rhumbatron.errors`). They are imported on first use (PEP 562): a Lambda
handler imports this package at its cold start, and must not pay for the runtime, the message
registry or pydantic-settings until it uses them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rhumbatron.redaction import install_log_redaction as _install_log_redaction

__version__ = "0.1.0"

if TYPE_CHECKING:
    from rhumbatron.core.settings import Settings, load_settings
    from rhumbatron.errors import (
        ActorError,
        AgentRegistryError,
        ApiError,
        AppProvisioningError,
        ArchiveError,
        ChangeNotFoundError,
        ConfigurationError,
        CursorNotFoundError,
        DeadLetterError,
        DomainError,
        EnvelopeError,
        EventNotFoundError,
        LocalStackError,
        MessagingError,
        ProjectNotFoundError,
        RegistryError,
        ReplayError,
        RhumbatronError,
        SelectorError,
        TaskNotFoundError,
        UnsafePathError,
        WebhookSignatureError,
        WorkflowEngineError,
        WorkflowNotFoundError,
    )
    from rhumbatron.protocol.envelopes import Command, Event
    from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

__all__ = [
    "ActorError",
    "AgentRegistryError",
    "ApiError",
    "AppProvisioningError",
    "ArchiveError",
    "ChangeNotFoundError",
    "Command",
    "ConfigurationError",
    "CursorNotFoundError",
    "DeadLetterError",
    "DomainError",
    "EnvelopeError",
    "Event",
    "EventNotFoundError",
    "LocalStackError",
    "MessagingError",
    "ProjectNotFoundError",
    "RegistryError",
    "ReplayError",
    "Rhumbatron",
    "RhumbatronError",
    "SelectorError",
    "Settings",
    "TaskNotFoundError",
    "UnsafePathError",
    "WebhookSignatureError",
    "WorkflowEngineError",
    "WorkflowNotFoundError",
    "__version__",
    "bootstrap",
    "load_settings",
]

# Where each lazily imported name of ``__all__`` is defined (the TYPE_CHECKING imports above
# say the same to type checkers; tests/unit/test_public_api.py keeps the two lists equal).
_LAZY: dict[str, str] = {
    "bootstrap": "rhumbatron.runtime.bootstrap",
    "Rhumbatron": "rhumbatron.runtime.bootstrap",
    "Settings": "rhumbatron.core.settings",
    "load_settings": "rhumbatron.core.settings",
    "Event": "rhumbatron.protocol.envelopes",
    "Command": "rhumbatron.protocol.envelopes",
    **{
        name: "rhumbatron.errors"
        for name in (
            "RhumbatronError",
            "ConfigurationError",
            "EnvelopeError",
            "UnsafePathError",
            "SelectorError",
            "DomainError",
            "RegistryError",
            "AgentRegistryError",
            "ProjectNotFoundError",
            "CursorNotFoundError",
            "ActorError",
            "MessagingError",
            "WebhookSignatureError",
            "ArchiveError",
            "ReplayError",
            "DeadLetterError",
            "AppProvisioningError",
            "WorkflowEngineError",
            "WorkflowNotFoundError",
            "LocalStackError",
            "ChangeNotFoundError",
            "TaskNotFoundError",
            "EventNotFoundError",
            "ApiError",
        )
    },
}


def __getattr__(name: str) -> Any:
    """Import a name of ``__all__`` from its module on first use, then keep it here."""
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# httpx logs every request line with its full URL at INFO, and webhook URLs are chosen by
# tenants (user info and query may hold credentials): every process that imports the package
# logs them redacted. Standard library only, so no cold-start cost to speak of.
_install_log_redaction()
