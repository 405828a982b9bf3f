"""varbench.engine."""
