"""One colour per method family, one marker per preset: the same in every figure.

Usage::

    from varbench.analysis.colours import family_colour, preset_markers, family_name
    family_colour("nova")                  # "#D55E00", in the scatter, the entropy curves, every figure
    family_colour("my_plugin")             # an outside method: a fixed colour picked by a hash of its name
    marks = preset_markers(frame)          # {(family, preset): marker}: presets of one family told apart

A *family* is the policy (the frame's ``method`` column, the record's ``method.name``: ``nova``
for ``nova``, ``nova_fast`` and ``nova_toy``); a *preset* is the config chosen (``method_preset``).
The known families get fixed colours from the Okabe-Ito palette (distinguishable with the common
colour-vision deficiencies, dark enough for text on white), the baseline black. A family varbench
does not know (a plugin) gets a colour from a second colour-blind-safe list (Paul Tol's muted
scheme) picked by a hash of its name, so it keeps its colour from run to run and machine to machine;
two outside families may share one (the legend names each).
"""
from __future__ import annotations

import hashlib
from typing import Mapping

#: the registered families (varbench/policies/__init__.py REGISTRY) -> colour
FAMILY_COLOURS: dict[str, str] = {
    "baseline": "#000000",
    "fastvar": "#0072B2",        # blue
    "nova": "#D55E00",           # vermillion
    "toprovar": "#009E73",       # bluish green
    "skipvar": "#CC79A7",        # reddish purple
    "skipvar_fixed": "#E69F00",  # orange
    "skip_last": "#56B4E9",      # sky blue
    "compose": "#882255",        # wine (Tol): compositions such as nova_on_fastvar
    "scalekv": "#332288",        # indigo (Tol): the memory method
}
#: colours for families not listed above, chosen by a hash of the name (from Tol's muted scheme,
#: leaving out the tones close to a known family's: its teal, purple and light blue)
EXTRA_COLOURS: tuple[str, ...] = ("#117733", "#999933", "#661100", "#888888")
#: legend words for the known families
FAMILY_NAMES: dict[str, str] = {
    "baseline": "baseline", "fastvar": "FastVAR", "nova": "NOVA", "toprovar": "ToProVAR", "skipvar": "SkipVAR",
    "skipvar_fixed": "SkipVAR fixed skip", "skip_last": "skip last scales", "compose": "composed methods",
    "scalekv": "ScaleKV",
}
#: markers for the presets of one family, in order (filled shapes: a hollow one means "unreliable")
PRESET_MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">", "p", "8")


def family_colour(family) -> str:
    """The colour of a family (``method`` column value); a stable hash-picked one for unknown names."""
    name = str(family)
    if name in FAMILY_COLOURS:
        return FAMILY_COLOURS[name]
    # hashlib, not hash(): Python salts str hashes per process, the colour must not change between runs
    k = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return EXTRA_COLOURS[k % len(EXTRA_COLOURS)]


def family_name(family) -> str:
    """Legend words for a family (the policy name itself for one varbench does not know)."""
    return FAMILY_NAMES.get(str(family), str(family))


def preset_markers(frame) -> dict[tuple[str, str], str]:
    """``{(family, preset): marker}`` for the frame's rows: the presets of each family, sorted, get
    :data:`PRESET_MARKERS` in turn, so two figures drawn from one frame mark a preset alike."""
    fam = frame["method"].astype(str).tolist() if "method" in frame.columns else [""] * len(frame)
    pre = (frame["method_preset"].astype(str).tolist() if "method_preset" in frame.columns
           else frame.get("method_label", frame.get("method")).astype(str).tolist())
    out: dict[tuple[str, str], str] = {}
    by_family: dict[str, list[str]] = {}
    for f, p in zip(fam, pre):
        by_family.setdefault(f, [])
        if p not in by_family[f]:
            by_family[f].append(p)
    for f, presets in by_family.items():
        for k, p in enumerate(sorted(presets)):
            out[(f, p)] = PRESET_MARKERS[k % len(PRESET_MARKERS)]
    return out


def row_style(row: Mapping, markers: Mapping[tuple[str, str], str]) -> tuple[str, str]:
    """``(colour, marker)`` of one frame row (``markers``: :func:`preset_markers` of its frame)."""
    fam = str(row.get("method"))
    pre = row.get("method_preset")
    pre = str(pre if isinstance(pre, str) and pre else row.get("method_label", fam))
    return family_colour(fam), markers.get((fam, pre), "o")
