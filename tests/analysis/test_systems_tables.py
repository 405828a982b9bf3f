"""The systems experiments' tables (varbench/analysis/systems_tables.py) on hand-made records."""
from __future__ import annotations

import json
import math

import numpy as np
from PIL import Image

from varbench.analysis.systems_tables import batch_rows, ladder_rows, write_systems_tables


def _rec(name, compile="off", quant="none", ms=100.0, gen="g", by_batch=None, log=None):
    by_batch = by_batch or {"1": {"ar_ms": {"median": ms}}}
    return {"method": {"name": name, "label": name.title()}, "generation_id": gen,
            "config": {"runtime": {"compile": compile, "quant": quant, "attn_backend": "auto"}},
            "timing": {"by_batch": by_batch, "runtime": {"compile_log": log}},
            "memory": {"weights_bytes": {"transformer": 4 << 20}}, "metrics": {"toy_geneval/overall": 0.5}}


def test_batch_rows_are_ms_per_image_per_batch_size():
    rec = _rec("baseline", by_batch={"4": {"ar_ms": {"median": 400.0}, "images_per_s": 8.0,
                                          "paired": {"ar_speedup": 1.5}, "peak_mem_bytes": 2 << 30},
                                    "1": {"ar_ms": {"median": 150.0}}})
    rows = batch_rows([rec])
    assert [r["batch"] for r in rows] == [1, 4]                              # sorted by batch size
    assert rows[1]["ar_ms_per_image"] == 100.0 and rows[1]["paired_ar_speedup"] == 1.5
    assert rows[1]["peak_alloc_gib"] == 2.0 and math.isnan(rows[0]["peak_alloc_gib"])


def _store(tmp_path, gen, value):
    d = tmp_path / "store" / "images" / gen / "00000" / "samples"
    d.mkdir(parents=True)
    Image.fromarray(np.full((4, 4, 3), value, np.uint8)).save(d / "0000.png")
    entry = tmp_path / "store" / "systems_ladder" / "entries" / f"e_{gen}"
    entry.mkdir(parents=True)
    return entry


def test_ladder_orders_rungs_and_measures_speed_and_fidelity_against_the_first(tmp_path):
    cells = [(_rec("fastvar", "default", "int8_weight_only", 25.0, "q"), _store(tmp_path, "q", 110)),
             (_rec("baseline", "default", "none", 80.0, "bc"), _store(tmp_path, "bc", 100)),
             (_rec("fastvar", ms=50.0, gen="m"), _store(tmp_path, "m", 100)),
             (_rec("baseline", ms=100.0, gen="b"), _store(tmp_path, "b", 100)),
             (_rec("fastvar", "default", ms=40.0, gen="c", log={"compiling_s": 12.0}), _store(tmp_path, "c", 100))]
    rows = ladder_rows([c[0] for c in cells], [c[1] for c in cells], "toy_geneval/overall")
    assert [r["rung"] for r in rows] == [0, 1, 2, 3, None]    # baseline, method, +compile, +quant, other cells
    assert [r["speedup_vs_first"] for r in rows] == [1.0, 2.0, 2.5, 4.0, 1.25]
    assert rows[2]["compile_s"] == 12.0 and math.isnan(rows[0]["compile_s"])
    assert math.isinf(rows[1]["psnr_vs_first_db"])             # identical pixels
    # every pixel off by 10 levels: PSNR = 10 log10(255^2 / 100)
    assert abs(rows[3]["psnr_vs_first_db"] - 10 * math.log10(255 ** 2 / 100)) < 1e-9
    assert rows[0]["toy_geneval/overall"] == 0.5


def test_write_only_for_the_systems_experiments(tmp_path):
    import pandas as pd

    entry = _store(tmp_path, "b", 100)
    (entry / "record.json").write_text(json.dumps(_rec("baseline", gen="b")))
    other = pd.DataFrame({"experiment": ["toy_table"], "path": [str(entry)]})
    assert write_systems_tables(other, tmp_path / "out") == []
    sweep = pd.DataFrame({"experiment": ["batch_sweep"], "path": [str(entry)], "device": ["cpu (test)"]})
    (tmp_path / "out").mkdir()
    written = write_systems_tables(sweep, tmp_path / "out")
    assert [p.name for p in written] == ["batch_sweep.csv", "batch_sweep.md", "batch_sweep.png"]
    assert "| Baseline | 1 | 100 |" in (tmp_path / "out" / "batch_sweep.md").read_text()
