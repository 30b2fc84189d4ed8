"""The wire contract: envelopes, the closed type registries, identities and the queue table.

Import from the modules (``protocol.envelopes``, ``protocol.event_types``,
``protocol.command_types``, ``protocol.ids``, ``protocol.queue_consumers``): this package
imports none of them, so a handler that needs only the stream count (``protocol.ids``) does
not load the message registry at its cold start.
"""
