"""Rhumbatron: event-and-command plumbing.

Facts (Events) leave an actor's SQLite transaction through a transactional outbox and reach
eight NATS JetStream streams; requests for work (Commands) travel on one work-queue stream.
All logic lives in this package; the Lambda handlers in ``functions/`` only wire it.
"""

__version__ = "0.1.0"
