"""HART's text encoder: a Qwen2 model from a local Hugging Face folder, as the released `sample.py` runs it.

Released path (mit-han-lab/hart@e28a41f `sample.py` + `hart/utils/tools.py::encode_prompts`):
- `AutoTokenizer` / `AutoModel.from_pretrained(--text_model_path)`; the README's folder is
  `mit-han-lab/Qwen2-VL-1.5B-Instruct`. The release pins transformers 4.42.2, which has no `qwen2_vl`
  model type, so that folder must be a plain `qwen2` one (hidden size 1536 = HART's context_dim);
- each prompt tokenized alone, padded to exactly `max_length` (300) and truncated there;
- the system prompt (`HART_SYSTEM_PROMPT`, tokenized once, truncated to 300) is put in front of every
  prompt, attended with mask 1, and its positions cut off the output;
- features = the last hidden state (`hidden_states[-1]`, after the final norm), as float32;
  mask = tokens != pad token. The runtime derives the position ids cumsum(mask) - 1 itself.

Unlike `TextBatch`'s usual convention, padded positions hold the text model's states for the pad tokens,
not zeros: HART attends to all `context_token` positions without a mask and samples its first token from
the last one (a pad for short prompts), so those states are part of the released computation.
"""
from __future__ import annotations

import contextlib
import os
from typing import Optional, Sequence

import torch
import torch.nn as nn

from varbench.core.errors import ConfigError
from varbench.engine.backbones.hart.stage_flops import hart_text_tokens, qwen2_text_flops
from varbench.engine.stage_flops import per_image_shares
from varbench.engine.text import TextBatch

#: the released `llm_system_prompt` (hart/utils/constants.py), byte for byte: the encoder's output depends on
#: every token of it (tests/engine/test_hart_text.py checks its SHA-256 against the one upstream's generator recorded)
HART_SYSTEM_PROMPT = (
    'Given a user prompt, generate an "Enhanced prompt" that provides detailed visual descriptions suitable for '
    "image generation.\n\nExamples:\n- User Prompt: A cat sleeping -> A small, fluffy white cat curled up in a round "
    "shape, sleeping peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.\n- User "
    "Prompt: A busy city street -> A bustling city street scene at dusk, featuring glowing street lamps, a diverse "
    "crowd of people in colorful clothing, and a double-decker bus passing by towering glass skyscrapers.\n\nPlease "
    "generate only the enhanced description for the prompt below and DO NOT include any additional sentences. Start "
    'your response with "Enhanced Prompt:".\n\nUser Prompt:\n'
)


class HartTextEncoder(nn.Module):
    """Qwen2 features for HART: `TextBatch` with features (B, max_length, C) float32, mask (B, max_length) bool
    (True for real tokens) and lens (real tokens per prompt).

    Knobs and what they trade:
    - `max_length`: the padded length, must equal the transformer's `context_token` (300 released); longer
      prompts are truncated there.
    - `use_system_prompt`: the released default (True) conditions every prompt's states on the system prompt
      (its S tokens more through the text model per prompt: some 131-140 with Qwen2's tokenizer, whose
      pre-tokenizer alone makes 131 pieces; 251 with the tiny test tokenizer; cost in
      `varbench.engine.backbones.hart.stage_flops.qwen2_text_flops`); False encodes the prompt alone (other features,
      other images).
    - `dtype`: the weights' dtype. float32 is what `AutoModel.from_pretrained` gave under the release's
      transformers; bfloat16/float16 halve the memory (1.5B: ~6 GB -> 3 GB) and round differently.
    - `autocast_dtype`: sample.py ran the fp32 model under CUDA fp16 autocast; pass torch.float16 (with float32
      weights) to reproduce that numerics on CUDA; None runs in `dtype`.
    """

    def __init__(self, folder: str | os.PathLike, max_length: int = 300, use_system_prompt: bool = True,
                 dtype: torch.dtype = torch.float32, autocast_dtype: Optional[torch.dtype] = None,
                 system_prompt: str = HART_SYSTEM_PROMPT):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        from varbench.engine.checkpoints import require_file

        path = require_file(folder, "HART text encoder folder (Qwen2, mit-han-lab/Qwen2-VL-1.5B-Instruct)",
                            setting="model.text_encoder_path")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        if self.tokenizer.pad_token_id is None:
            raise ConfigError(f"{path}: the tokenizer has no pad token, which HART's mask (tokens != pad) needs; "
                              f"fix: use the released Qwen2 folder (pad token <|endoftext|>)")
        self.model = AutoModel.from_pretrained(str(path), dtype=dtype).eval().requires_grad_(False)
        # a qwen2_vl folder loads as a VL model whose config keeps the width in text_config
        self.hidden_size = self.model.config.get_text_config().hidden_size
        self.max_length, self.use_system_prompt, self.autocast_dtype = max_length, use_system_prompt, autocast_dtype
        self.system_ids = self._ids(system_prompt, pad=False)

    def _ids(self, text: str, pad: bool) -> list[int]:
        # one prompt per call, as released (tokenize_fn); the system prompt is padded to its own length
        kw = dict(padding="max_length") if pad else {}
        return self.tokenizer(text, max_length=self.max_length, truncation=True, **kw).input_ids

    def encode_flops(self, prompts: Sequence[str], negative_prompt: Optional[str] = None) -> list[float]:
        """Each image's share of one generation's encodes (`varbench.engine.stage_flops.text_encoder_flops`):
        one fixed-length pass per prompt, the system prompt and the prompt padded to `max_length`
        (`stage_flops.qwen2_text_flops` over `stage_flops.hart_text_tokens`), batch-independent; the
        unconditional rows, with no negative prompt, encode nothing."""
        one = qwen2_text_flops(self.model.config.get_text_config(), hart_text_tokens(self))
        return per_image_shares([one] * len(prompts), one if negative_prompt else 0.0)

    @torch.no_grad()
    def forward(self, prompts: Sequence[str]) -> TextBatch:
        dev = next(self.model.parameters()).device
        ids = torch.tensor([self._ids(p, pad=True) for p in prompts], dtype=torch.long, device=dev)
        mask = ids != self.tokenizer.pad_token_id
        inputs, attn, cut = ids, mask, 0
        if self.use_system_prompt:
            sys_ids = torch.tensor(self.system_ids, dtype=torch.long, device=dev).expand(len(prompts), -1)
            inputs, attn, cut = torch.cat((sys_ids, ids), 1), torch.cat((torch.ones_like(sys_ids, dtype=torch.bool), mask), 1), sys_ids.shape[1]
        amp = (torch.autocast(dev.type, dtype=self.autocast_dtype) if self.autocast_dtype is not None
               else contextlib.nullcontext())
        with amp:
            out = self.model(input_ids=inputs, attention_mask=attn, use_cache=False)
        feats = out.last_hidden_state[:, cut:].float()     # = hidden_states[-1] (after the final norm)
        return TextBatch(feats, mask, mask.sum(1).tolist())
