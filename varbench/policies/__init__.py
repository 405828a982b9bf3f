"""Policy registry: `build_policy(name, **knobs)`; a typo gets the closest names suggested."""
from __future__ import annotations

from varbench.core.registry import METHODS_GROUP, LazyRegistry
from varbench.engine.policy import Policy  # noqa: F401

#: method name -> "module:Class" (imported lazily); installed packages add theirs through the
#: `varbench.methods` entry-point group, and `method.name: pkg.module:Class` needs no entry at all
REGISTRY = LazyRegistry("method", group=METHODS_GROUP, entries={
    "baseline": "varbench.policies.baseline:Baseline",
    "fastvar": "varbench.policies.fastvar:FastVAR",
    "nova": "varbench.policies.nova:NOVA",
    "toprovar": "varbench.policies.toprovar:ToProVAR",
    "skip_last": "varbench.policies.skip:SkipLast",
    "skipvar_fixed": "varbench.policies.skip:SkipVARFixed",
    "skipvar": "varbench.policies.skipvar:SkipVAR",
    "scalekv": "varbench.policies.scalekv:ScaleKV",
    "sparsevar": "varbench.policies.sparsevar:SparseVAR",
    "compose": "varbench.policies.compose:Compose",
})


def build_policy(name: str, **knobs) -> Policy:
    return REGISTRY.load(name)(**knobs)
