"""`compose`: run several policies as one, merging their plans scale by scale.

Method card
-----------
Changes: nothing of its own. Each member policy is reset, planned and observed as if alone; their
         plans merge: a scale runs only if every member runs it; a block skipped by any member is
         skipped; a block pruned by one member is pruned; residual caching and attention-entropy
         requests are unions; guidance/temperature overrides must agree; dropping the
         unconditional branch by any member drops it; KV budgets (ScaleKV's `ScalePlan.kv`) are a
         union by block (two members budgeting the same block at the same scale is refused), and the
         runtime's per-block KV capacity is the smallest any member asks for (`kv_capacity`);
         block-range residual requests are a union, code masks an OR, at most one member may
         fill tokens after the last block (`post_fill`; two are refused), and an area input resize
         asked by a member applies (`input_resize`).
Memory x compute: a KV budget (scalekv) composes with FastVAR, NOVA, SkipVAR and the skip
         baselines: they prune tokens, blocks, rows or scales, which only shortens what a block
         caches, so the budget's capacity still bounds it. Where a member pruned a scale's K/V
         (prune_kv), ScaleKV's selection has no guaranteed window keys and keeps the top n_keep
         of every position by its pooled scores (its card). SkipVAR in particular: a scale it
         skips never runs, so its budget is never applied (ScaleKV plans on the full schedule;
         the capacities stay an upper bound); its cond-only scales (drop_uncond) shrink the rows
         in use, while a budget counts positions per row, so the cond rows keep exactly their
         budget and the dropped uncond rows are never read again; its per-image decisions split
         the batch, whose parts share the staging buffer. Refused: two KV budgets on one
         composition (INCOMPATIBLE; a ConfigError at construction, so a composition matrix lists
         the cell as failed with this reason).
Typical use: NOVA's schedule on top of FastVAR's cache (the NOVA summary hints NOVA was evaluated
         over FastVAR): members [fastvar, nova], conflict "last" (NOVA's per-layer plan wins where
         both prune a block), cache "first" (NOVA's pruned slots are filled from FastVAR's cached
         scale wherever that scale precedes them; earlier scales keep NOVA's own cache).

Knobs: `ComposeKnobs` below.

Refused pairs (a clear error at construction): see INCOMPATIBLE.

Residual caches are freed as soon as no member's later plan can read them (`release_residuals`):
a kept scale stays alive only while some member still needs it after the current scale:
  - a member whose `residual_reads_after(si)` names scales (FastVAR: its cache scale until its last
    pruned scale) needs exactly those;
  - any other member needs the scales it kept and has not released yet (NOVA prev_scale: the
    previous scale), and nothing once `may_fill_after(si, not_run)` says it can no longer fill a
    later scale that runs (`not_run`: every member's `scheduled_skips`);
  - with cache=first, from the shared cache scale on every later fill of members 2.. is redirected
    to the shared cache: such a member needs the shared cache (while it may still prune), never its
    own kept scales.
Members whose cache fills leave `cache_from=None` (nearest earlier cache) are not supported by
this rule; no registered method emits them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from varbench.core.errors import ConfigError
from varbench.engine.plan import BlockPlan, GenerationContext, ScalePlan, ScaleSignals
from varbench.engine.policy import DocRow, MethodCard, Policy, RequiredFile
from varbench.policies.knobs import MethodKnobs, check_knobs, knob

#: unordered pairs of registry names that must not be composed, with the reason shown to the user
INCOMPATIBLE: dict[frozenset, str] = {
    frozenset({"nova", "toprovar"}): (
        "NOVA keeps high *predictive*-entropy tokens and fills pruned slots from a cache, ToProVAR keeps low "
        "*attention*-entropy tokens and passes pruned ones through: on a shared block their rankings contradict "
        "and the result is neither method. Run them as separate arms."),
    frozenset({"skip_last", "toprovar"}): (
        "ToProVAR chooses its own exit/depth; a fixed skip_last on top silently overrides it. Use "
        "toprovar.fixed_exit for a fixed exit instead."),
    frozenset({"sparvar", "scalekv"}): (
        "ScaleKV evicts cache positions, and SparVAR's remembered keys are cache positions chosen at its decision "
        "scale: after an eviction they name other keys. Run them as separate arms."),
    frozenset({"sparvar", "fastvar"}): (
        "FastVAR prunes the queries and K/V of the large scales, where SparVAR groups a scale's full query grid and "
        "addresses its own keys by position (local band, CSLA windows): the plans do not combine. Compose SparVAR "
        "with scale skipping (sparvar_skip1/2) instead."),
    frozenset({"sparvar", "nova"}): (
        "NOVA prunes tokens of the late scales, where SparVAR needs every query of the scale's grid (its query "
        "groups and windows are positions of that grid): the plans do not combine."),
    frozenset({"sparvar", "toprovar"}): (
        "ToProVAR prunes tokens and exits blocks of the late scales, where SparVAR needs every query of the scale's "
        "grid: the plans do not combine."),
    frozenset({"scalekv"}): (
        "two ScaleKV members would both budget the same blocks' KV caches: each evicts what the other's "
        "selection kept, and the runtime sizes a block to one capacity, so neither budget is the one "
        "applied. One memory method per composition (run different budgets as separate arms)."),
}


@dataclass(frozen=True)
class ComposeKnobs(MethodKnobs, method="compose"):
    """compose's knobs; each member's knobs are checked against its own method's dataclass.

    policies   [{name: <registry name>, knobs: {...}}, ...] (from Python also Policy objects), at
               least two.
    conflict   error (two members pruning the same block at the same scale is refused) | first |
               last: whose BlockPlan wins when two members prune the same block.
    cache      own (each member's cache_from stands) | first (cache fills of later members are
               redirected to the first member's `cache_scale`, e.g. FastVAR's 24² scale).
    """
    policies: Sequence[Mapping[str, Any]] = knob(())
    conflict: str = knob("error", choices=("error", "first", "last"))
    cache: str = knob("own", choices=("own", "first"))

    @classmethod
    def check_config(cls, knobs: Mapping[str, Any], n_scales: Optional[int], where: str) -> None:
        """Each member is {name, knobs} and its knobs fit its own method."""
        for i, spec in enumerate(knobs.get("policies") or ()):
            at = f"{where}.policies[{i}]"
            if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
                raise ConfigError(f"{at} must be {{name: <method>, knobs: {{...}}}}, got {spec!r}")
            unknown = set(spec) - {"name", "knobs"}
            if unknown:
                raise ConfigError(f"{at}: unknown key(s) {sorted(unknown)}; a member is {{name, knobs}}")
            sub = spec.get("knobs") or {}
            if not isinstance(sub, Mapping):
                raise ConfigError(f"{at}.knobs must be a mapping, got {sub!r}")
            check_knobs(spec["name"], sub, n_scales, f"{at}.knobs")


class Compose(Policy):
    name = "compose"
    #: the method's card (varbench.engine.policy.MethodCard): figures, tables, `varbench.list`, docs/methods.md
    card = MethodCard(
        display_name='composed methods', colour='#882255', marker='P',
        paper=None,
        code=None,
        reconstructed=(),
        doc_rows=(DocRow('`compose` (`nova_on_fastvar`)',
                         source='–',
                         changes="NOVA's plan over FastVAR's cache and skipped scales",
                         reconstructed='–',
                         flops=('{flops:nova_on_fastvar}*',
                                '{flops:e2e:nova_on_fastvar}*')),))
    Knobs = ComposeKnobs
    #: the members' own neutral settings (FastVAR.NEUTRAL, NOVA.NEUTRAL)
    NEUTRAL = {"policies": [{"name": "fastvar", "knobs": {"prune": {}, "skip": []}},
                            {"name": "nova", "knobs": {"r_max": 0.0}}]}
    #: NOVA's plan over FastVAR's cache (the members' ACTIVE settings), on the tiny runtime
    ACTIVE = {"policies": [{"name": "fastvar"},
                           {"name": "nova", "knobs": {"t_min_tokens": 16, "min_tokens_to_prune": 16, "t_force": -3}}],
              "conflict": "last", "cache": "first"}

    @classmethod
    def required_files(cls, knobs: Mapping[str, Any]) -> list[RequiredFile]:
        """Every member's files, each naming its member and its setting inside ``policies``; a member
        that does not resolve declares none here (the job names it)."""
        from varbench.policies import REGISTRY

        out = []
        for i, spec in enumerate((knobs or {}).get("policies") or []):
            if not isinstance(spec, Mapping) or not spec.get("name"):
                continue                     # a Policy object (a test's) or a malformed member: not a file
            try:
                member = REGISTRY.load(str(spec["name"]))
                files = member.required_files(dict(spec.get("knobs") or {}))
            except Exception:  # noqa: BLE001 - a bad member fails its job with its own error
                continue
            out += [dataclasses.replace(f, knob=f"policies[{i}].knobs.{f.knob}", owner=f.owner or str(spec["name"]))
                    for f in files]
        return out

    @property
    def adaptive(self) -> bool:   # adaptive when any member is
        return any(getattr(m, "adaptive", False) for m in self.members)

    def __init__(self, policies: Sequence[Union[Mapping[str, Any], Policy]], **knobs: Any):
        from varbench.policies import build_policy

        kn = ComposeKnobs(**knobs)   # conflict, cache (the members are checked as they are built)
        conflict, cache = kn.conflict, kn.cache
        members = []
        for p in policies:
            if isinstance(p, Policy):
                members.append(p)
            else:
                spec = dict(p)
                if "name" not in spec:
                    raise ValueError(f"compose.policies entries need a `name` (and optional `knobs`); got {spec!r}")
                members.append(build_policy(spec["name"], **dict(spec.get("knobs") or {})))
        if len(members) < 2:
            raise ValueError("compose needs at least two policies (a single one: use it directly).")
        names = [m.name for m in members]
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                reason = INCOMPATIBLE.get(frozenset({names[i], names[j]}))
                if reason:
                    raise ConfigError(f"compose: {names[i]} + {names[j]} is refused. {reason}")
        self.members, self.conflict, self.cache = members, conflict, cache

    @property
    def per_image_decisions(self) -> bool:
        return any(m.per_image_decisions for m in self.members)

    @property
    def reads_signals_on_host(self) -> bool:
        return any(getattr(m, "reads_signals_on_host", False) for m in self.members)

    def backbone_refusal(self, backbone: str) -> Optional[str]:
        """A composition runs where every member does (its plans are the members' plans merged)."""
        for i, m in enumerate(self.members):
            reason = m.backbone_refusal(backbone)
            if reason:
                return f"compose.policies[{i}]: {reason}"
        return None

    def fork(self) -> "Compose":
        twin = super().fork()
        twin.members = [m.fork() for m in self.members]
        return twin

    def reset(self, ctx: GenerationContext) -> None:
        super().reset(ctx)
        for m in self.members:
            m.reset(ctx)
        self.shared_cache = None
        self._alive: set[int] = set()                      # scales whose residuals the runtime holds
        self._held: list[set[int]] = [set() for _ in self.members]  # per member: kept, not yet released
        if self.cache == "first":
            self.shared_cache = getattr(self.members[0], "cache_scale", None)
            if self.shared_cache is None:
                raise ValueError(f"compose.cache=first needs the first member ({self.members[0].name}) to keep a "
                                 "cache scale (e.g. fastvar with fill=cache and a pruned scale); it has none.")

    def _merge_block(self, si: int, bi: int, cands: list[tuple[int, BlockPlan]]) -> BlockPlan:
        skips = [c for c in cands if c[1].mode == "skip"]
        if skips:
            return skips[0][1]
        if len(cands) > 1 and self.conflict == "error":
            who = ", ".join(self.members[i].name for i, _ in cands)
            raise ValueError(f"compose: {who} all prune block {bi} at scale {si}. Set compose.conflict to first or "
                             "last to let one member's plan win, or narrow the members' scales/blocks.")
        i, bp = cands[0] if self.conflict in ("error", "first") else cands[-1]
        if (self.shared_cache is not None and i > 0 and bp.mode == "prune" and bp.fill == "cache"
                and si > self.shared_cache):
            bp = dataclasses.replace(bp, cache_from=self.shared_cache)
        return bp

    def _needed_after(self, si: int) -> set[int]:
        """Kept scales some member's plan after scale si may still read (see the module docstring)."""
        need: set[int] = set()
        redirected = self.shared_cache is not None and si >= self.shared_cache
        not_run = frozenset().union(*(m.scheduled_skips() for m in self.members))
        for i, (m, held) in enumerate(zip(self.members, self._held)):
            reads = m.residual_reads_after(si)
            if redirected and i > 0:
                if reads is not None and not reads:
                    continue
                if reads is None and not m.may_fill_after(si, not_run):
                    continue
                need.add(self.shared_cache)
            elif reads is not None:
                need |= set(reads)
            elif m.may_fill_after(si, not_run):
                need |= held
        return need

    def plan(self, si: int) -> ScalePlan:
        plans = [m.plan(si) for m in self.members]
        for held, p in zip(self._held, plans):
            if p.run and p.keep_residuals:
                held.add(si)
            held -= p.release_residuals
        if not all(p.run for p in plans):
            return ScalePlan(run=False)
        overrides = {}
        for field in ("cfg", "tau"):
            vals = {getattr(p, field) for p in plans if getattr(p, field) is not None}
            if len(vals) > 1:
                raise ValueError(f"compose: members set different {field} overrides at scale {si}: {sorted(vals)}")
            overrides[field] = vals.pop() if vals else None
        cands: dict[int, list[tuple[int, BlockPlan]]] = {}
        for i, p in enumerate(plans):
            for bi, bp in p.blocks.items():
                if bp.mode != "full":
                    cands.setdefault(bi, []).append((i, bp))
        blocks = {bi: self._merge_block(si, bi, c) for bi, c in sorted(cands.items())}
        kv: dict = {}
        for i, p in enumerate(plans):
            for bi, kb in p.kv.items():
                if bi in kv:
                    raise ValueError(f"compose: two members ({self.members[kv[bi][0]].name}, {self.members[i].name}) set a KV "
                                     f"budget for block {bi} at scale {si}; one memory method per block (run them as "
                                     "separate arms)")
                kv[bi] = (i, kb)
        attn: dict = {}
        for i, p in enumerate(plans):
            for bi, ap in p.attn.items():
                if ap.kind == "dense":
                    continue
                if bi in attn:
                    raise ValueError(f"compose: two members ({self.members[attn[bi][0]].name}, {self.members[i].name}) set "
                                     f"an attention plan for block {bi} at scale {si}; one sparse-attention method per block")
                attn[bi] = (i, ap)
        att = frozenset().union(*(p.attention_entropy_for for p in plans))
        qs = [p.attention_entropy_queries for p in plans if p.attention_entropy_for]
        queries = None if (not qs or any(q is None for q in qs)) else max(qs)
        keep = any(p.keep_residuals for p in plans) or (self.shared_cache == si)
        if keep:
            self._alive.add(si)
        # freed after this scale runs: every kept scale no member's later plan can read
        release = frozenset(self._alive - self._needed_after(si))
        self._alive -= release
        fills = [(i, p.post_fill) for i, p in enumerate(plans) if p.post_fill is not None]
        if len(fills) > 1:
            raise ValueError(f"compose: {', '.join(self.members[i].name for i, _ in fills)} each fill tokens after the "
                             f"last block at scale {si} (ScalePlan.post_fill); one post-block fill per scale")
        masks = [p.code_mask for p in plans if p.code_mask is not None]
        code_mask = None
        for m in masks:   # a token zeroed by any member is zeroed
            code_mask = m if code_mask is None else code_mask | m
        resizes = {p.input_resize for p in plans} - {"trilinear"}
        if len(resizes) > 1:
            raise ValueError(f"compose: members ask for different input resizes at scale {si}: {sorted(resizes)}")
        return ScalePlan(run=True, blocks=blocks, keep_residuals=keep, attention_entropy_for=att,
                         attention_entropy_queries=queries, cfg=overrides["cfg"], tau=overrides["tau"],
                         drop_uncond=any(p.drop_uncond for p in plans), release_residuals=release,
                         kv={bi: kb for bi, (_, kb) in sorted(kv.items())},
                         attn={bi: ap for bi, (_, ap) in sorted(attn.items())},
                         residual_change_for=frozenset().union(*(p.residual_change_for for p in plans)),
                         post_fill=fills[0][1] if fills else None, code_mask=code_mask,
                         input_resize=resizes.pop() if resizes else "trilinear")

    def kv_capacity(self) -> Optional[list[int]]:
        """Per block the smallest capacity a member asks for (members without a KV budget ask for
        none; see the card: the others only shorten what a block caches)."""
        caps = [c for m in self.members if (c := m.kv_capacity()) is not None]
        if not caps:
            return None
        return [min(int(c[bi]) for c in caps) for bi in range(len(caps[0]))]

    def observe(self, si: int, signals: ScaleSignals) -> None:
        for m in self.members:
            m.observe(si, signals)

    def check_schedule(self, schedule: Sequence[tuple[int, int]], where: str) -> None:
        """Each member's own check, named by its place (``<where>.policies[i].knobs``)."""
        for i, m in enumerate(self.members):
            m.check_schedule(schedule, f"{where}.policies[{i}].knobs")

    def stats(self) -> dict[str, Any]:
        return {f"{i}:{m.name}": m.stats() for i, m in enumerate(self.members)}

    def no_effect_reason(self) -> Optional[str]:
        """The members' own reasons, joined (each names its member)."""
        reasons = [r for m in self.members if (r := m.no_effect_reason())]
        return "; ".join(reasons) or None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "conflict": self.conflict, "cache": self.cache,
                "policies": [m.describe() for m in self.members]}
