"""DPG-Bench (TencentQQGYLab/ELLA ``dpg_bench/compute_dpg_bench.py``): questions, scoring, the evaluator
and its VQA backends (``questions.py``, ``scoring.py``, ``evaluator.py``, ``official.py``)."""
