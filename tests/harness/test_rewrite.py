"""benchmark.rewrite (issue 36 §2): generate from rewritten prompts, score the prompts as written, keep
every existing store key, and say "rewriter: on/off" in the tables."""
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from varbench.core.errors import ConfigError, GarbledFileError, MalformedFileError
from varbench.core.hashing import entry_hash, generation_hash
from varbench.harness.job import pin_runtime
from varbench.harness.prompts import SMOKE_METADATA, PromptSetError, load_prompt_set, read_rewrite_file

CONF = Path(__file__).resolve().parents[2] / "varbench" / "conf"
PROMPTS = [m["prompt"] for m in SMOKE_METADATA]


def _rewrites(tmp_path, skip=0, name="rw.json"):
    path = tmp_path / name
    path.write_text(json.dumps({p: f"{p}, highly detailed photograph" for p in PROMPTS[skip:]}, indent=1))
    return path


# -- the file --------------------------------------------------------------------------------------
def test_a_rewrite_file_is_infinitys_prompt_to_rewrite_object(tmp_path):
    assert read_rewrite_file(_rewrites(tmp_path))[PROMPTS[0]] == f"{PROMPTS[0]}, highly detailed photograph"


@pytest.mark.parametrize("text, where, what", [
    ('{\n "a": "b",\n "c": \n}', ":4:", "not valid JSON"),              # the parser's line
    ('["a", "b"]', ":1:", "not a JSON object"),
    ('{\n "a": "x",\n "b": "y",\n "a": "z"\n}', ":4:", "given twice"),     # the repeated key's line
    ('{\n "a": "x",\n "b": 3\n}', ":3:", "not a non-empty text"),
    ('{\n "a": "  "\n}', ":2:", "not a non-empty text"),
])
def test_a_malformed_rewrite_file_names_file_and_line(tmp_path, text, where, what):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(MalformedFileError, match=what) as info:
        read_rewrite_file(path)
    assert str(info.value).startswith(f"{path}{where}")


def test_a_missing_rewrite_file_is_named_with_its_fix(tmp_path):
    with pytest.raises(PromptSetError, match="(?s)searched: .*nope.json.*benchmark.rewrite="):
        read_rewrite_file(tmp_path / "nope.json")


# -- the prompt set ----------------------------------------------------------------------------------
def test_generation_reads_the_rewrites_scoring_the_prompts_as_written(tmp_path):
    plain = load_prompt_set({"loader": "smoke"})
    rw = load_prompt_set({"loader": "smoke", "rewrite": str(_rewrites(tmp_path)), "limit": 3})
    assert [it.prompt for it in rw.items] == PROMPTS[:3]                       # scored as written
    assert [it.metadata for it in rw.items] == [it.metadata for it in plain.items[:3]]
    assert rw.items[1].generation_prompt == f"{PROMPTS[1]}, highly detailed photograph"
    assert all(it.rewritten for it in rw.all_items)                            # batch companions too
    assert plain.items[0].generation_prompt == PROMPTS[0] and plain.items[0].rewritten is None
    # keys: unchanged without a rewrite file; the file's bytes move them with one
    assert plain.key_sha256 == plain.sha256 and "rewrite" not in plain.describe()
    assert rw.key_sha256 != rw.sha256 and rw.sha256 == plain.sha256
    block = rw.describe()
    assert block["rewrite"]["file"] == "rw.json" and block["rewrite"]["n_rewrites"] == 8
    assert block["key_sha256"] == rw.key_sha256 and block["items_sha256"] != plain.describe()["items_sha256"]  # 3 vs 8
    other = _rewrites(tmp_path, name="rw2.json")
    other.write_text(other.read_text().replace("highly", "very"))
    assert load_prompt_set({"loader": "smoke", "rewrite": str(other)}).key_sha256 != rw.key_sha256


