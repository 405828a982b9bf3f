"""A toy world whose text-to-image quality can be measured exactly on a CPU.

`world` draws scenes of flat coloured shapes with GenEval-style captions; the matching exact
scorer is `varbench.toy.geneval.ToyGenEval`.
"""
from varbench.toy.world import (  # noqa: F401
    PALETTE,
    SHAPES,
    TAGS,
    WORLD_VERSION,
    ToyObject,
    ToyScene,
    prompt_set,
    render,
    sample_scene,
)
