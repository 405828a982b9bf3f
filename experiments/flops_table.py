"""Analytic FLOPs of every method config relative to the baseline, from plans alone (no weights).

    python -m experiments.flops_table                    # Infinity-2B, 1024², batch 1, CFG on
    python -m experiments.flops_table --model infinity_8b --methods fastvar nova
    python -m experiments.flops_table --model hart_0p7b                      # HART-0.7B, 1024², batch 1

Static methods (baseline, fastvar, skip baselines) have exact counts. Adaptive methods (NOVA,
ToProVAR) depend on what the model's entropies do, so this script drives them with a stated
synthetic scenario (below) and the numbers are "FLOPs under that scenario", not predictions:

  NOVA      mean predictive entropy grows by 0.1 per scale until the activation scale, by 0.05 at
            it, then 0.01 per scale (so the moving-average rule fires there; default: 16², the
            earliest it may); per-layer attention entropies equal (no layer-linkage effect).
  ToProVAR  the low-entropy fraction rho crosses tau = 0.4 at D (default: 32², where the paper's
            scale-only speed-up implies it lands); at the SVD scale, the first 3 and last 4 blocks
            look Global (a dominant component), the rest Detail (the paper's HART observation);
            token entropy maps are ramps, i.e. uniformly spread normalised entropies.
  SparseVAR the residual change over its block range is a ramp over the grid (uniformly spread), so
            40% of the tokens exceed 0.6 of the largest: every pruned scale (40², 48², 64²) keeps
            int(0.4 L) tokens in every block. (Its recovered / zeroed split does not change FLOPs.)

On HART-0.7B (`--model hart_0p7b`, 14 stages 1..64, 1024² only) the same signals, at the same grids:
NOVA activates at 16² (stage 8: its t_min_tokens 256 is 16² on both models, so 16² is again the
earliest it may), and ToProVAR's D is 36² (stage 11). HART has no 32² stage. The scenario places D
by grid size, as the methods' own thresholds are sizes (t_min_tokens, d_min_tokens: token counts, not
stage positions) and the entropies follow how settled the image is at a resolution (32² is half the
final edge on Infinity): the first HART stage at least 32² is 36². Reading D as a position from the
end instead (Infinity's 32² is 4th from last) gives 27², stage 10: `--toprovar-depth 10`.
Stage 0 is HART's text context (300 positions, run in full; a policy's count for it is 1 token on the
1x1 grid). The policies see the runtime's HART context (`backbone="hart"`, guidance 4.5, the release's
default). Presets that do not apply to HART (a YAML `refuse: {hart: ...}`, a policy class without "hart"
in `backbones`, or knobs the policy refuses there) are listed as refused, with the reason, not counted.

Two counts per config. "transformer": what flops.py counts (linear layers, attention products,
head, word embedding, the transformer's text projections, the attention-entropy score pass),
the part methods change. "end to end": that plus flan-t5-xl over its 512 padded tokens and one
VAE decode at the final latent grid (varbench/engine/stage_flops.py), which every method runs unchanged;
per image, batch 1, no negative prompt. SkipVAR's two small feature decodes are in neither.
On HART, "transformer" is what varbench/engine/backbones/hart/flops.py counts (the blocks over the text
context and every stage, the head, the word embedding and phi convs, the residual diffusion head at the
last stage, the context projection) from `hart_plan_trace`, which builds the entries `HartState.step`
records (tests/engine/test_hart_runtime.py: equal to a real generation's `out.flops`); "end to end"
adds the Qwen2-1.5B text model over the system prompt (131 tokens, the lower bound of the release's
131-140: `HART_SYSTEM_PROMPT_TOKENS`) + the 300 padded prompt tokens, and the tokenizer decoder on the
64x64 f_hat (stage_flops `preset_stage_flops("hart_0p7b")`).

Every FLOPs number in the docs comes from here: `--write` regenerates
`results/curated/flops_analytic.md` and every marker in `docs/methods.md`,

    <!--flops:PRESET-->4.23<!--/flops-->            2B, the preset as configured, transformer only
    <!--flops:8b:PRESET-->3.63<!--/flops-->         8B, transformer only
    <!--flops:e2e:PRESET-->3.30<!--/flops-->        2B end to end (8b:e2e:PRESET for 8B)
    <!--flops:hart:PRESET-->2.10<!--/flops-->       HART-0.7B, transformer only (hart:e2e:PRESET end to end;
                                                      a preset refused on HART is an error there)
    <!--flops:PRESET|knob=value|...-->2.81<!--/flops-->   the preset with knobs overridden (YAML values;
                                                      write \\| for | inside a markdown table cell)

and `--check` (run by tests/engine/test_flops_docs.py) lists every place that no longer matches.

`--memory` prints the analytic KV cache (varbench/engine/memory.py) of every preset for 2B and 8B
at batch 1 and 8, from the same plans: the buffers allocated and the most positions in use. KV-budget
presets (ScaleKV and its compositions, `MEMORY_METHODS`) size each block's buffer to what it keeps
between scales plus one shared staging buffer (the runtime's rule: `kv_plan_bytes(..., staging=)`
equals `varbench.engine.kv_cache.analytic_kv_bytes`). ScaleKV's released budget files are not in the
repo: `--budgets DIR` reads them from DIR (2b_10%_budget.json, 8b_10%_budget.json, as released);
without it a preset whose file is absent runs on `varbench.policies.scalekv.synthetic_budgets` of
the released shape (OURS: drafter block 0, refiners at 10%), and the output says so per row.
"""
from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path

