"""varbench.cli."""
