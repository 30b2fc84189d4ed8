"""Unit tests: pure code, SQLite files in temp dirs, a manual clock; no network."""
