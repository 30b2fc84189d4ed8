"""Every error Rhumbatron raises on purpose, in one hierarchy.

::

    RhumbatronError
     ├── ConfigurationError         a setting is wrong or two settings contradict each other
     │    ├── UnsafeStorageError    WAL on a network filesystem, a non-durable JetStream, ...
     │    ├── RetentionMisfitError  the settings' windows do not fit together (also ValueError)
     │    ├── UnsafeWebhookUrlError  a webhook URL Rhumbatron must not call (also ValueError)
     │    └── WebhookSecretError    a webhook secret is not whsec_ + base64 (also ValueError)
     ├── EnvelopeError              an Event or Command failed validation at the edge
     │    └── UnknownTypeError      the type is not in EVENT_TYPES / COMMAND_TYPES
     ├── UnsafePathError            a name from input would lead outside the state root
     ├── SelectorError              a selector's pattern, key or value is wrong (also ValueError)
     ├── DomainError                a transition is not legal from the current state
     │    ├── NotHolderError          the reporting Agent does not hold the Task
     │    ├── PromotionConflictError  Canonical moved past the Candidate's base
     │    ├── ProjectIdUnavailableError  the project ID is another tenant's
     │    ├── ProjectExistsError    the project exists under another name
     │    ├── ProjectNotActiveError  the request needs an active project
     │    ├── ProjectActiveError    the request needs a project that is not active
     │    └── UnknownSubjectError   a command refers to what does not exist (also LookupError)
     ├── ChangeNotFoundError        no such Change in the project (also LookupError)
     ├── TaskNotFoundError          no such Task of the Change (also LookupError)
     ├── EventNotFoundError         no such event on the project's stream (also LookupError)
     ├── RegistryError              a subscription or schedule that cannot be stored as asked
     │    ├── SubscriptionRegistryError
     │    │    ├── SubscriptionConflictError  same name, other content
     │    │    ├── SubscriptionDisabledError  the action needs it enabled
     │    │    └── SubscriptionNotFoundError  no such subscription (also LookupError)
     │    └── ScheduleRegistryError
     │         ├── ScheduleConflictError  same name, other content
     │         └── ScheduleNotFoundError  no such schedule (also LookupError)
     ├── AgentRegistryError         an Agent registration or rotation that cannot be done
     │    └── AgentNotFoundError    no such Agent for the tenant (also LookupError)
     ├── ProjectNotFoundError       no such project for the tenant (404; also LookupError)
     ├── CursorNotFoundError        no such durable cursor of the system (404; also LookupError)
     ├── ActorError                 an actor file could not be opened or written
     │    ├── ActorBusyError        another writer held the file past the busy timeout
     │    └── OutboxError           an Event could not be written to the outbox
     ├── MessagingError             JetStream answered with something we cannot use
     │    ├── NatsUnavailableError  no NATS server reachable (no attempt is counted)
     │    │    └── LogUnavailableError  connected, but the stream cannot take a write now
     │    ├── StreamConfigError     a stream exists with settings we cannot update to
     │    ├── ConsumerGoneError     the pull consumer was deleted
     │    ├── SendRefusedError      a server answered and refused a send (an attempt)
     │    │    └── BatchRejectedError  JetStream refused an atomic batch as a whole
     │    ├── WebhookDeliveryError  an Agent's webhook did not take a wake
     │    └── ReactionDeliveryError  a webhook reaction's receiver did not take it
     ├── WebhookSignatureError      a signed webhook request failed verification
     │    └── WebhookRejected       the receiver answers it 401, with the reason
     ├── ArchiveError               an archive batch, key or object line is wrong, or S3 is down
     │    └── ArchiveUnavailableError  S3 could not be reached or refused the request
     ├── ReplayError                a replay that cannot run as asked (also ValueError)
     ├── DeadLetterError            an operator action on a dead letter cannot be done
     │    ├── DeadLetterNotFoundError  no such dead letter (404)
     │    └── DeadLetterClosedError  the letter is already closed (409)
     ├── AppProvisioningError       an app could not be provisioned (the command is retried)
     ├── WorkflowEngineError        the workflow engine answered with an error we cannot use
     ├── LocalStackError            the embedded nats-server or S3 server failed to start
     └── ApiError                   an answer the operator API gives on purpose (its status)
          ├── AuthenticationError   401: no token, or one not ours
          ├── PermissionDeniedError  403: the token lacks the operation's scope
          ├── PlatformRequiredError  403: a platform route asked by a tenant's token
          ├── ForbiddenError        403: not allowed whatever the scopes
          ├── NotFoundError         404: no such record for this tenant
          ├── ConflictError         409: the state of what it names refuses it
          ├── ArchiveDamagedError   409: an archive object cannot be read as Events
          ├── InvalidRequestError   422: a value the operation cannot use
          └── UnavailableError      503: a dependency the API needs does not answer

Every message says what was wrong, with the offending value, and what to do about it.

This module imports only the standard library: it is the bottom layer, so every module of the
package can import its errors. An error that carries values of a higher layer takes them as
constructor arguments. The operator API's own errors carry their HTTP status here too;
:mod:`rhumbatron.api.errors` maps every error to its answer. The development package's
``InvokeError`` (a ``ConfigurationError``) and ``DashboardForbiddenError`` stay with the local
tools they belong to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

__all__ = [
    "ActorBusyError",
    "ActorError",
    "AgentNotFoundError",
    "AgentRegistryError",
    "ApiError",
    "AppProvisioningError",
    "ArchiveDamagedError",
    "ArchiveError",
    "ArchiveUnavailableError",
    "AuthenticationError",
    "BatchRejectedError",
    "ChangeNotFoundError",
    "ConfigurationError",
    "ConflictError",
    "ConsumerGoneError",
    "CursorNotFoundError",
    "DeadLetterClosedError",
    "DeadLetterError",
    "DeadLetterNotFoundError",
    "DomainError",
    "EnvelopeError",
    "EventNotFoundError",
    "ForbiddenError",
    "InvalidRequestError",
    "LocalStackError",
    "LogUnavailableError",
    "MessagingError",
    "NatsUnavailableError",
    "NotFoundError",
    "NotHolderError",
    "OutboxError",
    "PermissionDeniedError",
    "PlatformRequiredError",
    "ProjectActiveError",
    "ProjectExistsError",
    "ProjectIdUnavailableError",
    "ProjectNotActiveError",
    "ProjectNotFoundError",
    "PromotionConflictError",
    "ReactionDeliveryError",
    "RegistryError",
    "ReplayError",
    "RetentionMisfitError",
    "RhumbatronError",
    "ScheduleConflictError",
    "ScheduleNotFoundError",
    "ScheduleRegistryError",
    "SelectorError",
    "SendRefusedError",
    "StreamConfigError",
    "SubscriptionConflictError",
    "SubscriptionDisabledError",
    "SubscriptionNotFoundError",
    "SubscriptionRegistryError",
    "TaskNotFoundError",
    "UnavailableError",
    "UnknownSubjectError",
    "UnknownTypeError",
    "UnsafePathError",
    "UnsafeStorageError",
    "UnsafeWebhookUrlError",
    "WebhookDeliveryError",
    "WebhookRejected",
    "WebhookSecretError",
    "WebhookSignatureError",
    "WorkflowEngineError",
    "WorkflowNotFoundError",
]


class RhumbatronError(Exception):
    """Base of every error Rhumbatron raises on purpose."""


# -- configuration ---------------------------------------------------------------------------


class ConfigurationError(RhumbatronError):
    """A setting has a value that cannot work; the message names the setting."""


class UnsafeStorageError(ConfigurationError):
    """The storage settings would lose or corrupt data (RELIABILITY F1, F21)."""


class RetentionMisfitError(ConfigurationError, ValueError):
    """The settings' windows do not fit together; ``misfits`` lists every broken rule.

    A ``ValueError`` too, so that pydantic reports it from the settings' validator like any
    other invalid value (and ``load_settings`` turns it into a ``ConfigurationError``).
    """

    # Each misfit is a ``rhumbatron.core.retention.RetentionMisfit``, whose ``str`` is the
    # rule, the settings it reads, why and the fix; this module sits below ``core`` and
    # cannot name the type.
    def __init__(self, misfits: tuple[object, ...]) -> None:
        self.misfits = misfits
        rules = "; ".join(f"({n}) {misfit}" for n, misfit in enumerate(misfits, start=1))
        count = f"{len(misfits)} rule{'s' if len(misfits) > 1 else ''} broken"
        super().__init__(f"the retention windows do not fit ({count}): {rules}")


class UnsafeWebhookUrlError(ConfigurationError, ValueError):
    """A webhook URL that Rhumbatron must not call.

    A :class:`ConfigurationError`, not a messaging error: no retry makes the URL safe; the
    agent's registration or ``RHUMBATRON_WEBHOOK_ALLOWED_HOSTS`` must change.
    """


class WebhookSecretError(ConfigurationError, ValueError):
    """A webhook secret is not ``whsec_`` + base64 key bytes.

    A :class:`ConfigurationError`: the secret is registered configuration of an agent, and
    only registering a correct one fixes it. The message never contains the secret.
    """


# -- input at the edge -----------------------------------------------------------------------


class EnvelopeError(RhumbatronError, ValueError):
    """An Event or Command envelope failed validation; the message names field and value."""


class UnknownTypeError(EnvelopeError):
    """An Event or Command type outside the closed registry."""


class UnsafePathError(RhumbatronError, ValueError):
    """A file or directory named from input would resolve outside the root it belongs under
    (``../``, an absolute part, a symlink out); nothing was created. The message names the
    part and the root."""


class SelectorError(RhumbatronError, ValueError):
    """A selector that cannot be built: the message names the pattern, key or value."""


# -- the domain ------------------------------------------------------------------------------


class DomainError(RhumbatronError):
    """A state transition that is not legal from the current state."""


class NotHolderError(DomainError):
    """The reporting Agent does not hold the Task (or the Task is no longer active)."""


class PromotionConflictError(DomainError):
    """Canonical moved past the Candidate's base: it must be recomposed before approval."""


