"""Module paths from before the layered layout, kept working.

The documented commands (``python -m varbench.aggregate``, ``python -m varbench.publish``,
``python -m varbench.job assemble``, ``python -m varbench.list``, ``python -m varbench.check_method``,
``python -m varbench.evaluators.geneval_convert_mmdet``) run
their module in its new place, silently: they are still the documented spelling. Importing any other
old path (``import varbench.records``) works too, with a DeprecationWarning naming the new one, so a
notebook written against 0.1 keeps running while it is updated. An alias is a view of the new
module: reading names works, but a monkeypatch must target the new path.

Modules moved whole are in `MOVED` (a module split in two or three names every part: the first that
has a name gives it). Names that left a module still at its path (the backbone-specific parts of a
seam module, e.g. ``varbench.engine.flops.scale_flops``) are in `MOVED_NAMES`, read through that
module's ``__getattr__`` (`moved_names`), with the same warning.
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
    "varbench.check_method": "varbench.cli.check_method",
    "varbench.evaluators.geneval_convert_mmdet": "varbench.evaluators.geneval.convert_mmdet",
}

#: old path -> new path, imported with a DeprecationWarning
MOVED = {
    "varbench.errors": "varbench.core.errors", "varbench.registry": "varbench.core.registry",
    "varbench.seeds": "varbench.core.seeds", "varbench.locks": "varbench.core.locks",
    "varbench.interrupt": "varbench.core.interrupt", "varbench.resources": "varbench.core.resources",
    "varbench.plan": "varbench.engine.plan",
    "varbench.runtime": ("varbench.engine.backbones.infinity.runtime", "varbench.engine.generation",
                         "varbench.engine.kv_cache"),
    "varbench.sampling": "varbench.engine.backbones.infinity.sampling", "varbench.flops": "varbench.engine.flops",
    "varbench.stage_flops": "varbench.engine.stage_flops", "varbench.models": "varbench.engine.backbones",
    "varbench.models.infinity": "varbench.engine.backbones.infinity.model",
    "varbench.models.bsq_vae": "varbench.engine.backbones.infinity.bsq_vae",
    "varbench.models.checkpoints": "varbench.engine.checkpoints",
    "varbench.models.text": "varbench.engine.text",
    "varbench.models.schedules": "varbench.engine.backbones.infinity.schedules",
    "varbench.build": "varbench.harness.build",
    "varbench.validate": "varbench.harness.config", "varbench.prompts": "varbench.harness.prompts",
    "varbench.timing": "varbench.harness.timing", "varbench.scoring": "varbench.harness.scoring",
    "varbench.provenance": "varbench.harness.provenance", "varbench.store": "varbench.harness.store",
    "varbench.records": ("varbench.harness.records", "varbench.analysis.frame"),   # split in two
    "varbench.schema": "varbench.harness.schema",
    "varbench.sharding": "varbench.harness.sharding",
    "varbench.tables": "varbench.analysis.tables", "varbench.plots": "varbench.analysis.plots",
    "varbench.image_grid": "varbench.analysis.image_grid", "varbench.wandb_sink": "varbench.loggers.wandb",
    "varbench.callbacks": "varbench.cli.callbacks",
    "varbench.evaluators.geneval_rules": "varbench.evaluators.geneval.rules",
    "varbench.evaluators.toy_geneval": "varbench.toy.geneval",
    # each backbone in its own folder (engine/backbones/<family>/), the seam beside them in engine/
    "varbench.engine.models": "varbench.engine.backbones",
    "varbench.engine.models.infinity": "varbench.engine.backbones.infinity.model",
    "varbench.engine.models.bsq_vae": "varbench.engine.backbones.infinity.bsq_vae",
    "varbench.engine.models.schedules": "varbench.engine.backbones.infinity.schedules",
    "varbench.engine.models.checkpoints": "varbench.engine.checkpoints",
    "varbench.engine.models.text": "varbench.engine.text",
    "varbench.engine.models.hart": "varbench.engine.backbones.hart",
    "varbench.engine.models.hart.model": "varbench.engine.backbones.hart.model",
    "varbench.engine.models.hart.runtime": "varbench.engine.backbones.hart.runtime",
    "varbench.engine.models.hart.state": "varbench.engine.backbones.hart.state",
    "varbench.engine.models.hart.sampling": "varbench.engine.backbones.hart.sampling",
    "varbench.engine.models.hart.flops": "varbench.engine.backbones.hart.flops",
    "varbench.engine.models.hart.text": "varbench.engine.backbones.hart.text",
    "varbench.engine.models.hart.tokenizer": "varbench.engine.backbones.hart.tokenizer",
    # split: Infinity's loop and state went to its folder, what every backbone shares to the seam
    "varbench.engine.runtime": ("varbench.engine.backbones.infinity.runtime", "varbench.engine.generation",
                                "varbench.engine.kv_cache"),
    "varbench.engine.state": ("varbench.engine.backbones.infinity.state", "varbench.engine.kv_cache",
                              "varbench.engine.generation"),
    "varbench.engine.block_step": "varbench.engine.backbones.infinity.block_step",
    "varbench.engine.pruned": ("varbench.engine.backbones.infinity.pruned", "varbench.engine.residuals"),
    "varbench.engine.sampling": "varbench.engine.backbones.infinity.sampling",
    # dev tools out of the mechanism
    "varbench.engine.fake_cuda": "varbench.testing.fake_cuda",
    "varbench.engine.testing": "varbench.testing.tiny",
    "varbench.harness.testing": "varbench.testing.jobs",
}


#: names that left a module still at its path (the backbone-specific part of a seam module): module ->
#: {name: the module it lives in now}. The module reads them through `moved_names` (its `__getattr__`),
#: with a DeprecationWarning, so ``from varbench.engine.flops import scale_flops`` keeps working.
_INF, _HART = "varbench.engine.backbones.infinity", "varbench.engine.backbones.hart"
MOVED_NAMES = {
    "varbench.engine.flops": {n: f"{_INF}.flops" for n in ("scale_flops", "text_flops", "image_flops")},
    "varbench.engine.stage_flops": {
        "decoder_flops": f"{_INF}.stage_flops", "preset_stage_flops": "varbench.engine.backbones",
        **{n: f"{_HART}.stage_flops" for n in ("QWEN2_1P5B", "HART_MAX_LENGTH", "HART_SYSTEM_PROMPT_TOKENS",
                                               "hart_decoder_flops", "qwen2_text_flops", "hart_text_tokens")}},
    "varbench.engine.memory": {"weights_bytes": f"{_INF}.memory"},
    "varbench.engine.checkpoints": {"load_strict": f"{_INF}.checkpoints", "load_infinity_weights": f"{_INF}.checkpoints"},
    "varbench.harness.job": {"hydra_job_num": "varbench.cli.context"},   # Hydra's state is read by the CLI only
}


def moved_names(module: str):
    """The `__getattr__` of `module` (a module still at its path) for the names `MOVED_NAMES` lists:
    each read from its new module, with a DeprecationWarning naming it (the import is by name, at
    first use, so a seam module names a backbone's module without importing it)."""
    moved = MOVED_NAMES.get(module, {})

    def lookup(name: str):
        target = moved.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {target}; import it from there", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(target), name)

    return lookup

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
        # a package to the import system, whose submodules are only the aliases `MOVED` lists: without
        # it, `import <old>.<sub>` would read the target's __path__ (through `lookup`) and load a second
        # copy of whatever file sits there under the old name
        module.__dict__["__path__"] = []
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
