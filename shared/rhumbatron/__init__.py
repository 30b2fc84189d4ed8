"""Rhumbatron: event-and-command plumbing.

Facts (Events) leave an actor's SQLite transaction through a transactional outbox and reach
eight NATS JetStream streams; requests for work (Commands) travel on one work-queue stream.
All logic lives in this package; the Lambda handlers in ``functions/`` only wire it.
"""

__version__ = "0.1.0"

from rhumbatron.redaction import install_log_redaction as _install_log_redaction

# httpx logs every request line with its full URL at INFO, and webhook URLs are chosen by
# tenants (user info and query may hold credentials): every process that imports the package
# logs them redacted. Standard library only, so no cold-start cost to speak of.
_install_log_redaction()
