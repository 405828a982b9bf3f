"""One input boundary (issue 40): every way a user's input can be wrong, through the door a user takes,
answered by one error of its own kind, its own first words, the file and place named, exit 2, before any
job and before any write.

The table is (input kind x fault kind): a new input kind is one row of ``CASES``. Each row builds the
fault under ``tmp_path`` and gives the command line; the check runs the command's own entry
(:func:`varbench.cli.app.cli`, in this process) and reads its one line on stderr. Relocation of W&B runs
(findings 1 and 2) lives in tests/loggers/test_offline.py, next to the real offline runs it needs.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from varbench.core.errors import (BadSettingError, IncompatibleSettingsError, MalformedFileError, report_line)
from varbench.core.inputs import read_json, read_jsonl, read_text, read_yaml
from varbench.core.registry import EntryLoadError, WrongKindError


def _run_cli(argv, monkeypatch, capsys) -> tuple[int, str]:
    """``python -m varbench <argv>`` in this process: (exit code, stderr + stdout)."""
    from varbench.cli.app import cli

    monkeypatch.setattr(sys, "argv", ["varbench", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli()
    out = capsys.readouterr()
    return e.value.code, out.err + out.out


def _common(tmp_path) -> list[str]:
    return [f"paths.store_dir={tmp_path}/store", f"paths.results_dir={tmp_path}/results",
            f"paths.output_root={tmp_path}/out"]


# -- the faults ------------------------------------------------------------------------------------
def geneval_not_utf8(tmp_path):          # finding 6
    f = tmp_path / "evaluation_metadata.jsonl"
    f.write_bytes(b'{"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a cat"}\n'
                  b'{"tag": "single_object", "include": [], "prompt": "a caf\xe9"}\n')
    return ["model=toy", "benchmark=geneval", f"benchmark.path={f}"], f, ":2 (byte 143)"   # the é of line 2: 143 bytes in


def dpgbench_not_utf8(tmp_path):         # finding 7
    d = tmp_path / "prompts"
    d.mkdir()
    (d / "a1.txt").write_text("a red cube on a table")
    (d / "a2.txt").write_bytes(b"a blue \xff sphere")
    return ["model=toy", "benchmark=dpgbench", f"benchmark.path={d}"], d / "a2.txt", ":1 (byte 7)"


def geneval_bad_json(tmp_path):
    f = tmp_path / "evaluation_metadata.jsonl"
    f.write_text('{"tag": "single_object", "prompt": "a cat"}\n{"tag": "colors", "prompt": x}\n')
    return ["model=toy", "benchmark=geneval", f"benchmark.path={f}"], f, ":2:29 (byte 72)"   # the x: line 1 is 44 bytes + newline, then 28 more


def geneval_path_is_a_folder(tmp_path):
    return ["model=toy", "benchmark=geneval", f"benchmark.path={tmp_path}"], tmp_path, "is a folder"


def imagereward_duplicate_key(tmp_path):
    f = tmp_path / "benchmark-prompts.json"
    f.write_text('[{"id": 1, "prompt": "a", "prompt": "b"}]')
    return ["model=toy", "benchmark=imagereward", f"benchmark.path={f}"], f, "'prompt' is given twice"


def hpsv2_wrong_shape(tmp_path):
    for s in ("anime", "concept-art", "paintings", "photo"):
        (tmp_path / f"{s}.json").write_text('{"prompts": ["a"]}')
    return ["model=toy", "benchmark=hpsv2", f"benchmark.path={tmp_path}"], tmp_path / "anime.json", \
        "must be a JSON list of prompt strings"


def dpgbench_path_is_a_file(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("a cube")
    return ["model=toy", "benchmark=dpgbench", f"benchmark.path={f}"], f, "is a file"


def config_dir_yaml_broken(tmp_path):    # finding 3
    (tmp_path / "conf" / "method").mkdir(parents=True)
    f = tmp_path / "conf" / "method" / "mine.yaml"
    f.write_text("name: baseline\nlabel: [unclosed\nknobs: {}\n")
    return ["model=toy", "method=mine", "--config-dir", str(tmp_path / "conf")], f, "mine.yaml:3:6"


def config_dir_duplicate_key(tmp_path):
    (tmp_path / "conf" / "method").mkdir(parents=True)
    f = tmp_path / "conf" / "method" / "mine.yaml"
    f.write_text("name: baseline\nlabel: Mine\nlabel: Other\nknobs: {}\n")
    return ["model=toy", "method=mine", "--config-dir", str(tmp_path / "conf")], f, "mine.yaml:3:1"


def config_dir_not_a_mapping(tmp_path):
    (tmp_path / "conf" / "method").mkdir(parents=True)
    f = tmp_path / "conf" / "method" / "mine.yaml"
    f.write_text("- name\n- baseline\n")
    return ["model=toy", "method=mine", "--config-dir", str(tmp_path / "conf")], f, "not a mapping"


#: (input kind, fault): (builder, error's first words)
CASES = {
    ("geneval prompt file", "not UTF-8"): (geneval_not_utf8, "unreadable or malformed file"),
    ("dpgbench prompt file", "not UTF-8"): (dpgbench_not_utf8, "unreadable or malformed file"),
    ("geneval prompt file", "not JSON"): (geneval_bad_json, "unreadable or malformed file"),
    ("geneval prompt file", "a folder"): (geneval_path_is_a_folder, "unreadable or malformed file"),
    ("imagereward prompt file", "duplicate key"): (imagereward_duplicate_key, "unreadable or malformed file"),
    ("hpsv2 prompt file", "wrong shape"): (hpsv2_wrong_shape, "unreadable or malformed file"),
    ("dpgbench prompt folder", "a file"): (dpgbench_path_is_a_file, "unreadable or malformed file"),
    ("--config-dir yaml", "does not parse"): (config_dir_yaml_broken, "unreadable or malformed file"),
    ("--config-dir yaml", "duplicate key"): (config_dir_duplicate_key, "unreadable or malformed file"),
    ("--config-dir yaml", "not a mapping"): (config_dir_not_a_mapping, "unreadable or malformed file"),
}


@pytest.mark.parametrize("mode", ["--dry-run", "run"])
@pytest.mark.parametrize("kind, fault", list(CASES), ids=[f"{k}-{f}" for k, f in CASES])
def test_a_file_fault_is_one_line_naming_the_file_and_place_exit_2(kind, fault, mode, tmp_path, monkeypatch, capsys):
    """Findings 3, 6, 7 (and their siblings): one line ``[varbench] unreadable or malformed file: FILE:LINE:COL
    (byte N): ...`` or ``FILE ... byte N``, exit 2, never "missing", no traceback; nothing written."""
    build, first_words = CASES[kind, fault]
    argv, path, where = build(tmp_path)
    argv = [*argv, *_common(tmp_path)] + (["--dry-run"] if mode == "--dry-run" else [])
    code, out = _run_cli(argv, monkeypatch, capsys)
    line = next((x for x in out.splitlines() if x.startswith("[varbench] ") and first_words in x), None)
    assert code == 2 if mode == "run" else code in (0, 2), out
    assert line is not None and line.startswith(f"[varbench] {first_words}: "), out
    assert str(path) in line and where in line, line
    assert "missing" not in line and "Traceback" not in out, out
    assert not (tmp_path / "store").exists()                  # refused before any write


def _plugin_site(tmp_path, monkeypatch, module_source: str, entry: str) -> None:
    """An installed distribution (a dist-info on sys.path) whose prompt-loader entry point is ``entry``."""
    from varbench.harness.prompts import LOADERS

    site = tmp_path / "site"
    (site / "vb_ext_prompts-0.1.dist-info").mkdir(parents=True)
    (site / "vb_ext_prompts.py").write_text(textwrap.dedent(module_source))
    (site / "vb_ext_prompts-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vb_ext_prompts\nVersion: 0.1\n")
    (site / "vb_ext_prompts-0.1.dist-info" / "entry_points.txt").write_text(f"[varbench.prompt_loaders]\n{entry}\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "vb_ext_prompts", raising=False)
    LOADERS.rescan()
    monkeypatch.setattr(LOADERS, "_outside", None)


def loader_fails_to_import(tmp_path, monkeypatch):      # finding 4
    _plugin_site(tmp_path, monkeypatch, "import vb_no_such_dependency\ndef load(cfg): pass\n", "broken = vb_ext_prompts:load")
    return ["model=toy", "benchmark=smoke", "benchmark.loader=broken"], "benchmark loader 'broken'"


def plus_on_an_existing_key(tmp_path, monkeypatch):      # finding 8: r_max exists in the sweep's nova jobs
    return ["+experiment=nova_sweep", "model=toy", "+method.knobs.r_max=0.5"], \
        "+method.knobs.r_max=0.5: method.knobs.r_max exists: drop the +"


def tilde_on_an_absent_key(tmp_path, monkeypatch):
    return ["model=toy", "~method.knobs.zzz"], "~method.knobs.zzz: method.knobs.zzz does not exist"


def override_syntax(tmp_path, monkeypatch):
    return ["model=toy", "method.knobs=[1"], "override grammar"


def limit_out_of_range(tmp_path, monkeypatch):          # finding 9
    return ["-m", "model=toy", "method=baseline", "benchmark.limit=2,-1"], "benchmark.limit must be >= 1, got -1"


def shard_without_prompts(tmp_path, monkeypatch):       # finding 5 (6 toy prompts at 1 sample: one block)
    return ["-m", "model=toy", "benchmark=toy", "benchmark.n_prompts=6", "benchmark.samples_per_prompt=1",
            "runtime.batch_size=4", "timing=none", "shard=0/2,1/2"], "shard=0/2 with 6 prompt(s)"


def store_is_a_dangling_link(tmp_path, monkeypatch):
    import os

    os.symlink(tmp_path / "unmounted", tmp_path / "link")
    return ["model=toy", "benchmark=smoke", "benchmark.limit=1", "evaluator=[]", "timing=none",
            f"paths.store_dir={tmp_path}/link"], f"{tmp_path}/link is a symbolic link to {tmp_path}/unmounted"


#: (input kind, fault): (builder, first words of the one line, whether --dry-run refuses too)
CLI_CASES = {
    ("prompt loader entry point", "import fails"): (loader_fails_to_import, "EntryLoadError", False),
    ("+override", "key exists"): (plus_on_an_existing_key, "config error", True),
    ("~override", "key absent"): (tilde_on_an_absent_key, "config error", True),
    ("override", "syntax"): (override_syntax, "config error", True),
    ("benchmark.limit", "out of range"): (limit_out_of_range, "bad setting", False),   # a dry run lists it
    ("shard", "a shard without prompts"): (shard_without_prompts, "incompatible combination", False),
    ("paths.store_dir", "dangling link"): (store_is_a_dangling_link, "StoreWriteError", False),
}


@pytest.mark.parametrize("mode", ["--dry-run", "run"])
@pytest.mark.parametrize("kind, fault", list(CLI_CASES), ids=[f"{k}-{f}" for k, f in CLI_CASES])
def test_a_command_line_fault_is_one_line_of_its_kind_exit_2(kind, fault, mode, tmp_path, monkeypatch, capsys):
    """Findings 4, 5, 8, 9 (and siblings): the real run refuses before any job with exit 2 and one line whose
    first words say the kind (never "missing" for what is not missing); the dry run refuses alike, or lists
    the fault in its report (exit 0) where the other jobs can still be shown; no traceback, nothing stored."""
    build, first_words, dry_refuses = CLI_CASES[kind, fault]
    argv, says = build(tmp_path, monkeypatch)
    common = _common(tmp_path)
    if any(a.startswith("paths.store_dir=") for a in argv):
        common = [c for c in common if not c.startswith("paths.store_dir=")]
    code, out = _run_cli([*argv, *common] + (["--dry-run"] if mode == "--dry-run" else []), monkeypatch, capsys)
    assert "Traceback" not in out, out
    if mode == "--dry-run" and not dry_refuses:
        assert code == 0 and "nothing is run" in out, out
        if first_words != "StoreWriteError":
            assert f"[varbench] {first_words}: " in out and says in out, out
            assert "missing" not in out, out
    else:
        assert code == 2, out
        line = next(x for x in out.splitlines() if x.startswith("[varbench] ") and not x.startswith("[varbench] dry run"))
        assert line.startswith(f"[varbench] {first_words}: ") and says in line, out
        assert "is missing" not in line and "files the" not in line, line
    assert not (tmp_path / "store").exists() and not (tmp_path / "unmounted").exists()


def test_a_module_attr_of_the_wrong_kind_is_a_bad_setting(tmp_path, monkeypatch):
    """A ``module:attr`` that imports but is not what its slot takes: one line naming both."""
    from varbench.evaluators import REGISTRY as EVALUATORS
    from varbench.harness.prompts import LOADERS
    from varbench.policies import REGISTRY as METHODS

    (tmp_path / "vb_ext_kinds.py").write_text("def func(x): return x\nclass Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WrongKindError, match=r"method 'vb_ext_kinds:func' imports, but is a function.*Policy"):
        METHODS.load("vb_ext_kinds:func")
    with pytest.raises(WrongKindError, match=r"evaluator 'vb_ext_kinds:Thing' imports, but is the class .*Evaluator"):
        EVALUATORS.load("vb_ext_kinds:Thing")
    with pytest.raises(WrongKindError, match=r"benchmark loader 'vb_ext_kinds:Thing' imports, but is the class"):
        LOADERS.load("vb_ext_kinds:Thing")
    assert report_line(WrongKindError("x")).startswith("[varbench] bad setting: ")
    assert callable(LOADERS.load("vb_ext_kinds:func"))                  # a function fits the loader slot


def test_an_empty_shard_is_refused_before_any_work(tmp_path):
    """Finding 5: a shard takes whole blocks, and a block holds whole generation and scoring batches
    (SCORE_BATCH images: 16 prompts at 1 sample each), so 6 prompts make one block and ``shard=1/2`` would get
    none. Every shard of the count refuses alike (shard 0 too, so no part is written that could never be
    assembled), as an incompatible combination, before any work: exit 2, nothing written. 32 prompts make 2
    blocks: 2 shards fit."""
    from varbench.harness.job import prepare_job
    from varbench.harness.preflight import check_files
    from varbench.harness.scoring import SCORE_BATCH
    from varbench.testing.jobs import job_config

    assert SCORE_BATCH == 16            # the block size the numbers above rest on
    base = ["model=toy", "benchmark=toy", "benchmark.samples_per_prompt=1", "runtime.batch_size=4",
            "evaluator=[]", "timing=none"]
    for shard in ("0/2", "1/2"):
        cfg = [*base, "benchmark.n_prompts=6", f"shard={shard}"]
        with pytest.raises(IncompatibleSettingsError, match=r"make 1 block.*Use at most 1 shard"):
            check_files([job_config(tmp_path, *cfg)])
        with pytest.raises(IncompatibleSettingsError):
            prepare_job(job_config(tmp_path, *cfg))
    assert not (tmp_path / "store").exists()
    check_files([job_config(tmp_path, *base, "benchmark.n_prompts=32", "shard=1/2")])   # 2 blocks: fits


def test_hydra_full_error_still_gives_the_full_trace(tmp_path, monkeypatch, capsys):
    """``HYDRA_FULL_ERROR=1``: the translation steps aside, Hydra's own exception comes through."""
    from hydra.errors import ConfigCompositionException

    from varbench.cli.dry_run import dry_run

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigCompositionException):
        dry_run(["+experiment=nova_sweep", "model=toy", "+method.knobs.r_max=0.5", *_common(tmp_path)])