import yaml

import torch

from varbench.engine.backbones import preset_stage_flops
from varbench.engine.backbones.hart.flops import hart_plan_trace, hart_scale_flops, hart_text_flops
from varbench.engine.backbones.hart.model import HART_PRESETS
from varbench.engine.backbones.hart.stage_flops import HART_MAX_LENGTH, HART_SYSTEM_PROMPT_TOKENS
from varbench.engine.backbones.infinity.flops import scale_flops, text_flops
from varbench.engine.backbones.infinity.memory import weights_bytes
from varbench.engine.backbones.infinity.model import PRESETS
from varbench.engine.backbones.infinity.schedules import scale_schedule
from varbench.engine.flops import plan_trace
from varbench.engine.kv_cache import kv_staging_capacity
from varbench.engine.memory import kv_plan_bytes
from varbench.engine.plan import GenerationContext, ScaleSignals
from varbench.engine.stage_flops import T5_MAX_LENGTH
from varbench.harness.config import preset_refusal
from varbench.harness.presets import method_set, resolve_method
from varbench.policies import build_policy
from varbench.policies.scalekv import synthetic_budgets

ROOT = Path(__file__).resolve().parents[1]
#: a user's own config folders (`--config-dir`, as `python -m varbench --config-dir` takes them): their
#: method presets resolve here as in a job
CONFIG_DIRS: tuple[str, ...] = ()
TABLE = ROOT / "results" / "curated" / "flops_analytic.md"
DOCS = [ROOT / "docs" / "methods.md"]
MODELS = {"2b": "infinity_2b", "8b": "infinity_8b"}
HART_MODEL = "hart_0p7b"
#: a marker's model key -> the model preset
MARKER_MODELS = {**MODELS, "hart": HART_MODEL}
#: the table's rows (2B and 8B columns): conf/method_set/flops_table/infinity_2b.yaml
DEFAULT_METHODS = method_set("flops_table", "infinity_2b")
#: the memory rows `--memory` adds to DEFAULT_METHODS: ScaleKV (2B and 8B budgets) and its compositions
MEMORY_METHODS = method_set("kv_memory", "infinity_2b")
MARKER = re.compile(r"<!--flops:(?:(?P<model>2b|8b|hart):)?(?:(?P<scope>e2e):)?(?P<preset>\w+)"
                    r"(?P<knobs>(?:\\?\|[\w]+=[^|>\\]+)*)-->(?P<value>.*?)<!--/flops-->")  # \| inside a table cell
#: text_len: cross-attention tokens per prompt (the transformer's count); t5_tokens: the positions the
#: T5 encoder computes (its padded length, whatever the prompt's; end-to-end count only)
SCENARIO = dict(pn="1M", h_div_w=1.0, batch=1, text_len=32, nova_act=6, topro_D=9, t5_tokens=T5_MAX_LENGTH)
#: HART (module docstring): NOVA at stage 8 (16²), ToProVAR's D at stage 11 (36²); guidance 4.5 (the release's
#: default); qwen2_tokens: the positions the Qwen2 text model computes per prompt (end-to-end count only)
HART_SCENARIO = dict(batch=1, nova_act=8, topro_D=11, cfg=4.5, qwen2_tokens=HART_SYSTEM_PROMPT_TOKENS + HART_MAX_LENGTH)
#: the rows of the HART table: every default row (the refused ones say why) + FastVAR's HART port, and the
#: adaptive SkipVAR and ScaleKV, refused on HART (conf/method_set/flops_table/hart_0p7b.yaml)
HART_METHODS = method_set("flops_table", HART_MODEL)


def resolved(name: str, model: str | None = None):
    """The method ``name`` (a preset, a registered method or ``module:Class``) as a job on ``model`` runs it
    (`varbench.harness.presets.resolve_method`, with the `--config-dir` folders)."""
    return resolve_method(name, model=model, config_dirs=CONFIG_DIRS)


def load_method(name: str, model: str | None = None) -> tuple[str, str, dict]:
    """(policy name, display name, knobs) of the method ``name`` (:func:`resolved`)."""
    r = resolved(name, model)
    return r.name, r.display_name, r.knobs


