"""Infinity (FoundationVision/Infinity, 2B and 8B): the first backbone, in its own folder.

- `model`: the transformer, released parameter names and presets (`PRESETS`);
- `bsq_vae`: the BSQ-VAE (bitwise codes, the decoder) and its strict loading;
- `schedules`: the released scale schedules and the 2-D RoPE tables;
- `checkpoints`: loading the released transformer checkpoints;
- `block_step` + `pruned`: one block at one scale, the lean full path and the path under a plan;
- `sampling`: bitwise guided sampling and the per-bit entropy;
- `state` + `runtime`: `InfinityRuntime`, the next-scale loop on the shared seams (plans, signals, traces);
- `flops`, `stage_flops`, `memory`: the analytic counts of what the runtime executed and holds;
- `presets`: the released presets' stages counted without building anything.

What is shared with other backbones lives in `varbench.engine` (plan, policy, KV cache and budgets,
batch splitting, graphs, memory, FLOPs helpers, text encoders, generation output); a backbone imports
only that seam, never another backbone.
"""
