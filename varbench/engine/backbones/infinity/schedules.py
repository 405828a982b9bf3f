"""Scale schedules of the released Infinity models, and the 2-D RoPE tables they index.

Facts (upstream `infinity/utils/dynamic_resolution.py`): 8 base aspect ratios and their inverses
make 15 h/w templates; each template lists 13 token grids; the resolution presets '0.06M',
'0.25M', '0.60M' and '1M' take the first 7, 10, 12 and 13 of them. The VAE stride is 16 pixels
per token (the 8B's patchified VAE works on a 2x finer grid but the transformer grid is the same).
"""
from __future__ import annotations

import functools

import torch

#: (h, w) token grids per base h/w ratio, transcribed from the released table (facts, not code).
_BASE_GRIDS: dict[float, list[tuple[int, int]]] = {
    1.000: [(1, 1), (2, 2), (4, 4), (6, 6), (8, 8), (12, 12), (16, 16), (20, 20), (24, 24), (32, 32), (40, 40), (48, 48), (64, 64)],
    1.250: [(1, 1), (2, 2), (3, 3), (5, 4), (10, 8), (15, 12), (20, 16), (25, 20), (30, 24), (35, 28), (45, 36), (55, 44), (70, 56)],
    1.333: [(1, 1), (2, 2), (4, 3), (8, 6), (12, 9), (16, 12), (20, 15), (24, 18), (28, 21), (36, 27), (48, 36), (60, 45), (72, 54)],
    1.500: [(1, 1), (2, 2), (3, 2), (6, 4), (9, 6), (15, 10), (21, 14), (27, 18), (33, 22), (39, 26), (48, 32), (63, 42), (78, 52)],
    1.750: [(1, 1), (2, 2), (3, 3), (7, 4), (11, 6), (14, 8), (21, 12), (28, 16), (35, 20), (42, 24), (56, 32), (70, 40), (84, 48)],
    2.000: [(1, 1), (2, 2), (4, 2), (6, 3), (10, 5), (16, 8), (22, 11), (30, 15), (38, 19), (46, 23), (60, 30), (74, 37), (90, 45)],
    2.500: [(1, 1), (2, 2), (5, 2), (10, 4), (15, 6), (20, 8), (25, 10), (30, 12), (40, 16), (50, 20), (65, 26), (80, 32), (100, 40)],
    3.000: [(1, 1), (2, 2), (6, 2), (9, 3), (15, 5), (21, 7), (27, 9), (36, 12), (45, 15), (54, 18), (72, 24), (90, 30), (111, 37)],
}
RESOLUTION_PRESETS: dict[str, int] = {"0.06M": 7, "0.25M": 10, "0.60M": 12, "1M": 13}
VAE_STRIDE = 16


def _templates() -> dict[float, list[tuple[int, int]]]:
    out = {}
    for ratio, grids in _BASE_GRIDS.items():
        out[ratio] = grids
        if ratio != 1.0:
            # the released code truncates 1/ratio to 3 decimals (0.8, 0.75, 0.666, ...)
            out[int(1 / ratio * 1000) / 1000] = [(w, h) for h, w in grids]
    return out


TEMPLATES: dict[float, list[tuple[int, int]]] = _templates()
H_DIV_W_TEMPLATES: tuple[float, ...] = tuple(TEMPLATES)


def nearest_template(h_div_w: float) -> float:
    """The template the released code picks: argmin |h_div_w - template| (first on ties)."""
    if not h_div_w > 0:
        raise ValueError(f"h_div_w must be a positive aspect ratio (height / width), got {h_div_w!r}")
    return min(H_DIV_W_TEMPLATES, key=lambda t: (abs(h_div_w - t), H_DIV_W_TEMPLATES.index(t)))


def scale_schedule(h_div_w: float = 1.0, pn: str = "1M") -> list[tuple[int, int]]:
    """Token grids (h, w) per scale for an aspect ratio and resolution preset."""
    if pn not in RESOLUTION_PRESETS:
        raise ValueError(f"Unknown resolution preset {pn!r}; use one of {sorted(RESOLUTION_PRESETS)}.")
    return list(TEMPLATES[nearest_template(h_div_w)][: RESOLUTION_PRESETS[pn]])


def rope_reference_grid(h_div_w: float) -> tuple[int, int]:
    """The grid whose positions every scale is subsampled from: the template's '1M' last scale.

    The released RoPE table is built per template from the 1M schedule and shared by all its
    resolution presets, so a 512² image still indexes positions of the 64x64 grid.
    """
    return TEMPLATES[nearest_template(h_div_w)][-1]


@functools.lru_cache(maxsize=64)
def freqs_grid(head_dim: int, max_edge: int, base: float) -> torch.Tensor:
    """cos/sin of position x frequency, (2, max_edge, max_edge, head_dim // 2), as released.

    Half of the rotary pairs encode the row, half the column, with base-10000 frequencies over
    half the head dimension. Cached per argument (`freqs_grid.cache_clear()` drops the CPU tensors,
    as the fake-CUDA dry run does around its fake mode).
    """
    half = head_dim // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, half, 2, dtype=torch.int64).float() / half))
    t = torch.arange(max_edge, dtype=torch.int64).type_as(inv_freq)
    f_h = torch.outer(t, inv_freq)
    f_w = torch.outer(t, inv_freq)
    grid = torch.cat([f_h[:, None, :].expand(-1, max_edge, -1), f_w[None, :, :].expand(max_edge, -1, -1)], dim=-1)
    return torch.stack([torch.cos(grid), torch.sin(grid)], dim=0)


def rope_table(head_dim: int, grid: tuple[int, int], ref: tuple[int, int], max_edge: int = 128, base: float = 10000.0) -> torch.Tensor:
    """RoPE (cos, sin) for one scale's (h, w) tokens: (2, h*w, head_dim // 2).

    Positions follow the released "star" normalisation (rope2d_normalized_by_hw=2): row i of an
    h-row scale uses row round(i * H_ref / h) of the reference grid, likewise for columns.
    """
    h, w = grid
    uh, uw = ref
    if max(uh, uw) > max_edge:
        raise ValueError(f"reference grid {ref} exceeds the RoPE table edge {max_edge}")
    fg = freqs_grid(head_dim, max_edge, base)
    rows = (torch.arange(h) * (uh / h)).reshape(h, 1).expand(h, w)
    cols = (torch.arange(w) * (uw / w)).reshape(1, w).expand(h, w)
    idx = torch.stack([rows, cols], dim=-1).round().int().reshape(-1, 2)
    return fg[:, idx[:, 0], idx[:, 1], :]


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x (..., L, head_dim) by table (2, L, head_dim // 2), in fp32."""
    shape = x.shape
    xp = x.float().reshape(*shape[:-1], -1, 2)
    cos, sin = table[0], table[1]
    out = torch.stack([cos * xp[..., 0] - sin * xp[..., 1], sin * xp[..., 0] + cos * xp[..., 1]], dim=-1)
    return out.reshape(shape)
