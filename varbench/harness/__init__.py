"""The harness: configs, prompts, jobs, timing, scoring, the sealed store and its records."""
from varbench.policies.knobs import register as register_method_schemas

register_method_schemas()   # <method>_schema in Hydra's ConfigStore: the method presets' defaults lists name them
