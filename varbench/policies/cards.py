"""A method's card from its name: the one lookup figures, tables, listings and docs read.

Usage::

    from varbench.policies.cards import card_for, method_colour, method_marker
    card_for("nova").display_name             # "NOVA": the card on varbench.policies.nova.NOVA
    card_for("my_pkg.mod:MyPolicy")           # a plugin's own card (or a default one: "MyPolicy")
    method_colour("nova")                     # "#D55E00"
    method_colour("my_plugin")                # no colour on its card: a fixed one picked by a hash of the name

A name resolves as ``method.name`` does in a config (`varbench.policies.REGISTRY`: packaged names,
entry points of installed packages, ``module:Class``). A name that does not resolve, or whose class
cannot be imported here (a record from another machine), gets the default card
(`varbench.engine.policy.default_display_name`), so a figure or a table never fails on a method.

Colours: the packaged methods' cards name theirs (the Okabe-Ito palette, distinguishable with the
common colour-vision deficiencies, the baseline black; Tol's wine and indigo for compose and
scalekv). A method whose card names none gets one from a second colour-blind-safe list (Paul Tol's
muted scheme, leaving out the tones close to a packaged method's), picked by a hash of its name, so it
keeps its colour from run to run and machine to machine; two such methods may share one (the legend
names each).
"""
from __future__ import annotations

import hashlib
import logging

from varbench.engine.policy import MethodCard, Policy, default_display_name

log = logging.getLogger("varbench")

#: colours for methods whose card names none, chosen by a hash of the name (Tol's muted scheme,
#: leaving out its teal, purple and light blue, close to packaged methods' colours)
EXTRA_COLOURS: tuple[str, ...] = ("#117733", "#999933", "#661100", "#888888")
#: the marker of a method whose card names none
DEFAULT_MARKER = "p"


def policy_class(name: str):
    """The policy class a method name resolves to (`varbench.policies.REGISTRY`), or None when it
    does not resolve or import here (never raises)."""
    from varbench.policies import REGISTRY

    try:
        cls = REGISTRY.load(str(name))
    except Exception:  # noqa: BLE001 - a record's method may not import on this machine: default card
        return None
    return cls if isinstance(cls, type) and issubclass(cls, Policy) else None


def card_for(name: str) -> MethodCard:
    """The card of the method `name` (its class's `Policy.method_card`), or the default card when its
    class cannot be found or imported here."""
    name = str(name)
    cls = policy_class(name)
    if cls is None:
        return MethodCard(display_name=default_display_name(name))
    try:
        return cls.method_card(name)
    except Exception as e:  # noqa: BLE001 - someone else's class: a figure must still draw
        log.warning("method %s: its card cannot be read (%s); showing it by its name", name, e)
        return MethodCard(display_name=default_display_name(name))


def hash_colour(name: str) -> str:
    """A colour of :data:`EXTRA_COLOURS` picked by a hash of `name` (the same in every process)."""
    # hashlib, not hash(): Python salts str hashes per process, the colour must not change between runs
    k = int.from_bytes(hashlib.sha256(str(name).encode()).digest()[:4], "big")
    return EXTRA_COLOURS[k % len(EXTRA_COLOURS)]


def method_colour(name: str) -> str:
    """The colour of method `name` in every figure: its card's, else :func:`hash_colour` of the name."""
    return card_for(str(name)).colour or hash_colour(str(name))


def method_name(name: str) -> str:
    """The legend and table words for method `name` (its card's display name)."""
    return card_for(str(name)).display_name


def method_marker(name: str) -> str:
    """The marker of method `name` where one marker stands for a method: its card's, else
    :data:`DEFAULT_MARKER`."""
    return card_for(str(name)).marker or DEFAULT_MARKER