def scenario_signals(ctx: GenerationContext, si: int, attn_blocks, nova_act: int, topro_D: int, svd_scale: int,
                     change_ranges=()):
    """Scale si's signals under the scenario (module docstring); on either backbone (stage 0 of HART is its
    1x1 grid to a policy, as the runtime reports it). `change_ranges`: the block ranges whose residual
    change the plan asked for (SparseVAR: a ramp over the grid, in every row)."""
    h, w = ctx.schedule[si]
    L = h * w
    growth = lambda s: 0.1 if s < nova_act else (0.05 if s == nova_act else 0.01)  # noqa: E731
    H = sum(growth(s) for s in range(1, si + 1))
    ramp = torch.linspace(-0.01, 0.01, L)
    ent = (H + ramp).expand(ctx.batch, L).clone()
    attn = {}
    for b in attn_blocks:
        if si == svd_scale and (b < 3 or b >= ctx.depth - 4):
            m = torch.outer(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w)).reshape(L)  # one dominant component
        else:
            m = torch.linspace(0, 1, L)
            m = m[torch.randperm(L, generator=torch.Generator().manual_seed(si * 1000 + b))]
            # rho = fraction below the mean: 0.3 before D, 0.5 from D on
            if si < topro_D and si != svd_scale:
                m = torch.where(torch.arange(L) < int(0.3 * L), torch.zeros(L), torch.ones(L))
        attn[b] = m.expand(ctx.rows, L).clone()
    change = {r: torch.linspace(0, 1, L).expand(ctx.rows, L).clone() for r in change_ranges}
    return ScaleSignals(scale=si, h=h, w=w, token_entropy=ent, logits=torch.zeros(ctx.batch, L, 1, 2), cond_logits=None,
                        attention_entropy=attn, attention_query_index={}, executed_tokens={}, tau=1.0, cfg=ctx.cfg[si],
                        residual_change=change)


def scenario_context(model: str, h_div_w: float, pn: str, batch: int) -> GenerationContext:
    cfg = PRESETS[model]
    sched = tuple(scale_schedule(h_div_w, pn))
    return GenerationContext(schedule=sched, depth=cfg.depth, embed_dim=cfg.embed_dim, num_heads=cfg.num_heads,
                             batch=batch, cfg_rows=True, cfg=(4.0,) * len(sched), tau=(1.0,) * len(sched))


def with_budgets(name: str, knobs: dict, model: str, budgets_dir=None) -> tuple[dict, list[str]]:
    """The knobs with every ScaleKV member's budget file resolved: from `budgets_dir` (the file's name
    there) when given, else the preset's path; where that file is absent, inline
    `synthetic_budgets` of the released shape for `model` on the scenario's schedule. Returns the
    knobs and, per member, where its budget came from ("file PATH" or "synthetic (...)")."""
    sources: list[str] = []

    def fix(n: str, kn: dict) -> dict:
        if n == "compose":
            members = []
            for m in kn.get("policies", []):
                if m["name"] == "skipvar":   # adaptive: its decision needs real codes (see `method_memory`)
                    sources.append("skipvar as its no-skip action (skipvar_fixed skip_last 0)")
                    members.append({"name": "skipvar_fixed", "knobs": {"skip_last": 0}})
                else:
                    members.append({**m, "knobs": fix(m["name"], dict(m.get("knobs") or {}))})
            return {**kn, "policies": members}
        if n != "scalekv" or kn.get("budget_file") is None:
            if n == "scalekv":
                sources.append("inline (the preset's)")
            return kn
        path = Path(kn["budget_file"])
        if budgets_dir is not None:
            path = Path(budgets_dir) / path.name
        if path.is_file():
            sources.append(f"file {path}")
            return {**kn, "budget_file": str(path)}
        cfg = PRESETS[model]
        sched = scale_schedule(SCENARIO["h_div_w"], SCENARIO["pn"])
        sources.append(f"synthetic (no {path}: varbench.policies.scalekv.synthetic_budgets, released shape)")
        return {**{k: v for k, v in kn.items() if k != "budget_file"},
                "budgets": synthetic_budgets(sched, cfg.depth, base_capacity=kn.get("base_capacity", 650))}

    return fix(name, dict(knobs)), sources


def hart_scenario_context(cfg, batch: int, guidance: float = HART_SCENARIO["cfg"]) -> GenerationContext:
    """The context `HartRuntime.generate` resets a policy with: HART's patch_nums as square grids, CFG rows."""
    sched = tuple((p, p) for p in cfg.patch_nums)
    return GenerationContext(schedule=sched, depth=cfg.depth, embed_dim=cfg.embed_dim, num_heads=cfg.num_heads,
                             batch=batch, cfg_rows=True, cfg=(guidance,) * len(sched), tau=(1.0,) * len(sched),
                             backbone="hart")


def scenario_plans(name: str, knobs: dict, ctx: GenerationContext, nova_act: int, topro_D: int):
    """The built policy, reset for `ctx`, and its plan for every scale, each run scale observed under the
    scenario's signals (`scenario_signals`)."""
    pol = build_policy(name, **knobs)
    pol.reset(ctx)
    svd_scale = getattr(pol, "svd_si", 5) if name == "toprovar" else 5
    plans = []
    for si in range(len(ctx.schedule)):
        p = pol.plan(si)
        plans.append(p)
        if p.run:
            pol.observe(si, scenario_signals(ctx, si, p.attention_entropy_for, nova_act, topro_D, svd_scale,
                                             p.residual_change_for))
    return pol, plans


