"""The Change lifecycle: the integration module's command handlers, the workflows they start,
and the housekeeping the sweep queues."""
