"""DPG-Bench scorer against ELLA's own compute_dpg_bench.py (tests/fixtures/evaluators/dpg_ella: its
script run unmodified on a synthetic question file that exercises every quirk, with a deterministic
stand-in VQA model), the question-file reader, the 2x2 grid, and the official backend's plumbing."""
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from varbench.core.errors import MalformedFileError
from varbench.evaluators import build_evaluator
from varbench.evaluators.base import Sample
from varbench.evaluators.dpg.grid import crop_boxes, crops, make_grid
from varbench.evaluators.dpg.official import _parse_detail
from varbench.evaluators.dpg.questions import read_dpg_questions
from varbench.evaluators.weights import WeightsNotFoundError
from varbench.testing.dpg_vqa import fake_answer

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "evaluators" / "dpg_ella"
CSV = FIX / "questions_synthetic.csv"
ELLA = json.loads((FIX / "ella_reference.json").read_text())
FAKE = "varbench.testing.dpg_vqa:FakeVQA"


def _image(item_index, sample, res=16):        # as the fixture's generator made them
    rng = np.random.default_rng(1000 * item_index + sample)
    return Image.fromarray(rng.integers(0, 256, (res, res, 3), dtype=np.uint8))


def _samples():
    return [Sample(i, s, f"prompt {item}", _image(i, s), metadata={"id": item})
            for i, item in enumerate(ELLA["items"]) for s in range(4)]


# -- the reader ----------------------------------------------------------------------------------------
def test_the_reader_keeps_ellas_quirks():
    q = read_dpg_questions(CSV)
    assert list(q["a1"].qid2question) == [2, 3]               # the file's first row is skipped
    assert list(q["c3"].qid2question) == [1, 3, 4]            # a second run of c3's rows replaces the first
    assert q["c3"].qid2question[1] == "Is there a brown dog?"
    assert q["c3"].qid2dependency[4] == [3, 1] and "42" in q   # ids stay text (a mixed column)
    assert list(q["e5"].qid2question) == [2, 3, 1, 4]          # question order as in the file
    assert q["b2"].qid2tuple[2] == "attribute - color (bus, red)"


@pytest.mark.parametrize("text, where, what", [
    ("item_id,text,proposition_id,dependency,tuple\nx,t,1,0,entity (x)\n", ":1:", "lacks the column"),
    ("item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,question_natural_language\n"
     "x,t,k,1,0,e,w,entity - whole (x),Is there x?\nx,t,k,two,0,e,w,entity - whole (x),Is there x?\n", ":3:",
     "proposition_id 'two' is not an integer"),
    ("item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,question_natural_language\n"
     "x,t,k,1,0,e,w,entity - whole (x),q\nx,t,k,2,0,e,w,entity - whole (x),q\nx,t,k,3,\"1,b\",e,w,entity - whole (x),q\n",
     ":4:", "not a comma-separated list"),
    (b"item_id,text\nx,caf\xe9\n", ":2 (byte 18)", "not UTF-8"),              # latin-1 é after 13 + 5 bytes: the one strict reader's line
])
def test_a_malformed_question_file_names_file_and_line(tmp_path, text, where, what):
    path = tmp_path / "q.csv"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(MalformedFileError, match=what) as info:
        read_dpg_questions(path)
    assert str(info.value).startswith(f"{path}{where}")


# -- the grid --------------------------------------------------------------------------------------------
def test_our_four_stored_images_are_the_four_crops_of_ellas_grid_pixel_for_pixel(tmp_path):
    images = [_image(3, s, res=32) for s in range(4)]
    make_grid(images).save(tmp_path / "g.png")                 # what the official backend hands ELLA
    with Image.open(tmp_path / "g.png") as grid:
        got = crops(grid.convert("RGB"), 32)
    assert [c.tobytes() for c in got] == [im.tobytes() for im in images]
    assert crop_boxes(32) == [(0, 0, 32, 32), (32, 0, 64, 32), (0, 32, 32, 64), (32, 32, 64, 64)]


# -- the scorer against ELLA's script ------------------------------------------------------------------
def test_scores_equal_ellas_script_on_every_quirk():
    ev = build_evaluator("dpgbench", questions=str(CSV), backend=FAKE, n_boot=200)
    ev.setup("cpu")
    ev.update(_samples())
    res = ev.compute()
    m = res.metrics
    assert m["overall"] == pytest.approx(ELLA["dpg_score"], abs=1e-12)
    for cat, v in ELLA["l1"].items():
        assert m[cat] == pytest.approx(v, abs=1e-12), cat
    for cat, v in ELLA["l2"].items():
        assert m["l2_" + cat.replace(" - ", "_")] == pytest.approx(v, abs=1e-12), cat
    # failed images are dropped as ELLA drops them: a dependency on the skipped first row (a1), on a
    # question that does not exist once a parent answered yes (f6), an id without questions (zz9)
    assert m["n_failed"] == len(ELLA["failed"]) == 3 and m["n_prompts"] == 5 and m["n_images"] == 32
    failed = {r["item_id"] for r in res.per_sample if r["failed"]}
    assert failed == set(ELLA["failed"])
    for item, scores in ELLA["per_image_crop_scores_and_mean"].items():
        rows = [r for r in res.per_sample if r["item_id"] == item]
        assert [r["crop_score"] for r in rows] == pytest.approx(scores[:4], abs=1e-15), item
    # n and the ± of each category; the overall's ± is the standard error over the 5 prompts
    per_prompt = [v[-1] for v in ELLA["per_image_crop_scores_and_mean"].values()]
    assert res.uncertainty["overall"] == pytest.approx(100 * np.std(per_prompt, ddof=1) / np.sqrt(5))
    assert m["n_entity"] > 0 and res.uncertainty["entity"] > 0
    again = build_evaluator("dpgbench", questions=str(CSV), backend=FAKE, n_boot=200)
    again.restore(res.per_sample)                              # aggregation from rows alone
    assert again.compute().metrics == m


