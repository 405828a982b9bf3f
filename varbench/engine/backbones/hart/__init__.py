"""HART (mit-han-lab/hart, `hart-0.7b-1024px`): the second backbone, in its own folder.

- `model`: the transformer and the diffusion head, released parameter names, strict loading;
- `sampling`: the released sampling loop (`sample_hart`), the reference the runtime is checked against;
- `tokenizer`: the hybrid tokenizer's image decoder (post_quant_conv + decoder) and strict loading of
  the released `tokenizer/` folder (the quantizer half is `model.HartQuantizer`);
- `text`: the Qwen2 text encoder from a local folder, as the release encodes prompts;
- `state` + `runtime`: `HartRuntime`, the next-stage loop on the shared seams (plans, signals, traces);
- `flops`: analytic FLOPs of what the runtime executed, the diffusion head included;
- `stage_flops` + `presets`: the tokenizer decoder's and the Qwen2 encoder's FLOPs, and the released
  preset's stages counted without building anything.

What is shared with Infinity lives in the seam, outside this folder (`varbench.engine.plan`, `policy`,
`kv_cache`, `residuals`, `batch_split`, `generation`, `flops`, `attention`); what differs (2-D RoPE over a text-context stage, categorical tokens, the residual
diffusion head, the multi-scale residual tokenizer) lives here.
"""
