"""varbench: speed and quality of acceleration methods for visual autoregressive text-to-image models."""
from .resources import register_resolvers

register_resolvers()
