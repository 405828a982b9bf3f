"""`scalekv`: scale-aware KV-cache compression (drafter / refiner budgets per scale and block).

Method card
-----------
Paper:   Memory-Efficient Visual Autoregressive Modeling with Scale-Aware KV Cache Compression
         (Li et al., arXiv 2505.19602); code mobiushy/SpecuKV @ f515bb6 ("infer"): `scale_kv.py`
         (the selection, `ScaleKVCluster.update_kv`), `enable_scale_kv_{2b,8b}.py` (the budget
         loader and the self-attention patch), `infer_{2b,8b}_scale_kv.py` and
         `scripts/sample_kv_{2b,8b}.py` (the settings every released run uses), `budgets/*.json`
         (the 10% budgets for 2B and 8B: data of the release, NOT shipped here; download them and
         point `budget_file` at one).

Each step, and where it comes from (file:line in mobiushy/SpecuKV; each claim has a test):
 (1) AS RELEASED. When: after a block's self-attention at scale si has read the whole cache (this
     scale's K/V appended), the block's cache is compressed for later scales (`enable_scale_kv_2b.py:
     40-58`: `_original_forward` first, then `kv_cluster.update_kv` replaces `cached_k/v`). Nothing
     is compressed until a block's cache first exceeds `base_capacity` (`scale_kv.py:185-188`;
     every released run passes `max_capacity=650`, `infer_2b_scale_kv.py:104`), i.e. from scale 7
     (20x20, 921 cached positions) on the square 1M schedule; from then on at every scale.
 (2) AS RELEASED. Budgets: `budgets/<model>_10%_budget.json` gives per "Scale N" a "Max", a "Min" and
     per "Block b" a 1 (a drafter: keeps Max positions) or 0 (a refiner: keeps Min)
     (`enable_scale_kv_2b.py:9-31`: `cache = max_cache if value == 1 else min_cache`). Scale si reads
     entry "Scale si+2" (`scale_kv.py:197`: `cache_sizes_idx = scale_ind_for_capacity + 2`), except
     si = 12, which reads si 11's entry (`scale_kv.py:191-193`, hard-coded 12); so the released files'
     "Scale 9".."Scale 13" cover scales 7..12 of the 13-scale schedule. A block holding no more than
     its budget keeps everything (`scale_kv.py:207-208`).
 (3) AS RELEASED. Selection (per batch row, cond and uncond rows apart, and per head): the window is
     the 4x4 grid of patch centres of the current scale (window_size 16: centre i*(H//4) +
     (H//4-1)//2; `scale_kv.py:33-90`), always kept; its 16 tokens' raw queries (`mat_qkv(x)`: the
     SA input's projection WITHOUT q bias, cosine normalisation or RoPE, `enable_scale_kv_2b.py:48-50`)
     score every cached key (`q k^T / sqrt(head_dim)`, the window keys masked to -inf, summed over
     the 16 queries without softmax), the scores are max-pooled over the key axis (kernel 5,
     padding 2, stride 1), and the top (budget - 16) positions outside the window are kept, with the
     window, in ascending order (`scale_kv.py:245-290`). Evicted positions are gone for good.
     A scale too small for the grid (H < 4) takes the last 16 cached positions as its window
     (`scale_kv.py:56-65`); a budget below the window keeps only the window (`scale_kv.py:222-226`).
 (4) AS RELEASED. Settings: window 16, kernel 5, maxpool, base capacity 650, for 2B and 8B alike
     (`infer_8b_scale_kv.py:108`, `scripts/sample_kv_8b.py:85`).

Reconstructed / ours (each stated where it applies):
 - The grid: the release reads the current scale's size from a hard-coded list of the SQUARE 1M
   schedule's token counts (`scale_kv.py:30`, `self.SCALE`), so on any other schedule it places
   the window in the wrong positions. We use the schedule's own (h, w) (patch centres at
   i*(h//4) + (h//4-1)//2, j*(w//4) + (w//4-1)//2; the fallback when h or w < 4): identical on the
   square 1M schedule, the generalisation elsewhere (toy schedule, other aspect ratios).
 - Strict budget loading (below): where the release would crash (a compressing scale with no
   entry: `len(None)`; a missing block: KeyError) or silently misread (a 40-block file on a 32-block
   model), loading raises a ConfigError naming the file and the fix.
 - The last scale: the release compresses after it too; nothing reads that cache, so we skip it
   (the same images, less work).
 - The release recomputes the whole q, k, v projection of the scale for the 16 window queries
   (`self.mat_qkv(x)` on every token); we project only the 16 (same values).
 - Composition (`compose`): where another member's plan pruned this scale's K/V (FastVAR / NOVA with
   prune_kv) the window keys may not be in the cache; the selection then keeps the top n_keep of all
   positions by the same pooled scores (window queries still from the grid centres); a block skipped
   at a scale evicts nothing there. The budgets' lengths are planned on the full schedule's lengths.

Memory (ours: the release keeps `torch.cat` results, whose memory is whatever the allocator holds):
each block's own cache holds the most positions it keeps BETWEEN scales under these budgets
(`kv_capacity`), and one staging buffer shared by all blocks holds a block's kept positions plus the
current scale's tokens while it attends and selects (`varbench.engine.kv_cache.KVCache`; blocks run one
after another, so one buffer serves them all). `KVCache.nbytes()["allocated"]` (own buffers + the
staging buffer; `varbench.engine.kv_cache.analytic_kv_bytes` without a run) is then, at 1024^2 with
CFG, 11.9% of the full cache on 2B with the released 10% file (the block that drafts at the 48x48
scale keeps 6,385, the one drafting until 32x32 keeps 4,100, the 30 refiners the 632 of the 20x20
scale; staging 6,385 + 4,096 = 10,481) and 12.4% on 8B (3 drafters keep 6,200, 37 refiners 629;
staging 10,296): 44.1 -> 5.2 GB (2B) and 96.5 -> 12.0 GB (8B) at batch 8, bf16. The release holds
~10% between its scales; static per-block sizes (CUDA graphs) cost the difference: a block is
sized to the most it ever keeps (the refiners' 632 of the first compressed scale, not the 420-465
of later ones). The last scale appends into the staging buffer and evicts nothing (nothing reads
the cache after it): its K/V are read there and dropped.

Knobs: `ScaleKVKnobs` below.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F

from varbench.core.errors import ConfigError
from varbench.engine.kv_cache import kv_staging_capacity
from varbench.engine.plan import GenerationContext, KVBudget, KVSelectContext, ScalePlan
from varbench.engine.policy import DocRow, MethodCard, Policy, RequiredFile
from varbench.policies.knobs import MethodKnobs, knob

# The released rule (mobiushy/SpecuKV @ f515bb6)
RELEASED_BASE_CAPACITY = 650   # infer_{2b,8b}_scale_kv.py, scripts/sample_kv_{2b,8b}.py: max_capacity=650
RELEASED_WINDOW = 16           # window_size=16 (a 4x4 grid)
RELEASED_KERNEL = 5            # kernel_size=5
RELEASED_POOLING = "maxpool"
SCALE_KEY_OFFSET = 2           # scale_kv.py:197  cache_sizes_idx = scale_ind_for_capacity + 2
LAST_SCALE_HARDCODED = 12      # scale_kv.py:191  if scale_ind == 12: scale_ind_for_capacity = 11
N_CACHE_SIZES = 14             # enable_scale_kv_2b.py:13  cache_sizes = [None] * 14 (index clamp: 13)
RELEASE_URL = "https://github.com/mobiushy/SpecuKV (budgets/2b_10%_budget.json, budgets/8b_10%_budget.json)"

_SCALE_KEY = re.compile(r"^Scale (\d+)$")
_BLOCK_KEY = re.compile(r"^Block (\d+)$")


@dataclass(frozen=True)
class ScaleBudget:
    """One "Scale N" entry of a budget file: Max (drafters), Min (refiners), which blocks draft."""

    max: int
    min: int
    drafters: tuple[bool, ...]     # per block: value 1 (keeps max) or 0 (keeps min)

    def capacity(self, block: int) -> int:
        return self.max if self.drafters[block] else self.min


def parse_budgets(data: Any, source: str) -> dict[int, ScaleBudget]:
    """The release's budget format -> {N: ScaleBudget} (N as in "Scale N"), checked strictly.

    Format (budgets/*.json): {"Scale N": {"Block 0": 0|1, ..., "Block D-1": 0|1, "High": <count of
    1s>, "Max": int, "Min": int, "Limit": int}}. "High" and "Limit" are informational in the release
    (never read); "High", when present, must equal the number of drafters (else the file is not
    what it claims). Raises ConfigError naming `source` and what to fix."""
    def bad(msg: str) -> ConfigError:
        return ConfigError(f"ScaleKV budgets {source}: {msg}. The format is the release's budgets/*.json "
                           f"({RELEASE_URL}): {{\"Scale N\": {{\"Block 0\": 0|1, ..., \"Max\": int, \"Min\": int}}}}")

    if not isinstance(data, Mapping):
        raise bad(f"the top level must be an object of \"Scale N\" entries, got {type(data).__name__}")
    out: dict[int, ScaleBudget] = {}
    for key, entry in data.items():
        m = _SCALE_KEY.match(str(key))
        if not m:
            raise bad(f"unknown key {key!r} (expected \"Scale N\")")
        if not isinstance(entry, Mapping):
            raise bad(f"{key!r} must be an object, got {type(entry).__name__}")
        blocks: dict[int, int] = {}
        for k, v in entry.items():
            bm = _BLOCK_KEY.match(str(k))
            if bm:
                if isinstance(v, bool) or v not in (0, 1):
                    raise bad(f"{key!r} {k!r} = {v!r}: a block is 1 (drafter, keeps Max) or 0 (refiner, keeps Min)")
                blocks[int(bm.group(1))] = int(v)
            elif k in ("Max", "Min", "High", "Limit"):
                if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "High" else 1):
                    raise bad(f"{key!r} {k!r} = {v!r} must be a {'non-negative' if k == 'High' else 'positive'} integer")
            else:
                raise bad(f"{key!r} has an unknown key {k!r} (expected \"Block b\", Max, Min, High, Limit)")
        for k in ("Max", "Min"):
            if k not in entry:
                raise bad(f"{key!r} has no {k!r}")
        if entry["Max"] < entry["Min"]:
            raise bad(f"{key!r}: Max={entry['Max']} < Min={entry['Min']} (drafters keep Max, refiners Min)")
        depth = len(blocks)
        if sorted(blocks) != list(range(depth)):
            missing = sorted(set(range(max(blocks, default=-1) + 1)) - set(blocks))
            raise bad(f"{key!r} lacks block(s) {missing} (blocks must be 0..D-1)")
        if "High" in entry and entry["High"] != sum(blocks.values()):
            raise bad(f"{key!r}: High={entry['High']} but {sum(blocks.values())} blocks are 1 (a corrupted or edited file)")
        out[int(m.group(1))] = ScaleBudget(int(entry["Max"]), int(entry["Min"]), tuple(bool(blocks[b]) for b in range(depth)))
    depths = {len(b.drafters) for b in out.values()}
    if len(depths) > 1:
        raise bad(f"the entries name different block counts {sorted(depths)}")
    return out


def load_budget_file(path: str) -> dict[int, ScaleBudget]:
    """A released budget file (strict: `parse_budgets`); ConfigError naming the file when it is
    missing or not JSON."""
    p = Path(path).expanduser()
    where = f"method.knobs.budget_file={path!r}"
    if not p.is_file():
        raise ConfigError(f"{where}: no such file. ScaleKV's budgets are data of its release, not shipped with "
                          f"varbench: download them from {RELEASE_URL} and set budget_file to the file's path "
                          "(2b_10%_budget.json for infinity_2b, 8b_10%_budget.json for infinity_8b)")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{where}: not a JSON budget file ({type(err).__name__}: {err}); download the release's "
                          f"file again from {RELEASE_URL}") from None
    return parse_budgets(data, f"file {str(p)!r}")


def window_positions(h: int, w: int, window_size: int, n_held: int) -> tuple[list[int], bool]:
    """The observation window of a (h, w) scale, as cache offsets from the scale's first position:
    (sorted positions, on_grid). On the grid: the g x g patch centres (g = sqrt(window_size)),
    centre i*(h//g) + (h//g - 1)//2 (scale_kv.py:67-78, with the schedule's own h, w; see the card).
    Off the grid (window_size not a square, or h or w < g): the last min(window_size, n_held) cached
    positions (scale_kv.py:48-65); offsets then may be negative (positions of earlier scales)."""
    g = math.isqrt(window_size)
    if g * g != window_size or h < g or w < g:
        m = min(window_size, n_held)
        return list(range(h * w - m, h * w)), False
    hp, wp = h // g, w // g
    pos = set()
    for i in range(g):
        for j in range(g):
            hc = max(0, min(h - 1, i * hp + (hp - 1) // 2))
            wc = max(0, min(w - 1, j * wp + (wp - 1) // 2))
            pos.add(hc * w + wc)
    return sorted(pos), True


def window_offsets(h: int, w: int, window_size: int, n_held: int, device) -> torch.Tensor:
    """`window_positions` as a device tensor built from aranges (it runs inside a scale step, where a
    tensor made from host data would be a host-to-device copy in a captured graph)."""
    g = math.isqrt(window_size)
    if g * g != window_size or h < g or w < g:
        m = min(window_size, n_held)
        return torch.arange(h * w - m, h * w, device=device)
    hp, wp = h // g, w // g
    hc = (torch.arange(g, device=device) * hp + (hp - 1) // 2).clamp(0, h - 1)
    wc = (torch.arange(g, device=device) * wp + (wp - 1) // 2).clamp(0, w - 1)
    return (hc[:, None] * w + wc[None, :]).reshape(-1)   # ascending and distinct (hp, wp >= 1)


@dataclass(frozen=True)
class ScaleKVSelector:
    """ScaleKV's selection (`scale_kv.py::update_kv`, card step 3) as a `KVSelector`. Frozen and
    hashable: CUDA-graph keys and per-image grouping read its fields."""

    window_size: int = RELEASED_WINDOW
    kernel_size: int = RELEASED_KERNEL
    pooling: str = RELEASED_POOLING

    def scores(self, ctx: KVSelectContext) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(pooled, window): the pooled scores (rows, H, L) the top-k reads (window positions at
        -inf), and the window's cache positions (m,), or None without a guaranteed window (pruned K/V)."""
        k = ctx.keys                                    # (rows, H, L, c)
        L, c = k.shape[2], k.shape[3]
        n = ctx.h * ctx.w
        offs = window_offsets(ctx.h, ctx.w, self.window_size, L, k.device)   # device ops only: no host copy in a step
        local = offs.clamp(0, n - 1)                    # scale_kv.py:250 clamp
        q = ctx.query_proj(local)                       # (rows, H, m, c): the raw window queries
        scores = torch.matmul(q.to(k.dtype), k.transpose(2, 3)) / math.sqrt(c)
        win = None
        if ctx.appended is None:   # the release: this scale's grid is the last n cache positions
            win = (offs + (L - n)).clamp(0, L - 1)
            keep_mask = torch.ones((1, 1, 1, L), dtype=torch.bool, device=k.device).index_fill(3, win, False)
            scores = scores.masked_fill(~keep_mask, float("-inf"))
        summed = scores.sum(dim=2)                      # (rows, H, L): no softmax, as released
        pool = F.avg_pool1d if self.pooling == "avgpool" else F.max_pool1d
        pooled = pool(summed, self.kernel_size, padding=self.kernel_size // 2, stride=1)
        if win is not None:
            pooled = pooled.scatter(2, win.expand(*pooled.shape[:2], -1), float("-inf"))
        return pooled, win

    def __call__(self, ctx: KVSelectContext) -> torch.Tensor:
        pooled, win = self.scores(ctx)
        if win is None:            # ours (pruned K/V under compose): no window key is guaranteed
            return pooled.topk(ctx.n_keep, dim=-1).indices.sort(dim=-1).values
        rows, heads = pooled.shape[:2]
        window = win.expand(rows, heads, -1)
        rest = ctx.n_keep - win.shape[0]
        if rest <= 0:              # a budget at or below the window keeps the window (scale_kv.py:222-226)
            return window.clone()
        chosen = pooled.topk(rest, dim=-1).indices
        return torch.cat([chosen, window], dim=-1).sort(dim=-1).values


@dataclass(frozen=True)
class ScaleKVKnobs(MethodKnobs, method="scalekv"):
    """ScaleKV's knobs (where each rule comes from: the card above), and what each trades:

    budget_file    path to a released budget file (budgets/2b_10%_budget.json or 8b_10%_budget.json
                   of mobiushy/SpecuKV; not shipped: download it). Loaded strictly. Fewer kept
                   positions in the file -> less memory, lower fidelity to the full-cache image.
    budgets        the same data inline ({"Scale N": {"Block b": 0|1, "Max": ..., "Min": ...}}), for
                   schedules the released files do not cover (the toy model); exactly one of the two.
    base_capacity  no block evicts anything until its cache first holds more than this many positions
                   (released 650: from the 20x20 scale on the 1M schedule). Lower -> compression starts
                   at coarser scales (more memory saved, more risk); at or above the schedule's total
                   token count nothing is ever evicted (the neutral setting).
    window_size    observation window: this many queries of the current scale (a g x g grid of patch
                   centres, g = sqrt) score the cache, and their keys are always kept (released 16).
                   Larger -> better-informed selection, more of the budget spent on the window.
    kernel_size    width of the pooling over the key axis (released 5): larger keeps neighbourhoods of
                   high-scoring keys together (smoother selection), smaller keeps isolated peaks.
    pooling        maxpool (released) | avgpool.
    """
    budget_file: Optional[str] = knob(None)
    budgets: Optional[Mapping[str, Any]] = knob(None)
    base_capacity: int = knob(RELEASED_BASE_CAPACITY, ge=1)
    window_size: int = knob(RELEASED_WINDOW, ge=1)
    kernel_size: int = knob(RELEASED_KERNEL, ge=1)
    pooling: str = knob(RELEASED_POOLING, choices=("maxpool", "avgpool"))


def budget_key(si: int) -> int:
    """The "Scale N" entry scale si reads (card step 2): N = si + 2, si 12 reads si 11's, clamped to
    the release's 14-slot table (scale_kv.py:191-201)."""
    s = LAST_SCALE_HARDCODED - 1 if si == LAST_SCALE_HARDCODED else si
    return max(0, min(s + SCALE_KEY_OFFSET, N_CACHE_SIZES - 1))


class ScaleKV(Policy):
    name = "scalekv"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='ScaleKV', colour='#332288', marker='o',
        paper='Memory-Efficient Visual Autoregressive Modeling with Scale-Aware KV Cache Compression (Li et '
              'al., arXiv 2505.19602)',
        code='mobiushy/SpecuKV @ f515bb6',
        reconstructed=('the window grid on schedules other than square 1M',
                       'strict budget loading',
                       'the selection where a composed member pruned K/V'),
        doc_rows=(DocRow('`scalekv`',
                         source='mobiushy/SpecuKV @ f515bb6 (code; the budget files are not shipped)',
                         changes='per scale and block, keeps a drafter or refiner budget of cached K/V '
                                 'positions (the 4x4 grid of patch centres plus the top max-pooled query '
                                 'scores); memory, not compute',
                         reconstructed='the grid on schedules other than square 1M; the selection where a '
                                       'composed member pruned K/V',
                         flops=('– (a memory method)', '–')),))
    Knobs = ScaleKVKnobs
    #: the cache never exceeds the base capacity on the tiny runtime's '0.06M' (521 tokens): no eviction
    NEUTRAL = {"budgets": {}, "base_capacity": 10**9}
    #: compression from the 8x8 scale on (cumulative 121 > 64) with a toy-size budget, on the tiny runtime
    ACTIVE = {"base_capacity": 64, "budgets": {
        f"Scale {n}": {**{f"Block {b}": int(b == 0) for b in range(4)}, "Max": mx, "Min": mn}
        for n, mx, mn in ((6, 96, 48), (7, 160, 64), (8, 200, 80))}}

    @classmethod
    def required_files(cls, knobs: Mapping[str, Any]) -> list[RequiredFile]:
        """The released budget file `budget_file` names (data of the release, not shipped)."""
        budget = (knobs or {}).get("budget_file")
        if not budget:
            return []
        path = Path(str(budget)).expanduser()
        return [RequiredFile(f"ScaleKV budget file {path.name}", str(path.resolve()), RELEASE_URL, knob="budget_file",
                             present=path.is_file())]

    def __init__(self, **knobs: Any):
        kn = ScaleKVKnobs(**knobs)
        if (kn.budget_file is None) == (kn.budgets is None):
            raise ConfigError("scalekv needs exactly one budget source: method.knobs.budget_file (a released budgets/*.json, "
                              f"downloaded from {RELEASE_URL}) or method.knobs.budgets (the same data inline)"
                              + ("; both are set" if kn.budget_file is not None else "; neither is set"))
        self.budget_file = kn.budget_file
        # a file that is there is read (and checked) now; a missing one is named by the preflight
        # (varbench.harness.preflight) and raised when the policy first plans, as SkipVAR's decision models
        self._budgets = (parse_budgets(dict(kn.budgets), "method.knobs.budgets") if kn.budget_file is None
                         else load_budget_file(kn.budget_file) if Path(str(kn.budget_file)).expanduser().is_file()
                         else None)
        self.source = kn.budget_file if kn.budget_file is not None else "inline"
        self.base_capacity, self.window_size = int(kn.base_capacity), int(kn.window_size)
        self.kernel_size, self.pooling = int(kn.kernel_size), kn.pooling
        self.selector = ScaleKVSelector(self.window_size, self.kernel_size, self.pooling)

    @property
    def budgets(self) -> dict[int, ScaleBudget]:
        """The budgets by release scale number (the file's, read on first use when it was absent)."""
        if self._budgets is None:
            self._budgets = load_budget_file(self.budget_file)
        return self._budgets

    # -- per generation ---------------------------------------------------------------------
    def reset(self, ctx: GenerationContext) -> None:
        """Plan the whole generation's budgets from the schedule (the release's lengths are static):
        per scale, the blocks that evict and how many positions they keep; per block, its peak."""
        super().reset(ctx)
        depth = ctx.depth
        for n, b in self.budgets.items():
            if len(b.drafters) != depth:
                raise ConfigError(f"ScaleKV budgets ({self.source}): \"Scale {n}\" names {len(b.drafters)} blocks but the "
                                  f"model has {depth}; use the budget file made for this model (2b_10%_budget.json: 32 "
                                  "blocks, 8b_10%_budget.json: 40)")
        held = [0] * depth
        between = [0] * depth       # per block: the most it keeps from one scale to the next
        reached = [False] * depth   # scale_kv.py has_reached_base, per block (one cluster per layer)
        self.keeps: dict[int, dict[int, int]] = {}
        self.drafters: dict[int, list[int]] = {}
        last = len(ctx.schedule) - 1
        for si, (h, w) in enumerate(ctx.schedule):
            keeps = {}
            for b in range(depth):
                held[b] += h * w
                if held[b] <= self.base_capacity and not reached[b]:
                    continue
                reached[b] = si != LAST_SCALE_HARDCODED
                key = budget_key(si)
                entry = self.budgets.get(key)
                if entry is None:   # the release: cache_sizes[key] is None -> TypeError
                    raise ConfigError(f"ScaleKV budgets ({self.source}) have no \"Scale {key}\" entry, which scale {si} "
                                      f"({h}x{w}, {held[b]} cached positions > base_capacity {self.base_capacity}) reads; "
                                      "add the entry or raise method.knobs.base_capacity")
                cap = entry.capacity(b)
                if held[b] <= cap:
                    continue
                m = len(window_positions(h, w, self.window_size, held[b])[0])
                keep = max(cap, m)   # a budget below the window keeps the window (scale_kv.py:222-226)
                if si != last:       # nothing reads the cache after the last scale
                    keeps[b] = keep
                held[b] = keep
            if si != last:
                between = [max(a, hb) for a, hb in zip(between, held)]
            if keeps:
                self.keeps[si] = keeps
                self.drafters[si] = [b for b in keeps if self.budgets[budget_key(si)].drafters[b]]
        self._capacity = between
        self._window_q = {si: len(window_positions(h, w, self.window_size, 1 << 30)[0])
                          for si, (h, w) in enumerate(ctx.schedule)}

    def plan(self, si: int) -> ScalePlan:
        keeps = self.keeps.get(si)
        if not keeps:
            return ScalePlan()
        q = self._window_q[si]
        return ScalePlan(kv={b: KVBudget(n_keep=k, selector=self.selector, sel_queries=q) for b, k in keeps.items()})

    def kv_capacity(self) -> Optional[list[int]]:
        """Per block the most positions it keeps between scales (the runtime stages the scales that
        overflow it, `varbench.engine.kv_cache.KVCache`); None when nothing is ever evicted (the
        baseline's cache, bit for bit)."""
        return list(self._capacity) if self.keeps else None

    def stats(self) -> dict[str, Any]:
        full = sum(h * w for h, w in self.ctx.schedule)
        caps = self.kv_capacity()
        staging = kv_staging_capacity(caps, self.ctx.schedule)
        held = full * self.ctx.depth if caps is None else sum(caps) + staging
        return {"budget": self.source, "active": bool(self.keeps),
                "evicting_scales": sorted(self.keeps), "drafters": {int(s): d for s, d in sorted(self.drafters.items())},
                "capacity": caps, "staging": staging, "capacity_fraction": held / (full * self.ctx.depth)}

    def no_effect_reason(self) -> Optional[str]:
        if self.keeps:
            return None
        full = sum(h * w for h, w in self.ctx.schedule)
        if full <= self.base_capacity:
            return (f"scalekv: the cache never exceeds base_capacity={self.base_capacity} (the schedule holds {full} "
                    "positions), so nothing is evicted")
        return f"scalekv: every budget ({self.source}) holds the whole cache of its scale, so nothing is evicted"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "budget": self.source, "base_capacity": self.base_capacity,
                "window_size": self.window_size, "kernel_size": self.kernel_size, "pooling": self.pooling}


def synthetic_budgets(schedule, depth: int, *, base_capacity: int = RELEASED_BASE_CAPACITY, drafters=(0,),
                      refiner_keep: float = 0.1, drafter_slack: int = 8) -> dict:
    """A budget in the release's format for any (schedule, depth), shaped like the released 10% files
    (OURS, for dry runs and tests; not the release's data): drafters keep all but `drafter_slack` of
    the positions they hold, refiners `refiner_keep` of the schedule's tokens, on every scale the
    release's rule compresses (from the first whose cache exceeds `base_capacity`)."""
    total = sum(h * w for h, w in schedule)
    mn = max(RELEASED_WINDOW, int(refiner_keep * total))
    out, held_d, reached = {}, 0, False
    for si, (h, w) in enumerate(schedule):
        held_d += h * w
        if held_d <= base_capacity and not reached:
            continue
        reached = True
        key = budget_key(si)
        mx = max(mn, held_d - drafter_slack)
        out.setdefault(f"Scale {key}", {**{f"Block {b}": int(b in drafters) for b in range(depth)},
                                        "High": sum(1 for b in range(depth) if b in drafters), "Max": mx, "Min": mn})
        held_d = min(held_d, out[f"Scale {key}"]["Max"])
    return out
