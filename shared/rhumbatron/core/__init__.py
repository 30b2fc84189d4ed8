"""The kernel: settings, the clock, the event loop, crash points and the retention check.

Every other package may import it; it imports only ``errors``, ``redaction`` and ``protocol``
(the retention check reads the queue table and the stream count there).
"""
