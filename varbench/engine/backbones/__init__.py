"""The backbones, one folder each: `infinity` (Infinity-2B/8B, tiny, toy) and `hart` (HART-0.7B).

A backbone imports only the backbone-agnostic seam in `varbench.engine` (plan, policy, KV cache and
budgets, batch splitting, graphs, memory, FLOPs helpers, text encoders, generation output) and never
another backbone; the seam never imports a backbone (`tests/core/test_layers.py` checks both). A third
backbone is a new folder here plus one line in `FAMILIES`.
"""