def method_trace(name: str, knobs: dict, model: str, h_div_w: float, pn: str, batch: int, text_len: int,
                 nova_act: int, topro_D: int, policy=None) -> tuple[list[dict], dict]:
    """The trace the runtime would record for the method's plans under the scenario (`plan_trace`),
    and the policy's stats. `policy`: a list the built policy and its plans are appended to."""
    cfg = PRESETS[model]
    ctx = scenario_context(model, h_div_w, pn, batch)
    sched = ctx.schedule
    pol, plans = scenario_plans(name, knobs, ctx, nova_act, topro_D)
    tt = {2 * batch: 2 * batch * text_len, batch: batch * text_len}
    if policy is not None:
        policy += [pol, plans]
    return plan_trace(sched, plans, cfg.depth, batch, True, tt), pol.stats()


def hart_method_trace(name: str, knobs: dict, cfg, batch: int, nova_act: int, topro_D: int,
                      guidance: float = HART_SCENARIO["cfg"]) -> tuple[list[dict], dict]:
    """HART: the trace `HartRuntime.generate` would record for the method's plans under the scenario
    (`hart_plan_trace`; `cfg` a HartConfig), and the policy's stats."""
    pol, plans = scenario_plans(name, knobs, hart_scenario_context(cfg, batch, guidance), nova_act, topro_D)
    return hart_plan_trace(cfg, plans, batch), pol.stats()


def hart_method_flops(name: str, knobs: dict, cfg, batch: int, nova_act: int, topro_D: int,
                      guidance: float = HART_SCENARIO["cfg"]) -> tuple[float, dict]:
    """HART: the batch's transformer FLOPs (as `out.flops["total"]`) under the scenario, and the policy's stats."""
    trace, stats = hart_method_trace(name, knobs, cfg, batch, nova_act, topro_D, guidance)
    return hart_text_flops(cfg, 2 * batch) + sum(hart_scale_flops(cfg, tr) for tr in trace), stats


@functools.lru_cache(maxsize=None)
def hart_refusal(preset: str) -> str | None:
    """Why a method preset does not run on HART (None: it does): the YAML's `refuse: {hart: ...}` or a
    policy class without "hart" in `backbones` (`preset_refusal`, as the harness refuses it), else the
    built policy's knob-dependent `backbone_refusal` (NOVA's per-bit entropy variants)."""
    reason = preset_refusal(resolved(preset, HART_MODEL).config, "hart", HART_MODEL)
    if reason:
        return reason
    name, _, knobs = load_method(preset, HART_MODEL)
    return build_policy(name, **knobs).backbone_refusal("hart")


def method_flops(name: str, knobs: dict, model: str, h_div_w: float, pn: str, batch: int, text_len: int,
                 nova_act: int, topro_D: int) -> tuple[float, dict]:
    trace, stats = method_trace(name, knobs, model, h_div_w, pn, batch, text_len, nova_act, topro_D)
    cfg = PRESETS[model]
    total = text_flops(cfg, 2 * batch * text_len, 2 * batch) + sum(scale_flops(cfg, tr) for tr in trace)
    return total, stats


def method_memory(preset: str, model: str, batch: int, dtype: torch.dtype = torch.bfloat16, budgets_dir=None) -> dict:
    """Analytic memory of one generation of `batch` images under the preset (default scenario,
    bf16 as on the GPU; varbench/engine/memory.py): KV-cache bytes allocated and the most in use,
    the weights (transformer + VAE), and where a ScaleKV budget came from (`with_budgets`). SkipVAR's
    adaptive decision reads the decoded codes, which a plan-only count has not: as a composition
    member it runs as its no-skip action, the largest KV in use of its actions (allocated is the same
    for all of them: skipping and dropping rows never shrink preallocated buffers). A KV
    budget (`ScalePlan.kv`) sizes each block's buffer to `Policy.kv_capacity` (never above the
    schedule, as the runtime) plus the staging buffer those capacities need."""
    name, _, knobs = load_method(preset, model)
    knobs, sources = with_budgets(name, knobs, model, budgets_dir)
    built: list = []
    trace, _ = method_trace(name, knobs, model, SCENARIO["h_div_w"], SCENARIO["pn"], batch, SCENARIO["text_len"],
                            SCENARIO["nova_act"], SCENARIO["topro_D"], policy=built)
    pol, plans = built
    sched = scale_schedule(SCENARIO["h_div_w"], SCENARIO["pn"])
    full = sum(h * w for h, w in sched)
    caps = pol.kv_capacity()
    caps = None if caps is None else [min(full, int(c)) for c in caps]
    budget = {(si, b): kb.n_keep for si, p in enumerate(plans) if p.run for b, kb in p.kv.items()}
    kv = kv_plan_bytes(PRESETS[model], trace, dtype, capacity=caps, budget=budget or None,
                       staging=kv_staging_capacity(caps, sched))
    return {"kv_allocated": kv.allocated, "kv_used_peak": kv.used_peak, "weights": _weights(model, dtype),
            "staging": kv.staging, "budgets": sources, "knobs": knobs, "name": name}


