"""Prompt sets: official counts and hashes, subsets, download path, clear errors.

Counts and hashes come from shared/data/README.md (the official files as published); the test
reads those files in place and skips when the shared folder is absent.
"""
from __future__ import annotations

import collections
import hashlib
import shutil
import warnings
from pathlib import Path

import pytest

from varbench.harness import prompts as P
from varbench.harness.prompts import PromptSetError, load_prompt_set

from conftest import SHARED_DATA as DATA  # noqa: E402 - $VARBENCH_TEST_DATA or ../shared/data
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"official prompt files not at {DATA}")


@needs_data
def test_geneval_counts_tags_and_hash():
    ps = load_prompt_set({"loader": "geneval", "path": DATA / "geneval" / "evaluation_metadata.jsonl",
                          "samples_per_prompt": 4})
    assert len(ps) == 553 and ps.sha256 == P.GENEVAL_FILE.sha256
    tags = collections.Counter(it.metadata["tag"] for it in ps)
    assert tags == {"position": 100, "color_attr": 100, "two_object": 99, "colors": 94,
                    "single_object": 80, "counting": 80}  # README's per-tag counts
    first = ps.items[0]
    assert first.index == 0 and first.metadata["prompt"] == first.prompt and "include" in first.metadata
    d = ps.describe()
    assert d["sha256_matches"] is True and d["n_prompts"] == 553 and d["samples_per_prompt"] == 4


@needs_data
def test_geneval_limit_per_tag_keeps_original_indices():
    path = DATA / "geneval" / "evaluation_metadata.jsonl"
    full = load_prompt_set({"loader": "geneval", "path": path})
    sub = load_prompt_set({"loader": "geneval", "path": path, "limit_per_tag": 2})
    assert len(sub) == 12 and collections.Counter(it.metadata["tag"] for it in sub) == {t: 2 for t in
        ("single_object", "two_object", "counting", "colors", "position", "color_attr")}
    by_index = {it.index: it.prompt for it in full}
    assert all(by_index[it.index] == it.prompt for it in sub)
    assert sub.sha256 == full.sha256 and sub.items_sha256 != full.items_sha256
    assert [it.index for it in load_prompt_set({"loader": "geneval", "path": path, "limit": 3})] == [0, 1, 2]


@needs_data
def test_hpsv2_four_styles_in_order_and_subset():
    ps = load_prompt_set({"loader": "hpsv2", "path": DATA / "hpsv2"})
    assert len(ps) == 3200
    assert [ps.items[i * 800].metadata["style"] for i in range(4)] == list(P.HPS_STYLES)
    assert ps.items[0].prompt == "Spongebob depicted in the style of Dragon Ball Z."  # published example
    assert ps.files == {f"{s}.json": P.HPS_FILES[s].sha256 for s in P.HPS_STYLES}
    assert ps.describe()["sha256_matches"] is True
    photo = load_prompt_set({"loader": "hpsv2", "path": DATA / "hpsv2", "styles": ["photo"]})
    assert len(photo) == 800 and photo.items[0].index == 2400  # offset in the full concatenation
    assert photo.items[0].prompt == ps.items[2400].prompt
    with pytest.raises(PromptSetError, match="unknown HPSv2 style"):
        load_prompt_set({"loader": "hpsv2", "path": DATA / "hpsv2", "styles": ["photos"]})


@needs_data
def test_imagereward_100_prompts():
    ps = load_prompt_set({"loader": "imagereward", "path": DATA / "imagereward" / "benchmark-prompts.json",
                          "samples_per_prompt": 10})
    assert len(ps) == 100 and ps.sha256 == P.IMAGEREWARD_FILE.sha256
    assert ps.items[0].metadata == {"id": "005695-0057"}


@needs_data
def test_dpgbench_folder_digest_matches_sha256sum_listing():
    folder = DATA / "dpgbench" / "prompts"
    ps = load_prompt_set({"loader": "dpgbench", "path": folder})
    assert len(ps) == 1065 and ps.sha256 == P.DPG_FOLDER_SHA256
    # The digest is sha256 of `LC_ALL=C sha256sum *.txt` output; rebuild it from SHA256SUMS.
    lines = (DATA / "dpgbench" / "SHA256SUMS").read_text().splitlines()
    listing = sorted((ln.split()[1].split("/", 1)[1], ln.split()[0]) for ln in lines)
    text = "".join(f"{h}  {name}\n" for name, h in listing)
    assert hashlib.sha256(text.encode()).hexdigest() == ps.sha256
    ids = [it.metadata["id"] for it in ps]
    assert ids[:3] == ["0", "1", "2"] and ids.index("10") == 10  # numeric, not lexicographic
    assert ids.index("partiprompts2") == ids.index("partiprompts1") + 1


def test_smoke_set_is_builtin():
    ps = load_prompt_set({"loader": "smoke", "name": "smoke"})
    assert len(ps) == 8 and all("tag" in it.metadata for it in ps)
    assert {it.metadata["tag"] for it in ps} >= {"single_object", "two_object", "counting", "colors",
                                                  "position", "color_attr"}
    assert ps.sha256 == load_prompt_set({"loader": "smoke"}).sha256
    assert len(load_prompt_set({"loader": "smoke", "limit_per_tag": 1})) == 6


