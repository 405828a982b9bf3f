"""The policy interface every acceleration method implements.

A policy is a small object with per-generation state:

    policy.reset(ctx)                # at every generation start (no stale state between images)
    plan = policy.plan(si)           # before scale si runs
    policy.observe(si, signals)      # after scale si is sampled
    policy.stats()                   # JSON-able summary of what it did to this generation
    policy.no_effect_reason()        # optional: why the last generation's plans were all neutral

Batches: a policy whose decisions are per image (`per_image_decisions`, an adaptive method with
`batch_rule: per_image`) is forked once per image at batch > 1 and each copy is reset for a batch
of one; the runtime groups images whose plans agree into sub-batches (`varbench.engine.batch_split`).
Other policies see the whole batch and emit one plan for it.

Methods that only reshape plans (FastVAR, skip baselines) ignore `observe`; entropy-driven methods
(NOVA, ToProVAR) decide later scales from earlier signals. `observe` may read GPU tensors to the
host: it runs between scale steps, never inside one.

Optional hooks, each with a neutral default, let the harness and `compose` ask a method what only
it knows instead of testing its type: `check_schedule` (config validation), `scheduled_skips`,
`residual_reads_after` and `may_fill_after` (when `compose` may free a kept residual cache).
A method also declares, beside its knobs: `Knobs` (its knob dataclass, varbench.policies.knobs),
`NEUTRAL` (knobs under which its plans change nothing) and `ACTIVE` (knobs under which it acts on
the tiny test runtime); the conformance check (`varbench.policies.conformance`, run by
tests/policies/test_policies_conformance.py and `python -m varbench.check_method`) reads them.

A method is one self-describing unit: its class carries its **card** (`card`, a `MethodCard`:
the words, colour and marker figures, tables, `varbench.list` and docs/methods.md show for it, its
paper and code, what is reconstructed) and declares the **files** it needs for given knobs
(`required_files`, read by the preflight before any job starts). Read a card with
``cls.method_card(name)``, which gives a default card (the method's name as its display name) to a
class that declares none; `varbench.policies.cards.card_for(method_name)` does the same from a
method name (packaged, an entry point or ``module:Class``) without ever raising.
"""
from __future__ import annotations

import abc
import copy
import dataclasses
from typing import AbstractSet, Any, ClassVar, Mapping, Optional, Sequence, Union

from varbench.engine.plan import GenerationContext, ScalePlan, ScaleSignals


@dataclasses.dataclass(frozen=True)
class MethodCard:
    """Who a method is, for the reader of a figure, a table or the docs (one per policy class).

    display_name   legend and table words (``"NOVA"``)
    colour         its colour in every figure (``"#D55E00"``); None: a fixed colour picked by a hash of
                   the method's name (`varbench.policies.cards.method_colour`), stable across runs
    marker         its matplotlib marker where one marker stands for the method (the memory figure);
                   None: the figures' default for an unmarked method
    paper          the citation (title, authors, venue or arXiv id); None: none
    code           the release it follows (``"owner/repo @ commit"``), ``"none public"``, or None
    reconstructed  what is reconstructed or third-party rather than released, in short phrases
    doc_rows       its rows in docs/methods.md's method table (`DocRow`: the presets that read as
                   methods of their own there, with their FLOPs); none: one row from the fields above
    """

    display_name: str
    colour: Optional[str] = None
    marker: Optional[str] = None
    paper: Optional[str] = None
    code: Optional[str] = None
    reconstructed: Union[str, tuple[str, ...]] = ()
    doc_rows: tuple["DocRow", ...] = ()

    def reconstructed_text(self) -> str:
        """`reconstructed` as one phrase (``"–"`` when nothing is)."""
        parts = (self.reconstructed,) if isinstance(self.reconstructed, str) else tuple(self.reconstructed)
        return "; ".join(p for p in parts if p) or "–"


