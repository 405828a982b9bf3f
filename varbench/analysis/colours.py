"""One colour per method family, one marker per preset: the same in every figure.

Usage::

    from varbench.analysis.colours import family_colour, preset_markers, family_name
    family_colour("nova")                  # "#D55E00", in the scatter, the entropy curves, every figure
    family_colour("my_plugin")             # an outside method: a fixed colour picked by a hash of its name
    marks = preset_markers(frame)          # {(family, preset): marker}: presets of one family told apart

A *family* is the policy (the frame's ``method`` column, the record's ``method.name``: ``nova``
for ``nova``, ``nova_fast`` and ``nova_toy``); a *preset* is the config chosen (``method_preset``).
A family's colour and legend words are its policy's card (`varbench.engine.policy.MethodCard`, read by
`varbench.policies.cards.card_for`): the packaged methods' cards hold the Okabe-Ito palette
(distinguishable with the common colour-vision deficiencies, dark enough for text on white), the
baseline black. A family whose card names no colour (a plugin, or a method whose class does not
import here) gets one from a second colour-blind-safe list (Paul Tol's muted scheme,
`varbench.policies.cards.EXTRA_COLOURS`) picked by a hash of its name, so it keeps its colour from run
to run and machine to machine; two such families may share one (the legend names each).
"""
from __future__ import annotations

from typing import Mapping

#: markers for the presets of one family, in order (filled shapes: a hollow one means "unreliable")
PRESET_MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">", "p", "8")


def family_colour(family) -> str:
    """The colour of a family (``method`` column value): its card's, else a stable hash-picked one."""
    from varbench.policies.cards import method_colour   # here: reading a frame needs no policy module

    return method_colour(str(family))


def family_name(family) -> str:
    """Legend words for a family: its card's display name (a method without a card: its name)."""
    from varbench.policies.cards import method_name

    return method_name(str(family))


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
