"""Settings, the clock, and the composition root."""