@dataclasses.dataclass(frozen=True)
class DocRow:
    """One row of docs/methods.md's method table (`varbench.cli.method_docs` writes it): ``method`` is
    its first cell as written (``"`fastvar_generalised`"``), ``flops`` its two FLOPs cells (transformer
    only, end to end). A cell writes ``{flops:KEY}`` where `experiments.flops_table` keeps a number
    (``<!--flops:KEY-->N<!--/flops-->`` in the doc)."""

    method: str
    source: str = "–"
    changes: str = ""
    reconstructed: str = "–"
    flops: tuple[str, str] = ("–", "–")


@dataclasses.dataclass(frozen=True)
class RequiredFile:
    """A file (or folder) a method needs for its knobs (`Policy.required_files`).

    what       the file in words, naming its method (``"ScaleKV budget file 2b_10%_budget.json"``)
    path       where it is looked for (resolved)
    published  where to get it
    knob       the knob that points at it (``"budget_file"``): the preflight's fix names the setting
               ``method.knobs.<knob>`` (inside a composition, ``method.knobs.policies[i].knobs.<knob>``)
    fix        how to put it in place; ``{setting}`` is replaced by that setting's full name
    present    whether it is there; None: the preflight checks that `path` exists
    owner      the method that needs it when that is not the one asked (a `compose` member's name)
    """

    what: str
    path: str
    published: str = ""
    knob: str = ""
    fix: str = "put it there, or set {setting} to its path"
    present: Optional[bool] = None
    owner: Optional[str] = None

    def is_present(self) -> bool:
        from pathlib import Path

        return Path(self.path).exists() if self.present is None else bool(self.present)


