"""Integration tests: a real nats-server per test (fixtures in tests/conftest.py)."""
