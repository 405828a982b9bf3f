"""The job's timing stage (issue #20 items 3 and 7): which prompts it times and how many (adaptive
policies more than static ones, by ``Policy.adaptive``), that method and baseline run the same
prompt and seeds in every pair, the re-time of an unreliable pass, and the device label.

A fake runtime stands in for the model: ``generate`` returns fixed stage times and logs its
prompts, seeds and policy, so nothing depends on the wall clock or this machine's load."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

import varbench.harness.timing as T
from varbench.harness import job as job_mod
from varbench.harness import provenance
from varbench.engine.policy import Policy
from varbench.policies.baseline import Baseline
from varbench.harness.prompts import PromptItem
from varbench.core.seeds import image_seed

TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


class FakeRuntime:
    cuda_graphs = False

    def __init__(self, ms=lambda policy, prompt: 10.0):
        self.ms, self.calls = ms, []

    def generate(self, prompts, seeds, policy, **kw):
        self.calls.append((policy.name, prompts[0], tuple(seeds)))
        t = self.ms(policy, prompts[0])
        return SimpleNamespace(timings_ms={"text": 0.0, "ar": t, "decode": 0.0, "per_scale": [t]})


class Adaptive(Policy):
    name = "adaptive_fake"
    adaptive = True

    def plan(self, si):  # never called by the fake runtime
        raise AssertionError


class Static(Adaptive):
    name = "static_fake"
    adaptive = False


def _job(timing: dict, method="adaptive_fake", n_items=24):
    cfg = OmegaConf.create({
        "method": {"name": method},
        "generation": {"h_div_w": 1.0, "pn": "0.06M", "top_k": 2, "top_p": 0.97, "cfg": 3.0, "tau": 1.0,
                       "negative_prompt": None, "seed": 7},
        "model": {},
        "timing": {**OmegaConf.to_container(OmegaConf.load(T.__file__.replace("harness/timing.py", "conf/timing/quick.yaml"))),
                   **timing},
    })
    items = [PromptItem(i, f"prompt {i}", {"tag": TAGS[i % 6]}) for i in range(n_items)]
    return SimpleNamespace(cfg=cfg, prompt_set=SimpleNamespace(items=items), device=torch.device("cpu"),
                           dtype=torch.float32, bar=lambda total, desc: SimpleNamespace(update=lambda n: None, close=lambda: None))


def test_adaptive_policies_time_more_prompts_than_static_ones_on_the_same_sample():
    rt = FakeRuntime(lambda p, prompt: 5.0 if p.name != "baseline" else 10.0)
    out = job_mod.time_stage(_job({"prompts": 6, "prompts_static": 2}), rt, Adaptive())
    assert out["n_prompts"] == 6 and out["adaptive"] is True and len(out["prompts"]) == 6
    assert sorted(p["tag"] for p in out["prompts"]) == sorted(TAGS)          # stratified: one per tag
    static = job_mod.time_stage(_job({"prompts": 6, "prompts_static": 2}, "static_fake"), FakeRuntime(), Static())
    assert static["n_prompts"] == 2 and static["prompts"] == out["prompts"][:2]   # a prefix of the same sample
    assert Baseline.adaptive is False
    b = out["by_batch"]["1"]
    assert b["n_prompts"] == 6 and b["paired"]["ar_speedup"] == pytest.approx(2.0)
    assert b["paired"]["ci_kind"] == T.CI_BOOTSTRAP


def test_every_pair_runs_the_same_prompt_and_seeds_on_both_sides():
    rt = FakeRuntime()
    out = job_mod.time_stage(_job({"prompts": 4, "warmup": 0, "repeats": 2}), rt, Adaptive())
    assert len(rt.calls) == 4 * 2 * 2
    by_index = {f"prompt {p['index']}": p["index"] for p in out["prompts"]}
    for a, b in zip(rt.calls[::2], rt.calls[1::2]):
        assert {a[0], b[0]} == {"adaptive_fake", "baseline"}                 # one of each per pair
        assert a[1:] == b[1:]                                                # same prompt, same seeds
        assert a[2] == (image_seed(7, by_index[a[1]], 0),)                   # the seed its image had


def test_an_unreliable_pass_is_retimed_once_the_load_settles(monkeypatch):
    waits = []
    monkeypatch.setattr(T, "wait_for_steady_load", lambda max_wait_s, **kw: waits.append(max_wait_s) or
                        {"waited_s": 15.0, "settled": True, "load": 0.5})
    n = {"calls": 0}

    def ms(policy, prompt):        # the first pass on a noisy machine (one baseline repeat per prompt 2x), then steady
        n["calls"] += 1
        noisy = n["calls"] <= 16 and policy.name == "baseline" and n["calls"] % 4 == 3
        return 20.0 if noisy else 10.0

    out = job_mod.time_stage(_job({"prompts": 4, "warmup": 0, "repeats": 2, "retime_unreliable": 2,
                                   "retime_max_wait_s": 30}), FakeRuntime(ms), Adaptive())
    assert [t["reliable"] for t in out["tries"]] == [False, True]            # stops at the first reliable pass
    assert out["tries"][0]["unreliable_reasons"]["1"] and out["tries"][1]["waited_s"] == 15.0
    assert waits == [30.0] and out["by_batch"]["1"]["paired"]["reliable"]
    off = job_mod.time_stage(_job({"prompts": 4, "warmup": 0, "repeats": 2}), FakeRuntime(ms), Adaptive())
    assert len(off["tries"]) == 1                                            # retime_unreliable: 0 (default)


def test_the_device_label_names_the_cpu_model(monkeypatch):
    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core  Processor\nflags\t: fpu\n"
    assert provenance.parse_cpuinfo(x86) == "AMD EPYC 9654 96-Core Processor"
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
    assert provenance.parse_cpuinfo(arm) == "ARM implementer 0x41 part 0xd0c"
    assert provenance.parse_cpuinfo("processor : 0\n") is None
    monkeypatch.setattr(provenance, "_CPU_MODEL", ["AMD EPYC 9654 96-Core Processor"])
    label = job_mod._device_name(torch.device("cpu"))
    assert label.startswith("cpu (AMD EPYC 9654 96-Core Processor, ") and f"{torch.get_num_threads()} threads)" in label
    prov = provenance.collect_provenance("cpu")
    assert prov["device"] == label and prov["cpu_model"] == "AMD EPYC 9654 96-Core Processor"
    monkeypatch.setattr(provenance, "_CPU_MODEL", [None])
    assert "unknown CPU" in job_mod._device_name(torch.device("cpu"))


def test_prompt_index_is_refused_naming_the_new_knobs():
    from varbench.harness.config import _check_timing
    from varbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="timing.prompts"):
        _check_timing({"enabled": True, "warmup": 1, "repeats": 3, "batch_sizes": [1], "prompt_index": 0})
    with pytest.raises(ConfigError, match="warmup_per_prompt"):
        _check_timing({"enabled": True, "warmup": 1, "repeats": 3, "batch_sizes": [1], "warmup_per_prompt": "lots"})


def test_the_cuda_label_names_gpu_driver_torch_cuda_cudnn_and_host(monkeypatch):
    monkeypatch.setattr(provenance, "_CPU_MODEL", ["AMD EPYC 9654 96-Core Processor"])
    monkeypatch.setattr(provenance, "_DRIVER", {"driver": "550.54.15"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H200")
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    label = provenance.device_label("cuda:0")
    assert label == (f"NVIDIA H200 (driver 550.54.15, torch {torch.__version__}, CUDA 12.4, cuDNN 90100; "
                     "host AMD EPYC 9654 96-Core Processor)")
    monkeypatch.setattr(provenance, "_DRIVER", {"driver": None})
    assert "driver ?" in provenance.device_label("cuda:0")       # no nvidia-smi: said, not guessed