def test_a_missing_config_dir_is_missing_and_an_unknown_nested_option_is_selectable(tmp_path, monkeypatch, capsys):
    code, out = _run_cli(["model=toy", "--config-dir", str(tmp_path / "nope"), "--dry-run"], monkeypatch, capsys)
    assert code == 2 and "--config-dir" in out and "does not exist" in out, out
    from varbench.cli.overrides import check_overrides

    check_overrides(["model=toy", "benchmark=protocol/toy"])             # a nested option is an option


# -- the strict readers other loaders call (varbench/core/inputs.py) --------------------------------
@pytest.mark.parametrize("reader, data, where", [
    (read_text, b"ok\n\xc3(", ":2 (byte 3)"),                        # a broken 2-byte sequence after "ok\n"
    (read_json, b'{"a": 1,\n "a": 2}', ":2:2 (byte 10)"),             # the second "a"
    (read_json, b'[1, 2,]', ":1:7 (byte 6)"),
    (lambda p, w: list(read_jsonl(p, w)), b'{"p": "\xc3\xa9"}\n{"p" 1}\n', ":2:6 (byte 17)"),   # line 1: 12 bytes (é is 2)
    (read_yaml, b"a: 1\nb:\n\t- x\n", ":3:1"),                         # a tab where indentation belongs
])
def test_the_strict_readers_name_file_and_position(reader, data, where, tmp_path):
    f = tmp_path / "f"
    f.write_bytes(data)
    with pytest.raises(MalformedFileError) as e:
        reader(f, "test file")
    assert str(e.value).startswith(f"{f}{where}"), str(e.value)


