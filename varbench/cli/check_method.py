"""``python -m varbench.check_method pkg.mod:Class [--neutral JSON] [--active JSON]``: does a method,
packaged or your own, behave as a policy must?

Runs `varbench.policies.conformance` on the tiny random Infinity on the CPU (about a minute on 2
cores): neutral knobs reproduce the baseline bit for bit; active knobs change FLOPs or bits; FLOPs
and the KV cache are counted (the ratios to the baseline are printed); at batch > 1 each image gets
the decisions it gets alone. One line per check (PASS / FAIL / SKIP with its numbers).

The knobs default to the class's ``NEUTRAL`` and ``ACTIVE`` attributes; ``--neutral`` / ``--active``
give them as JSON objects instead (``--active '{"drop": 2}'``). The name is anything ``method.name``
takes: ``module:Class`` (its package importable: installed, or on PYTHONPATH / in the current
folder), an entry-point name, or a packaged method.

Exit status: 0 every check passed (or was not applicable), 1 a check failed, 2 bad input (the class
is not found or not a Policy, the JSON is not an object, the knobs do not build the policy): one line
naming the fix, no traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional


class BadInput(Exception):
    """What the user asked cannot be checked; the message says what to fix."""


def _knobs(text: Optional[str], flag: str) -> Optional[dict[str, Any]]:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{flag} is not JSON ({e.msg} at character {e.pos}): give an object, e.g. {flag} "
                       "'{\"ratio\": 0.5}'") from None
    if not isinstance(value, dict):
        raise BadInput(f"{flag} must be a JSON object of knobs (e.g. {flag} '{{\"ratio\": 0.5}}'), got {text!r}")
    return value


def load_policy_class(name: str) -> type:
    """The Policy subclass `name` resolves to (as ``method.name`` would); `BadInput` otherwise."""
    from varbench.core.registry import is_import_path
    from varbench.engine.policy import Policy
    from varbench.policies import REGISTRY

    if ":" in name and not is_import_path(name):
        raise BadInput(f"{name!r} is not a module:Class name (e.g. my_pkg.policy:MyPolicy)")
    try:
        cls = REGISTRY.load(name)
    except Exception as e:  # noqa: BLE001 - UnknownName, EntryLoadError or a packaged import error: one line
        raise BadInput(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise BadInput(f"{name!r} is {cls!r}, not a subclass of varbench.engine.policy.Policy: point at your "
                       "policy class")
    return cls


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m varbench.check_method", description=__doc__.split("\n\n")[0])
    ap.add_argument("method", help="module:Class (or a registered method name)")
    ap.add_argument("--neutral", help="JSON object: knobs under which the method must change nothing "
                                      "(default: the class's NEUTRAL)")
    ap.add_argument("--active", help="JSON object: knobs under which it must change FLOPs or bits "
                                     "(default: the class's ACTIVE)")
    args = ap.parse_args(argv)
    from varbench.policies import conformance as C
    from varbench.policies.cards import card_for

    try:
        neutral, active = _knobs(args.neutral, "--neutral"), _knobs(args.active, "--active")
        cls = load_policy_class(args.method)
        for what, given in (("NEUTRAL", neutral), ("ACTIVE", active)):
            if given is None:
                try:
                    C.declared(cls, what)
                except C.MissingSetting as e:
                    raise BadInput(f"{e}, or pass --{what.lower()} '{{...}}'") from None
        for what, knobs in (("neutral", neutral), ("active", active)):
            knobs = C.declared(cls, what.upper()) if knobs is None else knobs
            if knobs is not None:
                try:
                    cls(**dict(knobs))
                except Exception as e:  # noqa: BLE001 - the user's knobs or constructor: one line
                    raise BadInput(f"{cls.__name__}(**{what} knobs {dict(knobs)!r}) raised "
                                   f"{type(e).__name__}: {e}") from None
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    card = card_for(args.method)
    print(f"{args.method}: {card.display_name}" + (f" ({card.paper})" if card.paper else "")
          + f"; tiny random Infinity, pn {C.PN}, CPU")
    from varbench.testing import tiny_runtime

    checks = C.run_checks(cls, tiny_runtime(seed=0), neutral=neutral, active=active)
    for check in checks:
        print(check.line())
    failed = [c for c in checks if c.ok is False]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed or not applicable" if not failed else
          f"{len(failed)} of {len(checks)} checks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
