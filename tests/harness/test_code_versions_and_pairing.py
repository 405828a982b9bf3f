"""Nothing stale passes silently (issue 21 items 4-6): tables name the commits when records come
from different code, a relaunch says which commit wrote the entry it skips, the fidelity scorer's
version info holds no machine path, and a pairing refusal names the weight file that differs."""
from __future__ import annotations

import json

import pytest

pd = pytest.importorskip("pandas")

from tests.analysis.test_aggregate import GEN, make_record, write  # noqa: E402
from varbench.analysis.aggregate import AggregationError, aggregate  # noqa: E402


def _git(sha, dirty=False):
    return {"git": {"sha": sha, "dirty": dirty, "diff_sha256": None, "root": "/somewhere"}}


def test_table_notes_name_the_commits_when_records_come_from_different_code(tmp_path):
    root = tmp_path / "store"
    write(root, make_record("b", "baseline", 100, 120, 10.0, {"hpsv2/score": (0.3, 0.01)}, provenance=_git("a" * 40)))
    write(root, make_record("m", "nova", 50, 70, 5.0, {"hpsv2/score": (0.29, 0.01)}, provenance=_git("c" * 40, True)))
    [g] = aggregate(root, tmp_path / "out", figures=False).groups
    md = (g.folder / "table.md").read_text()
    assert "Records from 2 code versions" in md
    assert "aaaaaaaaaaaa (baseline)" in md and "cccccccccccc+dirty (nova)" in md
    tidy = pd.read_csv(tmp_path / "out" / "tidy.csv")
    assert set(tidy["git_sha"]) == {"a" * 40, "c" * 40}


def test_no_code_version_note_when_every_record_is_one_commit(tmp_path):
    root = tmp_path / "store"
    for eid, method in (("b", "baseline"), ("m", "nova")):
        write(root, make_record(eid, method, 100, 120, 10.0, {"hpsv2/score": (0.3, 0.01)}, provenance=_git("a" * 40)))
    [g] = aggregate(root, tmp_path / "out", figures=False).groups
    assert "code versions" not in (g.folder / "table.md").read_text()


@pytest.mark.integration
def test_a_relaunch_says_which_commit_wrote_the_entry_it_skips(tmp_path, capsys):
    from varbench.harness.job import run_job
    from varbench.harness.provenance import git_info
    from varbench.testing.jobs import job_config

    cfg = job_config(tmp_path, "evaluator=[]", "benchmark.limit=1", "runtime.progress=false", "timing=none")
    entry = run_job(cfg)
    capsys.readouterr()
    # the same commit
    run_job(cfg)
    now = git_info()["sha"]
    out = capsys.readouterr().out
    if now:
        assert f"written by commit {now[:12]}" in out and "this code" in out
    # an entry an older commit wrote (its record says so; the seal is redone to match)
    from varbench.harness.records import RunEntry

    rec = json.loads((entry / "record.json").read_text())
    rec["provenance"]["git"] = {"sha": "0123456789ab" + "0" * 28, "dirty": False}
    e = RunEntry.from_dir(entry)
    e.write_record(rec, force=True)
    e.mark_done()
    run_job(cfg)
    out = capsys.readouterr().out
    assert "skip (finished)" in out and "written by commit 0123456789ab;" in out and "runtime.force=true" in out


def test_fidelity_version_info_holds_no_path_and_agrees_across_hosts(tmp_path, monkeypatch):
    import torch

    from varbench.evaluators.fidelity import FidelityEvaluator

    infos = []
    for home in ("host_a/hub", "host_b/elsewhere/hub"):
        monkeypatch.setattr(torch.hub, "get_dir", lambda h=home: str(tmp_path / h))
        ev = FidelityEvaluator(lpips="auto")
        ev.setup("cpu")
        infos.append(ev.version_info())
    assert infos[0] == infos[1], "the same scorer on two hosts must hash the same"
    assert infos[0]["lpips"].startswith("skipped") and "alexnet-owt-7be5be79.pth" in infos[0]["lpips"]
    assert str(tmp_path) not in json.dumps(infos[0]) and "/" not in infos[0]["lpips"]


def test_lpips_on_is_named_by_file_and_sha256(tmp_path, monkeypatch):
    import hashlib

    import torch

    from varbench.evaluators import fidelity

    ck = tmp_path / "hub" / "checkpoints"
    ck.mkdir(parents=True)
    (ck / "alexnet-owt-7be5be79.pth").write_bytes(b"stand-in weights")
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))

    class Stub:   # torchmetrics' LPIPS would load the file; only the version info is under test
        def __init__(self, **k):
            pass

        def to(self, d):
            return self

        def eval(self):
            return self

    import torchmetrics.image.lpip as lpip

    monkeypatch.setattr(lpip, "LearnedPerceptualImagePatchSimilarity", Stub)
    ev = fidelity.FidelityEvaluator(lpips=True)
    ev.setup("cpu")
    info = ev.version_info()
    assert info["lpips"] == "on (alex, alexnet-owt-7be5be79.pth)"
    assert info["lpips_weights_sha256"] == hashlib.sha256(b"stand-in weights").hexdigest()
    assert str(tmp_path) not in json.dumps(info)


def test_a_refusal_names_the_weight_file_that_differs(tmp_path):
    root = tmp_path / "store"
    base = make_record("b", "baseline", 100, 120, 10.0, {"hpsv2/score": (0.3, 0.01)}, generation=GEN)
    meth = make_record("m", "nova", 50, 70, 5.0, {"hpsv2/score": (0.29, 0.01)}, generation=GEN)
    meth["model"]["weights"] = {"infinity_2b_reg.pth": "8bf8" + "1" * 60}    # retrained weights
    write(root, base)
    write(root, meth)
    with pytest.raises(AggregationError) as info:
        aggregate(root, tmp_path / "out", figures=False)
    msg = str(info.value)
    assert "weights infinity_2b_reg.pth (sha256 8bf811111111… vs baseline sha256 000000000000…)" in msg, msg
    assert "pair_key (" not in msg
