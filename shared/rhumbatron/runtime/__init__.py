"""The composition root: the one place that builds the whole system from its settings."""