def test_missing_file_error_names_file_path_url_and_keys(tmp_path):
    missing = tmp_path / "nope" / "evaluation_metadata.jsonl"
    with pytest.raises(PromptSetError) as ei:
        load_prompt_set({"loader": "geneval", "path": missing})
    msg = str(ei.value)
    for needle in ("evaluation_metadata.jsonl", str(missing), P.GENEVAL_FILE.urls[0],
                   "benchmark.path=", "benchmark.allow_download=true"):
        assert needle in msg
    with pytest.raises(PromptSetError, match="benchmark.path="):
        load_prompt_set({"loader": "dpgbench", "path": tmp_path / "none"})


def test_bad_config_values():
    with pytest.raises(PromptSetError, match="Did you mean 'geneval'"):
        load_prompt_set({"loader": "genevl"})
    with pytest.raises(PromptSetError, match="limit"):
        load_prompt_set({"loader": "smoke", "limit": 0})
    with pytest.raises(PromptSetError, match="rewriter"):
        load_prompt_set({"loader": "smoke", "rewriter": "gpt"})


@needs_data
def test_download_verifies_pinned_hash(tmp_path):
    src = tmp_path / "mirror" / "benchmark-prompts.json"
    src.parent.mkdir()
    shutil.copy(DATA / "imagereward" / "benchmark-prompts.json", src)
    dest = tmp_path / "data" / "benchmark-prompts.json"
    cfg = {"loader": "imagereward", "path": dest, "allow_download": True, "url": src.as_uri()}
    ps = load_prompt_set(cfg)
    assert dest.is_file() and len(ps) == 100 and ps.sha256 == P.IMAGEREWARD_FILE.sha256
    # A mirror serving different bytes is refused and nothing is written.
    src.write_bytes(src.read_bytes().replace(b"cyberpunk", b"steampunk"))
    dest2 = tmp_path / "data2" / "benchmark-prompts.json"
    with pytest.raises(PromptSetError, match="sha256 mismatch") as ei:
        load_prompt_set({**cfg, "path": dest2})
    assert "nothing was written" in str(ei.value)
    assert not dest2.exists() and not (dest2.parent.exists() and any(dest2.parent.iterdir()))


def test_download_failure_lists_urls(tmp_path):
    with pytest.raises(PromptSetError, match="could not download"):
        load_prompt_set({"loader": "geneval", "path": tmp_path / "e.jsonl", "allow_download": True,
                         "url": (tmp_path / "absent.jsonl").as_uri()})


@needs_data
def test_modified_file_warns_and_records_actual_hash(tmp_path):
    path = tmp_path / "evaluation_metadata.jsonl"
    lines = (DATA / "geneval" / "evaluation_metadata.jsonl").read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:5]))
    with pytest.warns(UserWarning, match="differs from the official"):
        ps = load_prompt_set({"loader": "geneval", "path": path})
    d = ps.describe()
    assert len(ps) == 5 and d["sha256_matches"] is False
    assert d["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_official_file_loads_without_warning():
    if not DATA.is_dir():
        pytest.skip("no shared data")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_prompt_set({"loader": "imagereward", "path": DATA / "imagereward" / "benchmark-prompts.json"})


def test_registered_loader_gets_selection_applied():
    def toy(cfg):
        items = [P.PromptItem(i, f"p{i}", {"tag": "t"}) for i in range(5)]
        return P.PromptSet(name="toy", items=items, source_path=None, sha256="x" * 64, samples_per_prompt=3)

    P.register_loader("toy_test", toy)
    try:
        ps = load_prompt_set({"loader": "toy_test", "limit": 2})
        assert [it.index for it in ps] == [0, 1] and ps.samples_per_prompt == 3 and ps.full_size == 5
        assert ps.sha256 == "x" * 64 and ps.loader == "toy_test"
        P.register_loader("toy_lazy", "varbench.harness.prompts:_load_smoke")  # lazy "module:function"
        assert len(load_prompt_set({"loader": "toy_lazy"})) == 8
    finally:
        P.LOADERS.pop("toy_test", None)
        P.LOADERS.pop("toy_lazy", None)


@needs_data
@pytest.mark.parametrize("name,count", [("geneval", 553), ("hpsv2", 3200), ("imagereward", 100),
                                        ("dpgbench", 1065), ("smoke", 8)])
def test_benchmark_configs_load(name, count):
    omegaconf = pytest.importorskip("omegaconf")
    conf = Path(__file__).resolve().parents[2] / "varbench" / "conf" / "benchmark" / f"{name}.yaml"
    cfg = omegaconf.OmegaConf.create({"paths": {"data_dir": str(DATA)}, "benchmark": omegaconf.OmegaConf.load(conf)})
    ps = load_prompt_set(cfg.benchmark)
    assert len(ps) == count and ps.name == name
    assert ps.describe()["sha256_matches"] in (True, None)  # None: the smoke set has no pin


def test_toy_loader_is_registered_lazily():
    pytest.importorskip("varbench.toy.world")
    ps = load_prompt_set({"loader": "toy", "n_prompts": 12, "seed": 0, "samples_per_prompt": 2, "limit": 5})
    assert len(ps) == 5 and ps.full_size == 12 and ps.samples_per_prompt == 2 and ps.loader == "toy"