@functools.lru_cache(maxsize=None)
def _weights(model: str, dtype: torch.dtype) -> int:
    return sum(weights_bytes(PRESETS[model], dtype).values())


def _fits(preset: str, model: str) -> bool:
    """Whether a memory preset's budget is made for `model` (the *_8b ScaleKV presets for 8B only,
    the others for 2B); presets without a ScaleKV budget fit both."""
    if preset not in MEMORY_METHODS:
        return True
    return preset.endswith("_8b") == (model == "infinity_8b")


def render_memory(methods=DEFAULT_METHODS, batches=(1, 8), budgets_dir=None) -> str:
    """The analytic KV cache of every preset, 2B and 8B, per batch size (GiB = 2^30 bytes); ScaleKV
    presets on the model their budget is made for, each row saying where its budget came from."""
    lines = [f"# analytic KV cache per generation, GiB (2^30 bytes), bf16, CFG on (2 rows per image), "
             f"{SCENARIO['pn']} h/w {SCENARIO['h_div_w']}; adaptive rows: the FLOPs scenario",
             "# alloc: buffers held (preallocated: pruning and skipping do not shrink them; a KV budget sizes each "
             "block to what it keeps between scales + one shared staging buffer); "
             "used: the most cached positions in use; x: baseline / preset"]
    notes: dict[str, str] = {}
    for key, model in MODELS.items():
        base = {bs: method_memory("baseline", model, bs) for bs in batches}
        lines.append(f"## {key.upper()}: weights {base[batches[0]]['weights'] / 2**30:.2f} GiB; baseline KV "
                     + ", ".join(f"batch {bs}: {base[bs]['kv_allocated']:,} B" for bs in batches))
        head = "".join(f" | bs{bs} alloc | bs{bs} used | x alloc | x used" for bs in batches)
        lines.append(f"{'config':32s}{head}")
        for m in [m for m in methods if _fits(m, model)]:
            cells = []
            for bs in batches:
                mm = method_memory(m, model, bs, budgets_dir=budgets_dir)
                cells.append(f" | {mm['kv_allocated'] / 2**30:8.2f} | {mm['kv_used_peak'] / 2**30:7.2f} | "
                             f"{base[bs]['kv_allocated'] / mm['kv_allocated']:7.2f} | "
                             f"{base[bs]['kv_used_peak'] / mm['kv_used_peak']:6.2f}")
            mark = ""
            if mm["budgets"]:
                src = "; ".join(mm["budgets"])
                mark = f"  [{'SYNTHETIC budget' if 'synthetic' in src else 'budget'}: {src}]".replace(str(ROOT) + "/", "")
                notes[src] = src
            lines.append(f"{m:32s}" + "".join(cells) + mark)
    if any("synthetic" in n for n in notes):
        lines.append("# SYNTHETIC budget: the released file was not found; the row uses synthetic_budgets of the released "
                     "shape (ours, not the release's numbers). Pass --budgets DIR holding the release's "
                     "2b_10%_budget.json / 8b_10%_budget.json (https://github.com/mobiushy/SpecuKV, budgets/).")
    return "\n".join(lines) + "\n"


def stage_extra(model: str, h_div_w: float, pn: str, t5_tokens: int = T5_MAX_LENGTH) -> float:
    """Per image: flan-t5-xl over ``t5_tokens`` + one VAE decode at the schedule's last grid (what
    the end-to-end count adds to the transformer's; the same for every method)."""
    stages = preset_stage_flops(model, t5_tokens)
    return stages["text_encoder"] + stages["vae_decode"](scale_schedule(h_div_w, pn)[-1])


def hart_stage_extra(model: str = HART_MODEL, qwen2_tokens: int = HART_SCENARIO["qwen2_tokens"]) -> float:
    """Per image on HART: the Qwen2 text model over ``qwen2_tokens`` + one tokenizer decode of the
    last stage's f_hat (64x64 at 1024²); the same for every method."""
    stages = preset_stage_flops(model, qwen2_tokens)
    p = HART_PRESETS[model].patch_nums[-1]
    return stages["text_encoder"] + stages["vae_decode"]((p, p))


