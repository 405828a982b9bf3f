"""Triton 3.6's interpreter under NumPy >= 2.4: let a scalar kernel argument be a `range` bound again.

The interpreter wraps every scalar argument of a launch (e.g. the key count `Lk`) as a tensor whose data
is a one-element *1-D* NumPy array, and gives tensors `__index__ = int(self.handle.data)`. NumPy 2.4
turned "conversion of an array with ndim > 0 to a scalar" (deprecated since 1.25) into a TypeError, so
`for start_n in range(0, Lk, BLOCK_N)` raises "only 0-dimensional arrays can be converted to Python
scalars" inside the interpreter (every interpreted launch of the entropy kernel fails). Triton 3.8's
interpreter reads `int(self.handle.data.squeeze())`; this module makes 3.6's do the same, and only
that: the compiled (GPU) kernel never goes through the interpreter, and a tensor of more than one element
still refuses to become an index.
"""
from __future__ import annotations

_PATCHED = False


def _numpy_refuses_1d_scalars() -> bool:
    import numpy as np

    try:
        int(np.array([1]))
    except TypeError:
        return True
    return False


def patch_scalar_index() -> bool:
    """Apply the squeeze to the interpreter's tensor `__index__` (idempotent). Returns whether a patch is
    in force: only when NumPy refuses 1-D scalars and this Triton's interpreter patches tensors through
    `_patch_lang_tensor` (3.6's layout; a later Triton that changed it is left alone)."""
    global _PATCHED
    if _PATCHED:
        return True
    if not _numpy_refuses_1d_scalars():
        return False
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return False

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_lang_tensor
    _PATCHED = True
    return True