# -- registries ------------------------------------------------------------------------------


class RegistryError(RhumbatronError, ValueError):
    """A registry record (a subscription, a schedule) that cannot be created or changed; the
    message names the value. ``field`` names the record field at fault, when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SubscriptionRegistryError(RegistryError):
    """A subscription that cannot be created or changed (``field``: ``reaction.agent_id``)."""


class SubscriptionConflictError(SubscriptionRegistryError):
    """The tenant has a subscription of that name with other content."""


class SubscriptionDisabledError(SubscriptionRegistryError):
    """The subscription is disabled, and the action needs it enabled."""


class SubscriptionNotFoundError(SubscriptionRegistryError, LookupError):
    """No subscription with that ID for this tenant (another tenant's is not found either)."""


class ScheduleRegistryError(RegistryError):
    """A schedule that cannot be created or changed (``field``: ``every_minutes``)."""


class ScheduleConflictError(ScheduleRegistryError):
    """The tenant has a schedule of that name with other content."""


class ScheduleNotFoundError(ScheduleRegistryError, LookupError):
    """No schedule with that ID for this tenant (another tenant's is not found either)."""


class AgentRegistryError(RhumbatronError, ValueError):
    """A registration or rotation that cannot be done; the message names the value."""


class AgentNotFoundError(AgentRegistryError, LookupError):
    """The tenant has no Agent with that ID."""


class CursorNotFoundError(RhumbatronError, LookupError):
    """No durable cursor of the system with that stream and consumer (404)."""


class ProjectNotFoundError(RhumbatronError, LookupError):
    """No project with that ID for this tenant (404)."""


class UnknownSubjectError(DomainError, LookupError):
    """A command refers to something that does not exist (a Change, a Candidate, a
    generation, an app): ``field`` names where, as the API's clients spell it
    (``command.payload.generation``). The API answers 422; a queue handler counts a failure,
    so the command ends as a dead letter, never as done."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


# -- actors ----------------------------------------------------------------------------------


class ActorError(RhumbatronError):
    """An actor's SQLite file could not be opened, locked or written."""


class ActorBusyError(ActorError):
    """Another writer held the actor file for longer than the busy timeout (F19)."""


class OutboxError(ActorError):
    """An Event could not be written to an outbox (too large, or not serialisable)."""


# -- messaging -------------------------------------------------------------------------------


class MessagingError(RhumbatronError):
    """JetStream answered with an error we cannot use as it is."""


class NatsUnavailableError(MessagingError):
    """No NATS server could be reached; publishing did not start, so no attempt counts."""


class LogUnavailableError(NatsUnavailableError):
    """Connected, but the stream could not take the write now: nobody answered it (no
    responders: no leader, or the stream is missing), its PubAck did not come in time, or
    JetStream said it is temporarily unavailable (a leader election, a quorum loss, the same
    message ID still in process). Nothing refused the message, so no attempt counts; the
    publisher tries again, at least once a second, while it waits for the log."""


class StreamConfigError(MessagingError):
    """A stream exists with settings that JetStream cannot update to the wanted ones."""


class ConsumerGoneError(MessagingError):
    """Nobody answers the pull: the consumer was deleted (by an operator, or with its stream)."""


class SendRefusedError(MessagingError):
    """A server answered and refused (or did not ack in time while connected): an attempt."""


class BatchRejectedError(SendRefusedError):
    """JetStream refused an atomic batch as a whole; ``code`` is its error code."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class WebhookDeliveryError(MessagingError):
    """A wake was not taken: a non-2xx answer, a timeout or a connection error.

    The queue retries the command; the message names the Agent, the URL and what happened.
    """


class ReactionDeliveryError(MessagingError):
    """A webhook reaction was not taken: ``status_code`` is the receiver's non-2xx answer, or
    None for a timeout or a connection error. The delivery ledger retries it."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


# -- webhooks received -----------------------------------------------------------------------


class WebhookSignatureError(RhumbatronError):
    """A signed webhook request failed verification; the message says which check failed."""


class WebhookRejected(WebhookSignatureError):
    """A webhook the receiver must not act on: answer ``status`` (401) with the message.

    ``reason`` says which check failed; ``webhook_id`` is the request's ``webhook-id``
    (None when it had none).
    """

    status = 401

    # ``reason`` is a ``rhumbatron.reactions.webhook_verification.RejectionReason``; this
    # module sits below ``reactions`` and cannot name the type.
    def __init__(self, message: str, *, reason: StrEnum, webhook_id: str | None) -> None:
        super().__init__(message)
        self.reason = reason
        self.webhook_id = webhook_id


# -- archive and replay ----------------------------------------------------------------------


class ArchiveError(RhumbatronError):
    """The S3 event archive refused a batch, a key or an object line; the message names it."""


class ArchiveUnavailableError(ArchiveError):
    """S3 could not be reached or refused the request; the message names bucket and key.

    Nothing is lost as long as the caller leaves the batch's messages unacknowledged: the
    redelivered events are written again (see :mod:`rhumbatron.archive.keys`).
    """


class ReplayError(RhumbatronError, ValueError):
    """A replay that cannot run as asked; the message names the value and what to pass."""


# -- operations ------------------------------------------------------------------------------


class DeadLetterError(RhumbatronError):
    """An operator action on a dead letter cannot be done; the message says why."""


class DeadLetterNotFoundError(DeadLetterError, LookupError):
    """No dead letter with that ID (for this tenant)."""


class DeadLetterClosedError(DeadLetterError):
    """The dead letter is already closed; it cannot be retried or dismissed again."""


class AppProvisioningError(RhumbatronError):
    """The app could not be provisioned; the command is retried (and dead-lettered)."""


class WorkflowEngineError(RhumbatronError):
    """The workflow engine answered with an error we cannot use (throttled, denied, down)."""


class WorkflowNotFoundError(RhumbatronError, LookupError):
    """No instance of that workflow with that ID."""


class LocalStackError(RhumbatronError):
    """The embedded nats-server or the local S3 server did not start or answer."""


# -- a project's and a lookup's refusals (lifecycle) ---------------------------------------


class ProjectIdUnavailableError(DomainError):
    """The project ID is another tenant's project."""


class ProjectExistsError(DomainError):
    """The project exists under another name."""


class ProjectNotActiveError(DomainError):
    """The project is archived or deleted, and the request needs an active one."""


class ProjectActiveError(DomainError):
    """The project is active, and the request needs it archived first."""


class ChangeNotFoundError(RhumbatronError, LookupError):
    """No such Change in the project."""


class TaskNotFoundError(RhumbatronError, LookupError):
    """No such Task in the Change."""


class EventNotFoundError(RhumbatronError, LookupError):
    """No such event on the project's stream (not applied by the project view yet, or gone)."""


# -- the operator API's own answers, each with its HTTP status ----------------------------


class ApiError(RhumbatronError):
    """An answer the API gives on purpose: HTTP status, code, and maybe the field at fault."""

    status_code = 400
    default_code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.field = field
        self.headers = dict(headers or {})


class AuthenticationError(ApiError):
    """401: no bearer token, or one that is expired, malformed or not signed by our issuer."""

    status_code = 401
    default_code = "invalid_token"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        code = code or self.default_code
        # RFC 6750 §3: no error attribute when the request carried no token at all.
        challenge = "Bearer" if code == "missing_token" else 'Bearer error="invalid_token"'
        super().__init__(message, code=code, headers={"WWW-Authenticate": challenge})


class PermissionDeniedError(ApiError):
    """403: the token is valid but lacks the operation's scope."""

    status_code = 403
    default_code = "insufficient_scope"

    def __init__(self, scope: str, *, tenant: str, has: Iterable[str]) -> None:
        super().__init__(
            f"this operation needs the scope {scope!r}; the token (tenant {tenant!r}) has "
            f"{', '.join(repr(s) for s in sorted(has)) or 'no scopes'}",
            headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{scope}"'},
        )
        self.scope = scope


class PlatformRequiredError(ApiError):
    """403: a platform route (its data spans every tenant) asked by a tenant-bound token."""

    status_code = 403
    default_code = "platform_required"

    def __init__(self, doing: str, *, tenant: str) -> None:
        super().__init__(
            f"{doing} spans every tenant, so it needs a platform token (tenant '*'); this "
            f"token is bound to tenant {tenant!r}. Ask a platform operator.",
            # RFC 6750 §3.1: the request needs higher privileges than the token carries.
            headers={"WWW-Authenticate": 'Bearer error="insufficient_scope"'},
        )


class ForbiddenError(ApiError):
    """403: the caller may not do this whatever its scopes (a platform token creating what
    only a tenant can own)."""

    status_code = 403
    default_code = "forbidden"


class NotFoundError(ApiError):
    """404: no such record for this tenant (a subscription, a schedule)."""

    status_code = 404
    default_code = "not_found"


class ConflictError(ApiError):
    """409: the request is well formed, but the state of what it names refuses it."""

    status_code = 409
    default_code = "conflict"


class ArchiveDamagedError(ApiError):
    """409: an archive object of the range cannot be read as Events; the message names it."""

    status_code = 409
    default_code = "archive_damaged"


class InvalidRequestError(ApiError):
    """422: a request value the models accept but the operation cannot use."""

    status_code = 422
    default_code = "invalid_request"


class UnavailableError(ApiError):
    """503: a dependency the API needs does not answer (a JWKS endpoint)."""

    status_code = 503
    default_code = "unavailable"
