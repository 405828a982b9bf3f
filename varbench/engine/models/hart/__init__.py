"""HART (mit-han-lab/hart, `hart-0.7b-1024px`): the second backbone, in its own folder.

- `model`: the transformer and the diffusion head, released parameter names, strict loading;
- `sampling`: the released sampling loop (`sample_hart`), the reference the runtime is checked against;
- `runtime`: `HartRuntime`, the next-scale loop on the shared seams (plans, signals, traces, FLOPs).

What is shared with Infinity lives outside this folder (`varbench.engine.plan`, `policy`, `flops`
style, timing); what differs (2-D RoPE over a text-context stage, categorical tokens, the residual
diffusion head, the multi-scale residual tokenizer) lives here.
"""