def test_the_tolerance_rule_a_bom_and_blank_lines_pass(tmp_path):
    f = tmp_path / "f.jsonl"
    f.write_bytes(b'\xef\xbb\xbf{"p": 1}\n\n  \n{"p": 2}\n')
    assert list(read_jsonl(f, "x")) == [(0, {"p": 1}), (3, {"p": 2})]       # line indices as prompt indices count
    assert read_text(f, "x").startswith('{"p"')


def test_first_words_per_kind():
    from varbench.core.missing import MissingFilesError

    assert report_line(BadSettingError("x")).startswith("[varbench] bad setting: ")
    assert report_line(IncompatibleSettingsError("x")).startswith("[varbench] incompatible combination: ")
    assert report_line(MalformedFileError("f", "x")).startswith("[varbench] unreadable or malformed file: f: x")
    assert report_line(EntryLoadError("x")).startswith("[varbench] EntryLoadError: ")
    assert "missing" in str(MissingFilesError("1 file the job needs is missing"))


# -- section 3: a single job scores its model's protocol ------------------------------------------
def test_a_single_job_takes_its_models_protocol_and_any_protocol_is_selectable(tmp_path):
    """``python -m varbench model=toy method=baseline`` (no experiment) composes the toy protocol (toy prompts,
    toy GenEval, fidelity), as a sweep does; ``benchmark=protocol/toy`` and a protocol of the user's own in
    ``--config-dir`` are options by name (before: the smoke prompts with no evaluator; "no benchmark option")."""
    from varbench.cli.overrides import check_overrides
    from varbench.cli.sweep_plan import plan_command

    [job] = plan_command(["model=toy", "method=baseline", *_common(tmp_path)]).jobs
    assert job.cfg.benchmark.name == "toy" and sorted(job.cfg.evaluator) == ["fidelity", "toy_geneval"]
    [job] = plan_command(["model=tiny", *_common(tmp_path)]).jobs
    assert job.cfg.benchmark.name == "smoke" and list(job.cfg.evaluator) == ["fidelity"]
    [job] = plan_command(["model=toy", "benchmark=smoke", *_common(tmp_path)]).jobs   # told otherwise
    assert job.cfg.benchmark.name == "smoke" and not job.cfg.get("evaluator")
    check_overrides(["model=toy", "benchmark=protocol/toy"])
    from varbench.cli.dry_run import dry_run_lines

    # the dry run says where a job's time goes: 60 toy prompts x 2 images, then the timed pass
    [stages] = [x for x in dry_run_lines(plan_command(["model=toy", *_common(tmp_path)])) if "per job:" in x]
    assert "generate 120 images, score them (toy_geneval, fidelity), then a timed pass of" in stages
    assert "timing=quick is the fast first look" in stages
    conf = tmp_path / "conf" / "benchmark" / "protocol"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text("defaults:\n  - /benchmark/toy@_here_\n  - /evaluator/toy_geneval@_global_.evaluator\n"
                                    "  - _self_\nn_prompts: 12\n")
    argv = ["model=toy", "benchmark=protocol/mine", "--config-dir", str(tmp_path / "conf"), *_common(tmp_path)]
    check_overrides(argv)
    [job] = plan_command(argv).jobs
    assert job.cfg.benchmark.n_prompts == 12 and list(job.cfg.evaluator) == ["toy_geneval"]