def test_ellas_detail_lines_parse_into_the_answers_of_our_crops(tmp_path):
    (tmp_path / "d.txt").write_text("\n".join("/x/" + line for line in ELLA["detail_lines"]) + "\n")
    parsed = _parse_detail(tmp_path / "d.txt")
    q = read_dpg_questions(CSV)
    for i, item in enumerate(ELLA["items"]):
        if item in ("zz9",) or item not in q:
            continue
        seen = 0
        for s, box in enumerate(crop_boxes(16)):   # a failing image stops after its first crop
            got = parsed.get((item, box), [])
            want = [fake_answer(_image(i, s), qq) for qq in q[item].qid2question.values()]
            assert got == want[:len(got)], (item, s)
            seen += len(got)
        assert seen >= len(q[item].qid2question), item


# -- the official backend's plumbing ---------------------------------------------------------------------
FAKE_ELLA = textwrap.dedent('''
    """Writes what ELLA's compute_dpg_bench.py writes, answering with the stand-in VQA rule."""
    import argparse, os, os.path as osp, sys
    sys.path.insert(0, REPO)   # this checkout's varbench
    from PIL import Image
    from varbench.evaluators.dpg.questions import read_dpg_questions
    from varbench.evaluators.dpg.scoring import crop_scores
    from varbench.evaluators.dpg.grid import crop_boxes
    from varbench.testing.dpg_vqa import fake_answer
    p = argparse.ArgumentParser()
    for a in ("--image-root-path", "--resolution", "--csv", "--res-path", "--pic-num", "--vqa-model"):
        p.add_argument(a)
    a = p.parse_args()
    q = read_dpg_questions(a.csv)
    res, det = open(a.res_path, "a"), open(a.res_path.replace(".txt", "_detail.txt"), "a")
    for fn in os.listdir(a.image_root_path):
        path = osp.join(a.image_root_path, fn)
        item = q.get(fn.split(".")[0])
        if item is None:
            print("Failed filename:", fn, "'NoneType' object is not subscriptable"); continue
        grid, scores = Image.open(path), []
        for box in crop_boxes(int(a.resolution), int(a.pic_num)):
            answers = {}
            for qid, question in item.qid2question.items():
                answers[qid] = fake_answer(grid.crop(box), question)
                det.write(path + ", " + str(box) + ", " + question + ", " + answers[qid] + "\\n")
            try:
                scores.append(crop_scores(item, answers)[1])
            except Exception as e:
                print("Failed filename:", fn, e); break
        else:
            res.write(path + ", " + ", ".join(str(s) for s in scores) + ", " + str(sum(scores) / len(scores)) + "\\n")
    res.write("DPG-Bench score: 0\\n")
''')


@pytest.mark.integration
def test_official_backend_writes_grids_runs_the_script_and_reads_its_answers(tmp_path):
    script = tmp_path / "ELLA" / "dpg_bench" / "compute_dpg_bench.py"
    script.parent.mkdir(parents=True)
    script.write_text(FAKE_ELLA.replace("REPO", repr(str(Path(__file__).resolve().parents[2]))))
    ev = build_evaluator("dpgbench", questions=str(CSV), backend="official", official_python=sys.executable,
                         official_script=str(script), image_dir=str(tmp_path / "run"), n_boot=200)
    ev.setup("cpu")
    ev.update(_samples())
    res = ev.compute()
    assert (tmp_path / "run" / "grids" / "b2.png").is_file()
    assert res.metrics["overall"] == pytest.approx(ELLA["dpg_score"], abs=1e-12)
    assert res.metrics["n_failed"] == 3
    assert ev.version_info()["official_script"] == "compute_dpg_bench.py"


def test_missing_files_are_named_with_where_to_get_them(tmp_path):
    with pytest.raises(WeightsNotFoundError, match="(?s)dpg_bench.csv.*TencentQQGYLab/ELLA"):
        build_evaluator("dpgbench", questions=str(tmp_path / "dpg_bench.csv"), backend=FAKE).preflight([{"id": "x"}])
    with pytest.raises(WeightsNotFoundError, match="official_python"):
        build_evaluator("dpgbench", questions=str(CSV), backend="official",
                        official_python=str(tmp_path / "nope")).preflight([{"id": "x"}])
    with pytest.raises(ValueError, match="DPG-Bench prompts"):
        build_evaluator("dpgbench", questions=str(CSV), backend=FAKE).preflight([{"tag": "counting"}])


def test_the_sweep_preflight_lists_the_dpg_files_with_where_they_are_published(tmp_path):
    from varbench.core.missing import MissingFilesError
    from varbench.harness.preflight import check_files
    from varbench.testing.jobs import job_config

    cfg = job_config(tmp_path, "model=infinity_2b", "benchmark=dpgbench_protocol/infinity_2b", "evaluator=[dpgbench]",
                     f"paths.data_dir={tmp_path}/data", f"paths.weights_dir={tmp_path}/w")
    with pytest.raises(MissingFilesError) as info:
        check_files([cfg])
    text = str(info.value)
    assert "dpg_bench.csv" in text and "TencentQQGYLab/ELLA" in text                 # the question file
    assert "mplug_vqa_coco_large_en" in text and "ModelScope hub" in text           # the VQA weights
    assert "dpgbench/prompts" in text                                                # the prompt folder