@functools.lru_cache(maxsize=None)
def scenario_flops(preset: str, model: str = "infinity_2b", overrides: tuple = ()) -> dict:
    """Per-image FLOPs of the preset under the default scenario: ``{"transformer", "end_to_end"}``
    (HART: its scenario; a preset refused on HART raises ValueError with the reason)."""
    name, _, knobs = load_method(preset, model)
    knobs = {**knobs, **dict(overrides)}
    if model in HART_PRESETS:
        reason = hart_refusal(preset)
        if reason:
            raise ValueError(f"{preset} is refused on {model}: {reason}")
        b = HART_SCENARIO["batch"]
        t = hart_method_flops(name, knobs, HART_PRESETS[model], b, HART_SCENARIO["nova_act"], HART_SCENARIO["topro_D"])[0] / b
        return {"transformer": t, "end_to_end": t + hart_stage_extra(model, HART_SCENARIO["qwen2_tokens"])}
    args = (model, SCENARIO["h_div_w"], SCENARIO["pn"], SCENARIO["batch"], SCENARIO["text_len"],
            SCENARIO["nova_act"], SCENARIO["topro_D"])
    t = method_flops(name, knobs, *args)[0] / SCENARIO["batch"]
    return {"transformer": t, "end_to_end": t + stage_extra(model, SCENARIO["h_div_w"], SCENARIO["pn"],
                                                             SCENARIO["t5_tokens"])}


def x_fewer(preset: str, model: str = "infinity_2b", overrides: tuple = (), scope: str = "transformer") -> float:
    """Baseline FLOPs / the preset's FLOPs under the default scenario (overrides: ((knob, value), ...));
    ``scope``: "transformer" (the transformer alone) or "end_to_end" (+ text encoder and VAE decode)."""
    if scope not in ("transformer", "end_to_end"):
        raise ValueError(f"scope={scope!r}; use 'transformer' or 'end_to_end'")
    return scenario_flops("baseline", model)[scope] / scenario_flops(preset, model, overrides)[scope]


def fill_markers(text: str) -> str:
    """Every FLOPs marker of a doc filled with the generated value (2 decimals)."""
    def value(m):
        overrides = tuple((k, yaml.safe_load(v)) for k, v in (kv.split("=", 1) for kv in m["knobs"].replace("\\|", "|").split("|")[1:]))
        v = x_fewer(m["preset"], MARKER_MODELS[m["model"] or "2b"], overrides, "end_to_end" if m["scope"] else "transformer")
        return m.group(0)[: m.group(0).index("-->") + 3] + f"{v:.2f}" + "<!--/flops-->"
    return MARKER.sub(value, text)


