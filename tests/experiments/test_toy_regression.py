"""CI gate: toy-model quality and FLOPs of each method's default against committed references.

The reference (results/curated/toy_regression.json) was written by
`python -m experiments.toy_regression --write` on the shipped toy weights; FLOPs ratios are exact
counts, toy GenEval scores are deterministic on the CPU (fixed prompts and seeds), and the stored
tolerances absorb a couple of flipped prompts on another machine.
"""
import json

import pytest

from experiments import toy_regression as tr


@pytest.fixture(scope="module")
def reference():
    return json.loads(tr.REFERENCE.read_text())


@pytest.mark.integration
def test_every_method_default_stays_within_its_reference(reference):
    measured = tr.measure(methods=list(reference["methods"]), n_prompts=reference["n_prompts"])
    assert tr.check(measured, reference) == []


@pytest.mark.integration
def test_a_much_more_aggressive_default_is_caught(reference):
    """FastVAR (generalised) pruning 90% at its two pruned scales instead of 40/50%: the gate must fail."""
    measured = tr.measure(methods=["baseline", "fastvar_generalised"], n_prompts=reference["n_prompts"],
                          knob_overrides={"fastvar_generalised": {"prune": {-4: 0.9, -3: 0.9}}})
    ref = {**reference, "methods": {k: reference["methods"][k] for k in ("baseline", "fastvar_generalised")}}
    problems = tr.check(measured, ref)
    assert any(p.startswith("fastvar_generalised: FLOPs ratio") for p in problems)
    assert all(not p.startswith("baseline") for p in problems)


def test_check_prints_a_verdict_either_way(reference, monkeypatch, capsys):
    """A CI gate says PASS as well as FAIL (measure() is replaced: its own tests are above)."""
    monkeypatch.setattr(tr, "measure", lambda: reference["methods"])
    assert tr.main(["--check"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("PASS:")
    worse = {k: {**v, "toy_geneval": v["toy_geneval"] - 10 * reference["quality_tol"]} for k, v in reference["methods"].items()}
    monkeypatch.setattr(tr, "measure", lambda: worse)
    assert tr.main(["--check"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("FAIL:")
