"""Aggregates whose transitions return ``(patch, facts)``.

A transition is pure: it reads the current state it is given, decides whether the change is
legal, and returns what to write (the patch) and what happened (the facts). The actor writes
both in one SQLite transaction, so emission can neither be forgotten nor lie.
"""
