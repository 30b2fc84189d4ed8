"""Mutation testing of Rhumbatron's core (``make mutation``): a development tool, not shipped.

``python -m mutation.run`` runs mutmut over one or more core packages, re-checks in a fresh
process the mutants mutmut cannot reach, and prints the kill rate per package against the
committed list of equivalent mutants (``mutation/equivalent.txt``).
"""
