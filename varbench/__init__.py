"""varbench: speed and quality of acceleration methods for visual autoregressive text-to-image models."""
from varbench.policies.knobs import register as register_method_schemas
from varbench.core.resources import register_resolvers

register_resolvers()
register_method_schemas()   # <method>_schema in Hydra's ConfigStore: the method presets' defaults lists name them
