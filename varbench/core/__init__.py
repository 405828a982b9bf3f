"""varbench.core."""