@pytest.mark.integration
def test_a_single_toy_job_writes_the_protocols_quality_columns(tmp_path, monkeypatch, capsys):
    """The issue's done-when: a single job's record has the toy protocol's quality (toy GenEval and fidelity)."""
    import json

    monkeypatch.setattr(sys, "argv", ["varbench", "model=toy", "method=baseline", "benchmark.limit=4", "timing=quick",
                                      "runtime.progress=false", "aggregate=false", *_common(tmp_path),
                                      f"hydra.run.dir={tmp_path}/run"])
    from varbench.cli.app import cli

    cli()
    [rec] = [json.loads(p.read_text()) for p in (tmp_path / "store").rglob("record.json")]
    assert rec["benchmark"]["name"] == "toy"
    assert any(k.startswith("toy_geneval/") for k in rec["metrics"]), rec["metrics"]
    assert any(k.startswith("fidelity/") for k in rec["metrics"]), rec["metrics"]


def test_shards_of_mixed_counts_are_warned_about(tmp_path, caplog):
    """``shard=0/2`` and ``shard=1/3`` in one entry: nothing can be sealed, and now it is said."""
    from varbench.harness.job import other_shard_counts, ready_sharded_entries

    entry = tmp_path / "exp" / "entries" / "abc"
    for name in ("0-of-2", "1-of-2", "1-of-3"):
        (entry / "shards" / name).mkdir(parents=True)
        (entry / "shards" / name / "SHARD_DONE").write_text("{}")
    assert other_shard_counts(entry, 2) == ["1-of-3"] and other_shard_counts(entry, 3) == ["0-of-2", "1-of-2"]
    with caplog.at_level("WARNING", logger="varbench"):
        assert ready_sharded_entries(tmp_path) == []
    assert "holds shards of 2 different counts (0-of-2, 1-of-2, 1-of-3): none is assembled" in caplog.text


