"""How robust is ToProVAR's Table 10 order to the knobs we reconstructed? Analytic FLOPs x fewer of the
full method and its ablation rows over the plausible range of each reconstructed knob.

    python -m experiments.toprovar_sensitivity                 # print the table (about 8 CPU-minutes)
    python -m experiments.toprovar_sensitivity --write         # regenerate its section of docs/methods.md
    python -m experiments.toprovar_sensitivity --check         # exit 1 if that section no longer matches
    python -m experiments.toprovar_sensitivity --knobs beta    # one knob only (a quick look; no --write)

The paper does not give `layer_skip_prune`, `alpha_min`/`alpha_max`, `beta` or `detail_min_R`; each
default (ToProVARKnobs, varbench/policies/toprovar.py) is a reconstruction. Table 10 (Infinity-2B, L40 latency) orders
the rows scale only 4.5x > scale + layer 3.7x > full 3.4x > scale + token 2.7x. This script varies one
knob at a time (the others at their defaults) in every row's preset and says, per setting, whether
that order holds in FLOPs, so a reader sees whether it is robust or sits on a knife edge.

FLOPs come from experiments/flops_table.py (the same plans-only count and the same synthetic scenario
as every FLOPs number in docs/methods.md: 2B, 1024², batch 1, CFG on, the low-entropy fraction crosses
tau at 32², the first 3 and last 4 blocks look Global at the SVD scale). They are FLOPs under that
scenario, not latencies and not predictions for real prompts; a row that ties another (2 decimals)
is shown as "=". The fixed-exit row depends on none of these knobs and is left out.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Sequence

from experiments.flops_table import x_fewer

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "methods.md"
BEGIN, END = "<!--toprovar-sensitivity:begin-->", "<!--toprovar-sensitivity:end-->"
SECTION = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.S)

#: Table 10's rows in the paper's order (fastest first), with their presets and the paper's speed-ups
ROWS: tuple[tuple[str, str, float], ...] = (
    ("scale only", "toprovar_scale_only", 4.5),
    ("scale + layer", "toprovar_scale_layer", 3.7),
    ("full", "toprovar", 3.4),
    ("scale + token", "toprovar_scale_token", 2.7),
)

#: each reconstructed knob's plausible range: settings as ((knob, value), ...), one knob varied at a
#: time (alpha as its two ends). Defaults (toprovar.ToProVARKnobs) are in every range.
GRID: dict[str, list[tuple[tuple[str, float], ...]]] = {
    # share of a Detail layer's tokens Eq. 6 must prune for the full method to skip the layer (default 0.5)
    "layer_skip_prune": [(("layer_skip_prune", v),) for v in (0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7)],
    # Eq. 6's prune-probability range (default 0.3 / 0.9; the notes suggest alpha_min 0.1-0.3)
    "alpha": [(("alpha_min", lo), ("alpha_max", 0.9)) for lo in (0.1, 0.2, 0.3, 0.4, 0.5)]
             + [(("alpha_min", 0.3), ("alpha_max", hi)) for hi in (0.8, 0.95, 1.0)],
    # R = exp(-beta (sigma1/sigma2 - 1)) (default 1.0; "beta > 0" is all the paper says)
    "beta": [(("beta", v),) for v in (0.25, 0.5, 1.0, 2.0, 4.0)],
    # Detail iff R >= detail_min_R (default 0.5)
    "detail_min_R": [(("detail_min_R", v),) for v in (0.3, 0.4, 0.5, 0.6, 0.7)],
}
DEFAULTS = {"layer_skip_prune": 0.5, "alpha_min": 0.3, "alpha_max": 0.9, "beta": 1.0, "detail_min_R": 0.5}


def _setting_label(setting: Sequence[tuple[str, float]]) -> str:
    label = ", ".join(f"{k} {v:g}" for k, v in setting)
    return label + (" (default)" if all(DEFAULTS[k] == v for k, v in setting) else "")


def order_of(values: dict[str, float]) -> str:
    """The rows fastest first, ``>`` between them, ``=`` where two tie at 2 decimals."""
    names = sorted(values, key=lambda n: -values[n])
    out = names[0]
    for a, b in zip(names, names[1:]):
        out += (" = " if f"{values[a]:.2f}" == f"{values[b]:.2f}" else " > ") + b
    return out


def paper_order_holds(values: dict[str, float]) -> bool:
    """Strictly scale only > scale + layer > full > scale + token at 2 decimals."""
    v = [round(values[name], 2) for name, _, _ in ROWS]
    return all(a > b for a, b in zip(v, v[1:]))


def compute(knobs: Sequence[str] = tuple(GRID)) -> list[dict]:
    """One result per (knob, setting): {"knob", "setting", "values": {row: x fewer}, "order", "holds"}."""
    out = []
    for knob in knobs:
        if knob not in GRID:
            raise SystemExit(f"unknown knob {knob!r}; choose from {', '.join(GRID)}")
        for setting in GRID[knob]:
            values = {name: x_fewer(preset, overrides=tuple(setting)) for name, preset, _ in ROWS}
            out.append({"knob": knob, "setting": _setting_label(setting), "values": values,
                        "order": order_of(values), "holds": paper_order_holds(values)})
    return out


def render(results: list[dict]) -> str:
    """The markdown table and a one-line verdict per knob (what `--write` puts between the markers)."""
    head = " | ".join(f"{name} ({paper}x)" for name, _, paper in ROWS)
    lines = ["Generated by `python -m experiments.toprovar_sensitivity --write` (do not edit): FLOPs x fewer "
             "(2B, 1024², cfg 4, the scenario of `experiments/flops_table.py`), one reconstructed knob varied at "
             "a time in every row's preset; the paper's latency speed-up in the header. "
             "✓ = the paper's order (scale only > scale + layer > full > scale + token) holds.", "",
             f"| knob | setting | {head} | order (fastest first) | paper's order |",
             "|---|---|" + "---:|" * len(ROWS) + "---|:---:|"]
    for r in results:
        cells = " | ".join(f"{r['values'][name]:.2f}" for name, _, _ in ROWS)
        lines.append(f"| `{r['knob']}` | {r['setting']} | {cells} | {r['order']} | {'✓' if r['holds'] else '✗'} |")
    lines.append("")
    for knob in dict.fromkeys(r["knob"] for r in results):
        rs = [r for r in results if r["knob"] == knob]
        held = [r["setting"] for r in rs if r["holds"]]
        verdict = ("holds at every setting" if len(held) == len(rs) else "fails at every setting" if not held
                   else f"holds at {len(held)} of {len(rs)} settings: {'; '.join(held)}")
        lines.append(f"- `{knob}`: the paper's order {verdict}.")
    return "\n".join(lines) + "\n"


def section(text: str) -> str | None:
    """The generated text between the markers of ``text`` (None without markers)."""
    m = SECTION.search(text)
    return None if m is None else m.group(1)


def write(doc: Path = DOC, results: list[dict] | None = None) -> None:
    text = doc.read_text()
    if section(text) is None:
        raise SystemExit(f"{doc} has no {BEGIN} ... {END} markers; add them where the table belongs")
    body = render(results if results is not None else compute())
    doc.write_text(SECTION.sub(lambda _: f"{BEGIN}\n{body}{END}", text, count=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--knobs", nargs="*", default=list(GRID), help=f"knobs to vary (default: all of {', '.join(GRID)})")
    ap.add_argument("--write", action="store_true", help="regenerate the section of docs/methods.md (every knob)")
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/methods.md's section differs")
    a = ap.parse_args(argv)
    if (a.write or a.check) and list(a.knobs) != list(GRID):
        ap.error("--write and --check use every knob; drop --knobs")
    results = compute(a.knobs)
    body = render(results)
    if a.write:
        write(DOC, results)
        print(f"wrote the ToProVAR sensitivity table into {DOC.relative_to(ROOT)}")
        return 0
    if a.check:
        same = section(DOC.read_text()) == body
        print("docs/methods.md's ToProVAR sensitivity table matches the generator" if same else
              "docs/methods.md's ToProVAR sensitivity table differs: run python -m experiments.toprovar_sensitivity --write")
        return 0 if same else 1
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
