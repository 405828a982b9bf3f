"""varbench.loggers."""
