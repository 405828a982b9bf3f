"""Policy registry: `build_policy(name, **knobs)`; a typo gets the closest names suggested."""
from __future__ import annotations

from varbench.core.registry import METHODS_GROUP, LazyRegistry
from varbench.engine.policy import Policy  # noqa: F401

#: method name -> "module:Class" (imported lazily); installed packages add theirs through the
#: `varbench.methods` entry-point group, and `method.name: pkg.module:Class` needs no entry at all
def _a_policy_class(obj) -> str | None:
    """None for a `Policy` subclass (what a method slot takes); else what it should be."""
    return None if isinstance(obj, type) and issubclass(obj, Policy) else "a subclass of varbench.engine.policy.Policy"


REGISTRY = LazyRegistry("method", group=METHODS_GROUP, expects=_a_policy_class, entries={
    "baseline": "varbench.policies.baseline:Baseline",
    "fastvar": "varbench.policies.fastvar:FastVAR",
    "nova": "varbench.policies.nova:NOVA",
    "toprovar": "varbench.policies.toprovar:ToProVAR",
    "skip_last": "varbench.policies.skip:SkipLast",
    "skipvar_fixed": "varbench.policies.skip:SkipVARFixed",
    "skipvar": "varbench.policies.skipvar:SkipVAR",
    "scalekv": "varbench.policies.scalekv:ScaleKV",
    "sparvar": "varbench.policies.sparvar:SparVAR",
    "sparsevar": "varbench.policies.sparsevar:SparseVAR",
    "compose": "varbench.policies.compose:Compose",
})


def build_policy(name: str, **knobs) -> Policy:
    return REGISTRY.load(name)(**knobs)