@pytest.mark.integration
def test_the_real_command_exits_2_in_one_line_and_hydra_full_error_gives_the_trace(tmp_path):
    """Finding 3 through a real ``python -m varbench`` process (before: a 34-frame Hydra traceback, exit 1);
    with ``HYDRA_FULL_ERROR=1`` the strict read steps aside and Hydra's own trace comes back."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    argv, path, where = config_dir_yaml_broken(tmp_path)
    cmd = [sys.executable, "-m", "varbench", *argv[2:], *argv[:2], *_common(tmp_path)]   # --config-dir DIR first:
    # Hydra's own parser (which the full-error run reaches) takes flags before the overrides
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"[varbench] unreadable or malformed file: {path}:3:6 (byte 37): is not valid YAML")
    full = subprocess.run(cmd, cwd=root, env={**env, "HYDRA_FULL_ERROR": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert full.returncode == 1 and "Traceback" in full.stderr and "yaml" in full.stderr, full.stderr[-2000:]


def test_every_packaged_config_passes_the_strict_read():
    """The packaged configs obey the rule a user's --config-dir is held to (no key given twice, every
    file a mapping, UTF-8), so the strict read never refuses what varbench ships."""
    from varbench.core.resources import CONF_DIR

    files = sorted(Path(CONF_DIR).rglob("*.yaml"))
    assert len(files) > 100
    for f in files:
        data = read_yaml(f, "packaged config")
        assert data is None or isinstance(data, dict), f
