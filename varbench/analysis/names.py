"""The one name a row goes by in the table, the figures and the image grid.

A row has a preset id (``method_preset``, what ``method=`` takes: ``nova_toy``) and a label
(``method_label``, the preset's ``label:``: ``NOVA (small-schedule thresholds)``). Showing both
says most things twice (``baseline | Baseline``, ``fastvar_light | FastVAR light``), so a row
shows one: **the label when it says more than the id, else the id**. The label says more when
it has a word the id lacks (compared case-blind, on letters and digits; ``=`` and ``.`` kept so
knob values such as ``ssim 0.84`` or ``r=0.4`` count): ``NOVA (reconstructed)`` tells the
reader what ``nova`` does not, ``Skip last 2 scales`` adds "scales" only, which is why a small
list of filler words never counts. The id wins ties because it is what a reader types to rerun
the row and what ``python -m varbench.list`` lists beside its label; ``table.csv`` and ``tidy.csv``
keep both columns.

Usage::

    from varbench.analysis.names import display_name, display_names
    display_name({"method_preset": "nova_toy", "method_label": "NOVA (small-schedule thresholds)"})
    names = display_names(frame)     # one per row; two rows under one name get their entry id
"""
from __future__ import annotations

import math
import re
from typing import Mapping

#: words a label may add without saying more than its id
FILLER = frozenset({"a", "an", "the", "of", "scale", "scales", "method", "only", "and", "with", "on", "over", "to"})


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^0-9a-z=.]+", str(text).lower().replace("_", " ")) if w and w != "."}


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v) != ""


def says_more(label, preset) -> bool:
    """True when ``label`` has a word (not :data:`FILLER`) that ``preset`` lacks."""
    if not _present(label):
        return False
    if not _present(preset):
        return True
    return bool(_words(label) - _words(preset) - FILLER)


def display_name(row: Mapping) -> str:
    """The label when it :func:`says_more` than the preset id, else the id (``method`` when the
    row has no preset); a ``module:Class`` method in it reads as its card's display name."""
    preset = row.get("method_preset")
    preset = preset if _present(preset) else row.get("method")
    label = row.get("method_label")
    name = str(label) if says_more(label, preset) else str(preset if _present(preset) else label)
    return with_card_name(name, row.get("method"))


def with_card_name(text: str, method) -> str:
    """`text` with the ``module:Class`` name `method` replaced by its card's display name (a packaged
    or registered name, or a text without it, unchanged)."""
    from varbench.core.registry import is_import_path

    if not is_import_path(method) or str(method) not in text:
        return text
    from varbench.policies.cards import method_name   # here: only a plugin's row needs a policy module

    return text.replace(str(method), method_name(str(method)))


def display_names(frame) -> list[str]:
    """:func:`display_name` of each row of ``frame``; names that two rows share get ``[<entry id>]``
    (the same preset run with other knobs must never read as one row)."""
    rows = [r for _, r in frame.iterrows()]
    names = [display_name(r) for r in rows]
    return [f"{n} [{str(r.get('entry_id'))[:8]}]" if names.count(n) > 1 and _present(r.get("entry_id")) else n
            for n, r in zip(names, rows)]
