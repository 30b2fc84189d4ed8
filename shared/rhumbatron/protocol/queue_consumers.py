"""The spec's QUEUE_CONSUMERS table: one durable consumer per command queue.

Each queue is one subject, ``cmd.<queue>``, read by one durable consumer, ``q-<queue>``, with
the batch size, concurrency, retries, retry delay and dead-letter queue the table gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from rhumbatron.protocol.command_types import QUEUES

__all__ = ["DEAD_LETTER_QUEUE", "QUEUE_CONSUMERS", "QueueConsumer", "consumer_name"]

DEAD_LETTER_QUEUE = "dead-letter"


@dataclass(frozen=True, slots=True)
class QueueConsumer:
    """One row of the spec's QUEUE_CONSUMERS table."""

    queue: str
    consumer_module: str
    batch_size: int
    concurrency: int
    retries: int
    retry_delay_s: float
    dead_letter_queue: str | None
    on_exhausted: str

    @property
    def max_deliveries(self) -> int:
        """The first delivery plus the retries."""
        return self.retries + 1

    @property
    def holds_dead_letters(self) -> bool:
        """The dead-letter queue: handling a message there records the letter. It neither
        expires a command (a late letter is still a letter) nor means the command succeeded."""
        return self.queue == DEAD_LETTER_QUEUE


#: The spec's table, row for row (services/core/src/consumers.ts).
QUEUE_CONSUMERS: MappingProxyType[str, QueueConsumer] = MappingProxyType(
    {
        row.queue: row
        for row in (
            QueueConsumer(
                "agent-wakeups", "agents", 10, 2, 3, 30.0, DEAD_LETTER_QUEUE, "dead-letter"
            ),
            QueueConsumer(
                "integration", "integration", 10, 2, 3, 30.0, DEAD_LETTER_QUEUE, "dead-letter"
            ),
            QueueConsumer(
                "verification", "integration", 5, 2, 3, 30.0, DEAD_LETTER_QUEUE, "dead-letter"
            ),
            QueueConsumer(
                "release", "integration", 5, 2, 3, 30.0, DEAD_LETTER_QUEUE, "dead-letter"
            ),
            QueueConsumer(
                "indexing",
                "indexer",
                1,
                1,
                3,
                30.0,
                None,
                "the indexer records the failure in project_indexes",
            ),
            QueueConsumer(
                "dead-letter",
                "event router",
                5,
                1,
                5,
                60.0,
                None,
                "the consumer logs the message and terminates it",
            ),
        )
    }
)
assert tuple(QUEUE_CONSUMERS) == QUEUES, "QUEUE_CONSUMERS must have one row per queue"


def consumer_name(queue: str) -> str:
    """``q-<queue>``: the durable consumer of a queue."""
    return f"q-{queue}"
