"""varbench.analysis.frame: a metric's direction is decided in one place, from the record first."""
import pytest

pd = pytest.importorskip("pandas")

from varbench.analysis import tables as T  # noqa: E402
from varbench.analysis.frame import higher_is_better, recorded_directions, records_to_frame  # noqa: E402
from varbench.harness.records import find_entries  # noqa: E402
from tests.analysis.test_aggregate import make_record, write  # noqa: E402


def test_direction_from_the_record_then_the_evaluator_then_the_name():
    assert higher_is_better("fidelity/psnr") and not higher_is_better("fidelity/lpips")   # the evaluator's declaration
    assert not higher_is_better("newscorer/fid") and higher_is_better("newscorer/accuracy")  # by name
    assert higher_is_better("newscorer/fid", {"newscorer/fid": True})                     # the record wins
    assert recorded_directions({"higher_is_better": {"a/b": False}}) == {"a/b": False}
    assert recorded_directions({}) == {}


def test_the_frame_carries_the_records_directions_into_the_table_arrows(tmp_path):
    rec = make_record("base01", "baseline", 100.0, 120.0, 1e12, {"newscorer/psnr": (30.0, 0.1)})
    rec["higher_is_better"] = {"newscorer/psnr": False}                  # an evaluator declaring it so
    write(tmp_path, rec)
    frame = records_to_frame(find_entries(tmp_path))
    assert frame.attrs["higher_is_better"] == {"newscorer/psnr": False}
    assert T.metric_header("newscorer/psnr", frame.attrs["higher_is_better"]) == "newscorer PSNR (dB) ↓"
    assert T.metric_header("newscorer/psnr") == "newscorer PSNR (dB) ↑"   # without the record: by name
