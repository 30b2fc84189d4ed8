"""SQLite actors with a transactional outbox, their alarms, and the outbox publisher."""
