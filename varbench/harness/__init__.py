"""varbench.harness."""
