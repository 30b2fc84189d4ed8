"""Queue handlers: what each command queue's consumer does with a message.

The runtime (:mod:`rhumbatron.messaging.queue_consumer`) fetches, holds and settles messages;
the modules here decide. :mod:`~rhumbatron.queues.dead_letter` is the dead-letter queue's
consumer (the event router role) and the closure of command dead letters.
"""

from rhumbatron.queues.dead_letter import (
    DeadLetterConsumer,
    close_letters_of_ended_changes,
    run_dead_letter_consumer,
    supersede_letters_of_change,
)

__all__ = [
    "DeadLetterConsumer",
    "close_letters_of_ended_changes",
    "run_dead_letter_consumer",
    "supersede_letters_of_change",
]