def test_a_rewrite_file_must_cover_every_prompt_of_the_set(tmp_path):
    # even a 1-prompt subset: its images are batched with neighbours of the full set
    with pytest.raises(ConfigError, match=r"no rewrite for 2 of the 8 prompts \(e.g. 0: 'a photo of a cat'"):
        load_prompt_set({"loader": "smoke", "rewrite": str(_rewrites(tmp_path, skip=2)), "limit": 1})


def test_running_a_rewriter_is_refused_with_the_way_to_give_its_output():
    with pytest.raises(PromptSetError, match="benchmark.rewrite=<file>"):
        load_prompt_set({"loader": "smoke", "rewriter": "gpt-4o"})


# -- store keys ------------------------------------------------------------------------------------
def _geneval_tree(*extra):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=infinity_2b", "method=fastvar", "benchmark=geneval", *extra])
    return pin_runtime(json.loads(json.dumps(OmegaConf.to_container(cfg, resolve=True))), torch.device("cpu"), torch.float32)


def test_the_new_key_moves_no_existing_store_or_record_key():
    tree = _geneval_tree()
    assert tree["benchmark"]["rewrite"] is None
    before = json.loads(json.dumps(tree))
    del before["benchmark"]["rewrite"]                       # the config as composed before this key existed
    w = {"w.pth": "0" * 64}
    assert generation_hash(tree, w, "p") == generation_hash(before, w, "p")
    assert entry_hash(tree, w, "p") == entry_hash(before, w, "p")
    # the path itself never moves a key (machines differ); its sha256 does, through key_sha256
    moved = _geneval_tree("benchmark.rewrite=/somewhere/rw.json")
    assert generation_hash(moved, w, "p") == generation_hash(tree, w, "p")
    assert entry_hash(moved, w, "p") == entry_hash(tree, w, "p")


# -- end to end, and the table --------------------------------------------------------------------------
@pytest.mark.integration
def test_a_rewritten_run_generates_from_the_rewrites_and_is_its_own_table_section(tmp_path):
    from varbench.cli.callbacks import aggregate_experiment
    from varbench.harness.job import run_job
    from varbench.harness.store import ImageStore
    from varbench.testing.jobs import job_config

    rw = _rewrites(tmp_path)
    common = ("benchmark.limit=2", "runtime.batch_size=2", "runtime.progress=false", "timing=none",
              "evaluator=[clipscore_tiny]", "experiment_name=rw")
    plain = json.loads((run_job(job_config(tmp_path, *common)) / "record.json").read_text())
    cfg_on = job_config(tmp_path, *common, f"+benchmark.rewrite={rw}")
    on = json.loads((run_job(cfg_on) / "record.json").read_text())
    assert on["generation_id"] != plain["generation_id"] and on["entry_id"] != plain["entry_id"]
    assert on["benchmark"]["rewrite"]["sha256"] and "rewrite" not in plain["benchmark"]
    store_on = ImageStore(tmp_path / "store", on["generation_id"])
    store_off = ImageStore(tmp_path / "store", plain["generation_id"])
    meta = store_on.read_metadata(0)
    assert meta["prompt"] == PROMPTS[0] and meta["generated_from"] == f"{PROMPTS[0]}, highly detailed photograph"
    # other text, other pixels (the tiny model reads its prompt)
    assert store_on.load(0, 0).tobytes() != store_off.load(0, 0).tobytes()
    result = aggregate_experiment(job_config(tmp_path, *common))
    tables = "\n".join((g.folder / "table.md").read_text() for g in result.groups)
    assert "benchmark=smoke · rewriter: on" in tables and "benchmark=smoke (" in tables


def test_geneval_records_whether_its_images_came_from_rewritten_prompts():
    assert _geneval_tree("evaluator=[geneval]")["evaluator"]["geneval"]["prompt_rewrite"] is False
    on = _geneval_tree("evaluator=[geneval]", "benchmark.rewrite=/somewhere/rw.json")
    assert on["evaluator"]["geneval"]["prompt_rewrite"] is True
