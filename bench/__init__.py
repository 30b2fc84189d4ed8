"""Rhumbatron benchmarks: printed figures, not timed tests.

``python -m bench.run`` (``make bench``) measures, in one run, raw nats-py JetStream publishing
against :meth:`~rhumbatron.actors.publisher.OutboxPublisher.publish_due`, at nats-server's
default sync interval and at ``sync_interval: always``, and actor transactions against plain
sqlite3 in WAL and DELETE journal modes. It prints a table and writes ``bench/results.json``.
"""