class Policy(abc.ABC):
    #: registry name, e.g. "fastvar"
    name: str = "policy"
    #: True when the plan depends on observed signals, so the work varies by prompt (the timed pass
    #: then times ``timing.prompts`` prompts instead of ``timing.prompts_static``)
    adaptive: bool = False

    #: decisions are made per image: at batch > 1 the runtime runs one fork per image (see above)
    per_image_decisions: bool = False

    #: `observe` reads its signals' values on the host (token and attention entropies): the runtime
    #: then copies them there in one transfer per dtype per scale (`batch_split.host_signals`), one
    #: wait for the GPU instead of one per read. Policies that read nothing leave it off (no transfer).
    reads_signals_on_host: bool = False

    #: the model families (`GenerationContext.backbone`) whose mechanics this method's rules are written
    #: for; the harness refuses a method on any other before a weight is loaded (`backbone_refusal`)
    backbones: ClassVar[frozenset[str]] = frozenset({"infinity"})

    #: the method's knob dataclass (a `varbench.policies.knobs.MethodKnobs`: each knob's default, type
    #: and range); None: config validation reads the constructor's signature instead
    Knobs: ClassVar[Optional[type]] = None
    #: constructor knobs under which the plans change nothing, so a generation reproduces the baseline
    #: bit for bit (on the tiny test runtime, '0.06M'). Every registered method declares it.
    NEUTRAL: ClassVar[Mapping[str, Any]]
    #: constructor knobs under which the method changes FLOPs or bits on the tiny test runtime
    #: ('0.06M'); None for a method with no such setting (the baseline). Every registered method declares it.
    ACTIVE: ClassVar[Optional[Mapping[str, Any]]]

    #: the method's card (see `MethodCard`); read it with `method_card`, which gives a class without
    #: its own card (a subclass does not inherit its parent's: it is another method) a default one
    card: ClassVar[Optional[MethodCard]] = None

    @classmethod
    def method_card(cls, name: Optional[str] = None) -> MethodCard:
        """This class's own card, else a default one: `name` as given (a ``module:Class`` name reads
        as its class name), or the class's registry `name`, or its class name, as the display name."""
        own = cls.__dict__.get("card")
        if own is not None:
            return own
        return MethodCard(display_name=default_display_name(name) if name else
                          (cls.name if cls.name != Policy.name else cls.__name__))

    @classmethod
    def required_files(cls, knobs: Mapping[str, Any]) -> list[RequiredFile]:
        """The files (or folders) this method needs under `knobs` (its config's ``method.knobs``, as
        written), each with where it is published: the preflight names the missing ones before any
        job starts. Default: none."""
        return []

    def reset(self, ctx: GenerationContext) -> None:
        self.ctx = ctx

    def fork(self) -> "Policy":
        """An independent copy for one image of a batch. Shallow: configuration is shared, and
        `reset` must rebind (never mutate in place) every piece of per-generation state."""
        return copy.copy(self)

    @abc.abstractmethod
    def plan(self, si: int) -> ScalePlan:
        """The plan for scale `si` (called once per scale, in order)."""

    def observe(self, si: int, signals: ScaleSignals) -> None:
        """Signals measured at scale `si` (after sampling)."""

    def stats(self) -> dict[str, Any]:
        """What this policy did to the last generation (goes into the per-image trace)."""
        return {}

    def kv_capacity(self) -> Optional[Sequence[int]]:
        """Per block, the most K/V positions it keeps BETWEEN scales in this generation (after its
        evictions; read after `reset`), when the policy's plans carry KV budgets (`ScalePlan.kv`):
        the runtime then allocates each block's own cache at that size, plus one staging buffer
        shared by the blocks for the scales whose kept positions and new tokens overflow it
        (`varbench.engine.kv_cache.KVCache`), so the budget saves memory that is never allocated.
        None (the default): every block holds the whole schedule, no staging buffer."""
        return None

    def no_effect_reason(self) -> Optional[str]:
        """Why this policy's plans for the last generation changed nothing, in one line that names
        the policy (e.g. ``"fastvar: no schedule width in 32/40/48/64 at h/w 1.25 (1M)"``); None
        when it did change something or has no specific reason (the job then says "every plan was
        neutral"). Called only after a generation whose every plan was neutral
        (:func:`varbench.engine.plan.is_neutral`), so it may read per-generation state."""
        return None

    def describe(self) -> dict[str, Any]:
        """The policy's configuration, for the run record."""
        return {"name": self.name}

    # -- optional hooks ------------------------------------------------------------------------------
    def backbone_refusal(self, backbone: str) -> Optional[str]:
        """Why this method (as configured) cannot run on the model family `backbone`, in one line that
        names what to use instead; None when it can. Default: refused unless `backbone` is in
        `backbones`. A method whose support depends on its knobs (NOVA's per-bit entropies) overrides it."""
        if backbone in self.backbones:
            return None
        return (f"{self.name} is written for {', '.join(sorted(self.backbones))} models, not {backbone}: pick a method "
                f"that supports {backbone} (docs/methods.md), or, for your own method whose rules apply there, declare "
                f"backbones = frozenset({{{', '.join(repr(b) for b in sorted(self.backbones | {backbone}))}}}) on its class")

    def check_schedule(self, schedule: Sequence[tuple[int, int]], where: str) -> None:
        """Raise `varbench.core.errors.ConfigError` (naming ``<where>.<knob>``) for a knob value that
        cannot work on this generation schedule; called by config validation before anything runs.
        Default: nothing to check."""

    def scheduled_skips(self) -> frozenset:
        """Scales this generation will not run whatever it observes, fixed at `reset`. Default: none
        declared."""
        return frozenset()

    def residual_reads_after(self, si: int) -> Optional[frozenset]:
        """Exactly the kept scales whose residuals this policy's plans after scale `si` may read; None
        (the default) when the policy does not say (then `may_fill_after` is asked)."""
        return None

    def may_fill_after(self, si: int, not_run: AbstractSet[int]) -> bool:
        """Whether a plan of this policy after scale `si`, at a scale outside `not_run`, may still fill
        pruned tokens from a kept residual cache. Default True (assume it may)."""
        return True


def default_display_name(name: str) -> str:
    """The words a method without a card goes by: its name as given, or the class name of a
    ``module:Class`` name (``my_pkg.mod:MyPolicy`` -> ``MyPolicy``)."""
    name = str(name)
    return name.rpartition(":")[2].rpartition(".")[2] if ":" in name else name


class NeutralPolicy(Policy):
    """Every scale in full: the released Infinity behaviour, and what the runtime runs when it is
    given no policy. `varbench.policies.baseline.Baseline` is this policy under its method name."""
    name = "baseline"
    backbones = frozenset({"infinity", "hart"})   # every scale in full: any backbone

    def plan(self, si: int) -> ScalePlan:
        return ScalePlan()
