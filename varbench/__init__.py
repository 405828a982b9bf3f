"""varbench: speed and quality of acceleration methods for visual autoregressive text-to-image models.

Layers, bottom to top (each imports only those before it): `core`, `engine`, `policies`, `evaluators`,
`toy`, `harness`, `analysis`, `loggers`, `cli`. Importing `varbench` loads nothing but `core`."""
from varbench.core.aliases import install_aliases
from varbench.core.resources import register_resolvers

register_resolvers()   # ${varbench:...} in the packaged configs
install_aliases()      # `python -m varbench.aggregate` and the other documented module paths