def render_table(methods=DEFAULT_METHODS) -> str:
    lines = ["# Analytic FLOPs per method config (generated by `python -m experiments.flops_table --write`; do not edit)", "",
             "Static methods are exact counts; rows of adaptive methods (NOVA, ToProVAR, SparseVAR) follow the synthetic scenario in",
             f"experiments/flops_table.py (NOVA activation {SCENARIO['nova_act']}, ToProVAR D {SCENARIO['topro_D']}, "
             "SparseVAR keeping 40% of the tokens at each pruned scale), "
             f"not real prompts. 1024² ({SCENARIO['pn']}), h/w {SCENARIO['h_div_w']}, batch {SCENARIO['batch']}, "
             f"CFG on, {SCENARIO['text_len']} text tokens.", "",
             "\"x fewer\" = baseline FLOPs / the config's FLOPs per image. *Transformer*: the transformer alone",
             "(varbench/engine/backbones/infinity/flops.py), the part methods change. *End to end*: plus the flan-t5-xl encoder over its",
             f"{SCENARIO['t5_tokens']} padded tokens and one VAE decode at 1024² (varbench/engine/stage_flops.py), which every",
             "method runs unchanged. Baseline per image, TFLOPs:", ""]
    lines += ["| model | transformer | T5 encoder | VAE decode | end to end |", "|---|---:|---:|---:|---:|"]
    for key, model in MODELS.items():
        stages = preset_stage_flops(model, SCENARIO["t5_tokens"])
        vae = stages["vae_decode"](scale_schedule(SCENARIO["h_div_w"], SCENARIO["pn"])[-1])
        base = scenario_flops("baseline", model)
        lines.append(f"| {key.upper()} | {base['transformer'] / 1e12:.2f} | {stages['text_encoder'] / 1e12:.2f} | "
                     f"{vae / 1e12:.2f} | {base['end_to_end'] / 1e12:.2f} |")
    lines += ["", "| config | label | 2B x fewer (transformer) | 2B x fewer (end to end) | 8B x fewer (transformer) "
              "| 8B x fewer (end to end) |", "|---|---|---:|---:|---:|---:|"]
    for m in methods:
        cells = [f"{x_fewer(m, MODELS[k], scope=s):.2f}" for k in ("2b", "8b") for s in ("transformer", "end_to_end")]
        lines.append(f"| `{m}` | {load_method(m)[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + render_hart_table()) + "\n"


def render_hart_table(methods=HART_METHODS) -> list[str]:
    """The HART-0.7B section of the table: the baseline's parts, then every preset's ratios, or why it is
    refused on HART."""
    sc = HART_SCENARIO
    cfg = HART_PRESETS[HART_MODEL]
    stages = preset_stage_flops(HART_MODEL, sc["qwen2_tokens"])
    p = cfg.patch_nums[-1]
    dec = stages["vae_decode"]((p, p))
    base = scenario_flops("baseline", HART_MODEL)
    lines = ["## HART-0.7B", "",
             f"1024², {len(cfg.patch_nums)} stages ({', '.join(map(str, cfg.patch_nums))}; stage 0 = the "
             f"{cfg.context_token}-token text context), batch {sc['batch']}, CFG on (guidance {sc['cfg']}). Adaptive rows: "
             f"the scenario in experiments/flops_table.py on HART (NOVA activation stage {sc['nova_act']} = "
             f"{cfg.patch_nums[sc['nova_act']]}², ToProVAR D stage {sc['topro_D']} = {cfg.patch_nums[sc['topro_D']]}²).",
             "*Transformer*: varbench/engine/backbones/hart/flops.py (the residual diffusion head at the last stage "
             "included). *End to end*: plus the",
             f"Qwen2-1.5B text model over {sc['qwen2_tokens']} tokens ({HART_SYSTEM_PROMPT_TOKENS}-token system prompt, "
             f"the lower bound of the release's, + {HART_MAX_LENGTH} padded) and one tokenizer decode of the {p}x{p} f_hat "
             "(varbench/engine/stage_flops.py). Baseline per image, TFLOPs:", "",
             "| model | transformer | Qwen2 encoder | tokenizer decode | end to end |", "|---|---:|---:|---:|---:|",
             f"| HART-0.7B | {base['transformer'] / 1e12:.2f} | {stages['text_encoder'] / 1e12:.2f} | {dec / 1e12:.2f} | "
             f"{base['end_to_end'] / 1e12:.2f} |", "",
             "| config | label | HART x fewer (transformer) | HART x fewer (end to end) |", "|---|---|---:|---:|"]
    for m in methods:
        reason = hart_refusal(m)
        if reason:
            lines.append(f"| `{m}` | {load_method(m)[1]} | refused: {reason.replace('|', '/')} | – |")
            continue
        cells = [f"{x_fewer(m, HART_MODEL, scope=s):.2f}" for s in ("transformer", "end_to_end")]
        lines.append(f"| `{m}` | {load_method(m)[1]} | " + " | ".join(cells) + " |")
    return lines


def check() -> list[str]:
    """Places whose FLOPs numbers differ from what the generator writes now."""
    problems = []
    if TABLE.read_text() != render_table():
        problems.append(f"{TABLE.relative_to(ROOT)} differs from the generator: run python -m experiments.flops_table --write")
    for doc in DOCS:
        text = doc.read_text()
        for old, new in zip(MARKER.finditer(text), MARKER.finditer(fill_markers(text))):
            if old["value"] != new["value"]:
                problems.append(f"{doc.relative_to(ROOT)}: {old.group(0)} -> generated {new['value']}")
    return problems


def write() -> None:
    TABLE.write_text(render_table())
    for doc in DOCS:
        doc.write_text(fill_markers(doc.read_text()))


def use_config_dirs(dirs) -> None:
    """Resolve method names with the user's config folders ``dirs`` from now on (the caches forget
    what was resolved without them)."""
    global CONFIG_DIRS
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing:
        raise SystemExit(f"--config-dir {missing[0]}: no such folder")
    if tuple(map(str, dirs)) != CONFIG_DIRS:
        CONFIG_DIRS = tuple(map(str, dirs))
        for cached in (scenario_flops, hart_refusal):
            cached.cache_clear()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="infinity_2b", choices=["infinity_2b", "infinity_8b", HART_MODEL],
                    help=f"{HART_MODEL}: 1024², its 14 stages (--pn, --h-div-w, --text-len, --t5-tokens do not apply)")
    ap.add_argument("--pn", default="1M")
    ap.add_argument("--h-div-w", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--text-len", type=int, default=32, help="T5 tokens per prompt (cross-attention keys)")
    ap.add_argument("--t5-tokens", type=int, default=T5_MAX_LENGTH,
                    help="positions the T5 encoder computes (end-to-end count; the released pipeline pads to 512)")
    ap.add_argument("--qwen2-tokens", type=int, default=HART_SCENARIO["qwen2_tokens"],
                    help=f"{HART_MODEL}: positions the Qwen2 text model computes per prompt (end-to-end count; "
                         "system prompt + 300 padded)")
    ap.add_argument("--nova-activation", type=int, default=None,
                    help="scenario: NOVA's activation scale index (default 6 on Infinity, 8 on HART: 16²)")
    ap.add_argument("--toprovar-depth", type=int, default=None,
                    help="scenario: the scale where rho crosses tau (default 9 on Infinity: 32²; 11 on HART: 36²)")
    ap.add_argument("--methods", nargs="*", default=DEFAULT_METHODS,
                    help="method presets, registered method names or module:Class names (an outside policy)")
    ap.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                    help="a config folder of your own (as `python -m varbench --config-dir DIR`): its method/*.yaml "
                         "presets resolve as in a job (repeatable)")
    ap.add_argument("--write", action="store_true", help="regenerate results/curated/flops_analytic.md and the docs' markers")
    ap.add_argument("--check", action="store_true", help="exit 1 listing every generated number that drifted")
    ap.add_argument("--memory", action="store_true",
                    help="print the analytic KV-cache bytes of every preset (--methods, plus the ScaleKV presets "
                         "when --methods is not given) for 2B and 8B at batch 1 and 8")
    ap.add_argument("--budgets", default=None, metavar="DIR",
                    help="--memory: read ScaleKV's released budget files (2b_10%%_budget.json, 8b_10%%_budget.json) "
                         "from DIR; without it, a preset whose file is absent uses synthetic budgets (said per row)")
    a = ap.parse_args(argv)
    use_config_dirs(a.config_dir)
    if a.memory:
        methods = a.methods if a.methods is not DEFAULT_METHODS else DEFAULT_METHODS + MEMORY_METHODS
        print(render_memory(methods, budgets_dir=a.budgets), end="")
        return 0
    if a.write:
        write()
        return 0
    if a.check:
        problems = check()
        print("\n".join(problems) or "every FLOPs number in the docs matches the generator")
        return 1 if problems else 0
    if a.model in HART_PRESETS:
        return hart_main(a)
    a.nova_activation = SCENARIO["nova_act"] if a.nova_activation is None else a.nova_activation
    a.toprovar_depth = SCENARIO["topro_D"] if a.toprovar_depth is None else a.toprovar_depth
    rows = []
    base = None
    extra = stage_extra(a.model, a.h_div_w, a.pn, a.t5_tokens)   # per image, the same for every method
    for m in ["baseline"] + [x for x in a.methods if x != "baseline"]:
        name, label, knobs = load_method(m, a.model)
        f, st = method_flops(name, knobs, a.model, a.h_div_w, a.pn, a.batch, a.text_len, a.nova_activation, a.toprovar_depth)
        f /= a.batch
        base = f if m == "baseline" else base
        rows.append((m, label, f))
    print(f"# analytic FLOPs per image, {a.model}, pn={a.pn}, h/w={a.h_div_w}, batch {a.batch}, CFG on; "
          f"scenario: NOVA activation {a.nova_activation}, ToProVAR D {a.toprovar_depth}; "
          f"end to end adds T5 ({a.t5_tokens} tokens) + VAE decode = {extra / 1e12:.2f} TFLOPs")
    print(f"{'config':24s} {'label':36s} {'TFLOPs':>8s} {'ratio':>7s} {'x fewer':>8s} {'e2e TFLOPs':>10s} {'e2e x':>6s}")
    for m, label, f in rows:
        print(f"{m:24s} {label:36s} {f / 1e12:8.2f} {f / base:7.3f} {base / f:8.2f} {(f + extra) / 1e12:10.2f} "
              f"{(base + extra) / (f + extra):6.2f}")



