"""The line a finished job prints, and the sweep size behind "job k/N"."""
import pytest

from varbench.cli.report import job_position, result_line, sweep_size


def test_sweep_size_multiplies_sweeps_and_lets_the_command_line_win():
    assert sweep_size(["method=a,b,c", "+experiment=x", "seed=range(0,4)"]) == 12
    assert sweep_size(["benchmark.limit=3"], {"method": "a,b"}) == 2
    assert sweep_size(["method=a,b,c"], {"method": "a,b", "model": "x,y"}) == 6   # command line replaces params' method
    assert sweep_size([]) == 1


def test_job_position_reads_the_sweep_size(monkeypatch):
    monkeypatch.delenv("VARBENCH_SWEEP_JOBS", raising=False)
    assert job_position(None) == "job" and job_position(2) == "job 3"
    monkeypatch.setenv("VARBENCH_SWEEP_JOBS", "12")
    assert job_position(2) == "job 3/12"


def _record(paired=None, metrics=None):
    block = {"ar_ms": {"median": 40.0}}
    if paired:
        block["paired"] = paired
    return {"method": {"name": "nova", "preset": "nova_fast"},
            "benchmark": {"n_prompts": 553, "samples_per_prompt": 4},
            "timing": {"by_batch": {"4": {"ar_ms": {"median": 90.0}}, "1": block}},
            "metrics": metrics or {"geneval/n_images": 2212, "geneval/overall": 0.7123, "geneval/two_object": 0.8},
            "uncertainty": {"geneval/overall": 0.0101}}


def test_result_line_names_preset_images_interval_and_main_metric():
    line = result_line(_record({"ar_speedup": 1.844, "ar_ci_low": 1.71, "ar_ci_high": 1.97, "n_repeats": 9,
                                "reliable": True}), "job 3/12")
    assert line == ("[varbench] job 3/12 done · nova_fast · 2212 images · paired speed-up 1.84× [1.71, 1.97] "
                    "(9 repeats, bs 1) · geneval/overall 0.7123 ± 0.01")
    line = result_line(_record({"ar_speedup": 1.844, "ar_ci_low": 1.71, "ar_ci_high": 1.97, "n_repeats": 48,
                                "n_prompts": 16, "reliable": True}), "job 3/12")
    assert "(16 prompts × 3 repeats, bs 1)" in line             # the per-prompt protocol says how much it timed


def test_result_line_marks_an_unreliable_interval_and_falls_back_to_ar_ms():
    line = result_line(_record({"ar_speedup": 1.1, "ar_ci_low": 0.7, "ar_ci_high": 1.6, "n_repeats": 6,
                                "reliable": False, "unreliable_reasons": ["CI width 82% > 25%"]}))
    assert "unreliable: CI width 82% > 25%" in line
    assert "AR 40.0 ms (bs 1)" in result_line(_record(), "job")
    rec = _record()
    rec["timing"] = None
    assert "not timed" in result_line(rec)


def test_the_result_line_says_which_stage_the_time_went_to():
    """Issue 40, section 3: a 2-core toy job whose timed pass is most of it says so and names timing=quick;
    shares are of the stages' sum (48 + 15 + 4 + 3 = 70 s: 69%, 21%, 6%, 4%)."""
    from varbench.cli.report import stage_text

    text = stage_text({"build": 3.0, "generate": 15.0, "score": 4.0, "time": 48.0})
    assert text == (" · time: timed pass 69% (48 s), generation 21% (15 s), scoring 6% (4 s), model build 4% (3 s)"
                    " (timing=quick for a fast first look)")
    assert "timing=quick" not in stage_text({"generate": 30.0, "time": 10.0})
    assert stage_text({}) == ""
