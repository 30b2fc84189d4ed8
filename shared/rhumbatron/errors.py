"""Every error Rhumbatron raises on purpose, in one hierarchy.

::

    RhumbatronError
     ├── ConfigurationError          a setting is wrong or two settings contradict each other
     │    └── UnsafeStorageError     WAL on a network filesystem, a non-durable JetStream, ...
     ├── EnvelopeError               an Event or Command failed validation at the edge
     │    └── UnknownTypeError       the type is not in EVENT_TYPES / COMMAND_TYPES
     ├── UnsafePathError             a name from input would lead outside the state root
     ├── DomainError                 a transition is not legal from the current state
     ├── RegistryError               a subscription or schedule that cannot be stored as asked
     ├── ActorError                  an actor file could not be opened or written
     │    ├── ActorBusyError         another writer held the file past the busy timeout
     │    └── OutboxError            an Event could not be written to the outbox
     ├── MessagingError              JetStream answered with something we cannot use
     │    ├── NatsUnavailableError   no NATS server reachable (no attempt is counted)
     │    └── StreamConfigError      a stream exists with settings we cannot update to
     ├── ArchiveError               an archive batch, key or object line is wrong, or S3 is down
     ├── DeadLetterError             an operator action on a dead letter cannot be done
     │    ├── DeadLetterNotFoundError  no such dead letter (404)
     │    └── DeadLetterClosedError    the letter is already closed (409)
     └── LocalStackError            the embedded nats-server or S3 server failed to start

Every message says what was wrong, with the offending value, and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "ActorBusyError",
    "ActorError",
    "ArchiveError",
    "ConfigurationError",
    "DeadLetterClosedError",
    "DeadLetterError",
    "DeadLetterNotFoundError",
    "DomainError",
    "EnvelopeError",
    "LocalStackError",
    "MessagingError",
    "NatsUnavailableError",
    "OutboxError",
    "RegistryError",
    "RhumbatronError",
    "StreamConfigError",
    "UnknownTypeError",
    "UnsafePathError",
    "UnsafeStorageError",
]


class RhumbatronError(Exception):
    """Base of every error Rhumbatron raises on purpose."""


class ConfigurationError(RhumbatronError):
    """A setting has a value that cannot work; the message names the setting."""


class UnsafeStorageError(ConfigurationError):
    """The storage settings would lose or corrupt data (RELIABILITY F1, F21)."""


class EnvelopeError(RhumbatronError, ValueError):
    """An Event or Command envelope failed validation; the message names field and value."""


class UnknownTypeError(EnvelopeError):
    """An Event or Command type outside the closed registry."""


class UnsafePathError(RhumbatronError, ValueError):
    """A file or directory named from input would resolve outside the root it belongs under
    (``../``, an absolute part, a symlink out); nothing was created. The message names the
    part and the root."""


class DomainError(RhumbatronError):
    """A state transition that is not legal from the current state."""


class RegistryError(RhumbatronError, ValueError):
    """A registry record (a subscription, a schedule) that cannot be created or changed; the
    message names the value. ``field`` names the record field at fault, when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ActorError(RhumbatronError):
    """An actor's SQLite file could not be opened, locked or written."""


class ActorBusyError(ActorError):
    """Another writer held the actor file for longer than the busy timeout (F19)."""


class OutboxError(ActorError):
    """An Event could not be written to an outbox (too large, or not serialisable)."""


class MessagingError(RhumbatronError):
    """JetStream answered with an error we cannot use as it is."""


class NatsUnavailableError(MessagingError):
    """No NATS server could be reached; publishing did not start, so no attempt counts."""


class StreamConfigError(MessagingError):
    """A stream exists with settings that JetStream cannot update to the wanted ones."""


class ArchiveError(RhumbatronError):
    """The S3 event archive refused a batch, a key or an object line; the message names it."""


class DeadLetterError(RhumbatronError):
    """An operator action on a dead letter cannot be done; the message says why."""


class DeadLetterNotFoundError(DeadLetterError, LookupError):
    """No dead letter with that ID (for this tenant)."""


class DeadLetterClosedError(DeadLetterError):
    """The dead letter is already closed; it cannot be retried or dismissed again."""


class LocalStackError(RhumbatronError):
    """The embedded nats-server or the local S3 server did not start or answer."""