def hart_main(a) -> int:
    """`--model hart_0p7b`: the HART rows; presets refused on HART are printed with the reason."""
    cfg = HART_PRESETS[a.model]
    nova_act = HART_SCENARIO["nova_act"] if a.nova_activation is None else a.nova_activation
    topro_D = HART_SCENARIO["topro_D"] if a.toprovar_depth is None else a.toprovar_depth
    extra = hart_stage_extra(a.model, a.qwen2_tokens)
    rows, base = [], None
    for m in ["baseline"] + [x for x in a.methods if x != "baseline"]:
        name, label, knobs = load_method(m, a.model)
        reason = hart_refusal(m)
        f = None if reason else hart_method_flops(name, knobs, cfg, a.batch, nova_act, topro_D)[0] / a.batch
        base = f if m == "baseline" else base
        rows.append((m, label, f, reason))
    print(f"# analytic FLOPs per image, {a.model}, 1024², batch {a.batch}, CFG on (guidance {HART_SCENARIO['cfg']}); "
          f"scenario: NOVA activation {nova_act} ({cfg.patch_nums[nova_act]}²), ToProVAR D {topro_D} "
          f"({cfg.patch_nums[topro_D]}²); end to end adds Qwen2 ({a.qwen2_tokens} tokens) + tokenizer decode = "
          f"{extra / 1e12:.2f} TFLOPs")
    print(f"{'config':24s} {'label':36s} {'TFLOPs':>8s} {'ratio':>7s} {'x fewer':>8s} {'e2e TFLOPs':>10s} {'e2e x':>6s}")
    for m, label, f, reason in rows:
        if reason:
            print(f"{m:24s} {label:36s} refused on HART: {reason}")
            continue
        print(f"{m:24s} {label:36s} {f / 1e12:8.2f} {f / base:7.3f} {base / f:8.2f} {(f + extra) / 1e12:10.2f} "
              f"{(base + extra) / (f + extra):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
