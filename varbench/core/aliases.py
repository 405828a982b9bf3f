"""Module paths from before the layered layout, kept working.

The documented commands (``python -m varbench.aggregate``, ``python -m varbench.publish``,
``python -m varbench.job assemble``, ``python -m varbench.evaluators.geneval_convert_mmdet``) run
their module in its new place, silently: they are still the documented spelling. Importing any other
old path (``import varbench.records``) works too, with a DeprecationWarning naming the new one, so a
notebook written against 0.1 keeps running while it is updated. An alias is a view of the new
module: reading names works, but a monkeypatch must target the new path.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

#: old path -> new path, run silently with ``python -m`` (the documented commands, docs/)
COMMANDS = {
    "varbench.aggregate": "varbench.cli.aggregate",
    "varbench.publish": "varbench.loggers.publish",
    "varbench.job": "varbench.cli.assemble",
    "varbench.list": "varbench.cli.listing",
    "varbench.evaluators.geneval_convert_mmdet": "varbench.evaluators.geneval.convert_mmdet",
}

#: old path -> new path, imported with a DeprecationWarning
MOVED = {
    "varbench.errors": "varbench.core.errors", "varbench.registry": "varbench.core.registry",
    "varbench.seeds": "varbench.core.seeds", "varbench.locks": "varbench.core.locks",
    "varbench.interrupt": "varbench.core.interrupt", "varbench.resources": "varbench.core.resources",
    "varbench.plan": "varbench.engine.plan", "varbench.runtime": "varbench.engine.runtime",
    "varbench.sampling": "varbench.engine.sampling", "varbench.flops": "varbench.engine.flops",
    "varbench.stage_flops": "varbench.engine.stage_flops", "varbench.models": "varbench.engine.models",
    "varbench.models.infinity": "varbench.engine.models.infinity",
    "varbench.models.bsq_vae": "varbench.engine.models.bsq_vae",
    "varbench.models.checkpoints": "varbench.engine.models.checkpoints",
    "varbench.models.text": "varbench.engine.models.text",
    "varbench.models.schedules": "varbench.engine.models.schedules",
    "varbench.build": "varbench.harness.build", "varbench.testing": "varbench.engine.testing",
    "varbench.validate": "varbench.harness.config", "varbench.prompts": "varbench.harness.prompts",
    "varbench.timing": "varbench.harness.timing", "varbench.scoring": "varbench.harness.scoring",
    "varbench.provenance": "varbench.harness.provenance", "varbench.store": "varbench.harness.store",
    "varbench.records": ("varbench.harness.records", "varbench.analysis.frame"),   # split in two "varbench.schema": "varbench.harness.schema",
    "varbench.sharding": "varbench.harness.sharding",
    "varbench.tables": "varbench.analysis.tables", "varbench.plots": "varbench.analysis.plots",
    "varbench.image_grid": "varbench.analysis.image_grid", "varbench.wandb_sink": "varbench.loggers.wandb",
    "varbench.callbacks": "varbench.cli.callbacks",
    "varbench.evaluators.geneval_rules": "varbench.evaluators.geneval.rules",
    "varbench.evaluators.toy_geneval": "varbench.toy.geneval",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str | tuple[str, ...], deprecated: bool):
        self.targets = (target,) if isinstance(target, str) else tuple(target)
        self.target, self.deprecated = ", ".join(self.targets), deprecated

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        if self.deprecated:
            warnings.warn(f"{module.__name__} moved to {self.target}; import it from there",
                          DeprecationWarning, stacklevel=3)
        targets = [importlib.import_module(t) for t in self.targets]

        def lookup(name: str):
            for target in targets:       # a module split in two: the first that has the name
                if hasattr(target, name):
                    return getattr(target, name)
            raise AttributeError(f"{module.__name__} (now {', '.join(self.targets)}) has no attribute {name!r}")

        module.__dict__["__getattr__"] = lookup
        module.__dict__["__doc__"] = targets[0].__doc__
        module.__dict__["__all__"] = [n for t in targets for n in vars(t) if not n.startswith("_")]

    def get_code(self, fullname: str):
        """What ``python -m <old path>`` runs: the new module, as ``__main__``."""
        src = f"import runpy\nrunpy.run_module({self.targets[0]!r}, run_name='__main__', alter_sys=True)\n"
        return compile(src, f"<{fullname}: alias of {self.target}>", "exec")


class AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in COMMANDS:
            return importlib.util.spec_from_loader(fullname, _Alias(COMMANDS[fullname], deprecated=False))
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, _Alias(MOVED[fullname], deprecated=True))
        return None


def install_aliases() -> None:
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(AliasFinder())   # last: a real module of the same name always wins
