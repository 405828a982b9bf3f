"""Build the runtime (model, VAE, text encoder) and the policy from a resolved config, and name the
files they load (hashed into the image store's and the record's keys).

The weight files are listed here, beside the code that loads them (:func:`model_weight_files`
names exactly the paths :func:`build_runtime` reads), so a new weight file cannot be loaded
without being hashed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from varbench.core.filehash import weight_hashes
from varbench.engine.backbones import FAMILIES as BACKBONE_FAMILIES
from varbench.engine.backbones.infinity.checkpoints import load_infinity_weights
from varbench.engine.backbones.infinity.model import PRESETS, Infinity
from varbench.engine.backbones.infinity.runtime import InfinityRuntime
from varbench.engine.checkpoints import require_file


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        from varbench.core.errors import ConfigError

        raise ConfigError(f"runtime.device={name} but CUDA is not available here; use runtime.device=cpu (or auto)")
    return dev


def resolve_dtype(name: str, device: torch.device, family: str = "infinity") -> torch.dtype:
    """``runtime.dtype``: auto = what the release runs on CUDA (Infinity: bfloat16; HART: float16
    autocast, sample.py), float32 on the CPU. float16 is HART's only (Infinity's release has no fp16 path)."""
    from varbench.core.errors import ConfigError

    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.float16 if family == "hart" else torch.bfloat16
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if family == "hart":
        table |= {"float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ConfigError(f"runtime.dtype={name!r}; use auto, {', '.join(k for k in table if len(k) > 4)}")
    return table[name]


#: model families (``model.family``; absent = infinity): one per backbone folder
#: (`varbench.engine.backbones.FAMILIES`), each built by its entry in `BUILDERS`
FAMILIES = tuple(BACKBONE_FAMILIES)


def model_family(model_cfg: Any) -> str:
    """The backbone a model config builds: ``model.family`` (HART's configs set ``hart``), else
    ``infinity`` (Infinity-2B/8B, tiny, toy). Methods and presets state which families they support."""
    family = str(model_cfg.get("family") or "infinity")
    if family not in FAMILIES:
        from varbench.core.errors import ConfigError

        raise ConfigError(f"model.family={family!r}; use one of {', '.join(FAMILIES)}")
    return family


def is_hart(rt) -> bool:
    """Whether a built runtime is HART's (`HartRuntime.family`; Infinity's runtime has no such attribute)."""
    return getattr(rt, "family", "infinity") == "hart"


def build_runtime(model_cfg: Any, device: torch.device, dtype: torch.dtype):
    """Model presets with released weights, random weights, or the shipped toy model."""
    if model_cfg.preset == "toy":
        from varbench.toy.load import load_toy_runtime

        return load_toy_runtime(device=str(device))
    return BUILDERS[model_family(model_cfg)](model_cfg, device, dtype)


def build_infinity_runtime(model_cfg: Any, device: torch.device, dtype: torch.dtype):
    """An Infinity runtime: random init from the presets (``model.random_weights``), or the released
    transformer, VAE and text encoder files."""
    from varbench.engine.backbones.infinity.bsq_vae import BSQVAE, load_vae
    from varbench.engine.text import T5TextEncoder, WordTextEncoder

    cfg = PRESETS[model_cfg.preset]
    if model_cfg.random_weights:
        torch.manual_seed(int(model_cfg.get("seed", 0) or 0))
        with torch.device(device):
            model = Infinity(cfg)
            vae = BSQVAE(model_cfg.vae_preset)
    else:
        with torch.device("meta"):
            model = Infinity(cfg)
        model = model.to_empty(device="cpu")
        load_infinity_weights(model, model_cfg.weights)
        vae = load_vae(require_file(model_cfg.vae, "VAE weights"), model_cfg.vae_preset)
    if model_cfg.text_encoder == "t5":
        if model_cfg.random_weights:
            raise ValueError("model.random_weights=true needs a text encoder without weights; set model.text_encoder=word")
        text = T5TextEncoder(model_cfg.text_encoder_path)
    elif model_cfg.text_encoder == "word":
        text = WordTextEncoder(dim=cfg.text_channels, max_len=min(cfg.text_maxlen, 64))
    else:
        raise ValueError(f"model.text_encoder={model_cfg.text_encoder!r}; use t5 or word")
    return InfinityRuntime(model, vae, text, device=device, dtype=dtype)


def build_hart_runtime(model_cfg: Any, device: torch.device, dtype: torch.dtype):
    """A HART runtime: random init from the presets (``model.random_weights``), or the released
    folders (``model.weights`` = ``<hart-0.7b-1024px>/llm``, ``model.vae`` = its ``tokenizer/``,
    ``model.text_encoder_path`` = the Qwen2 folder), each loaded strictly. With the released files,
    the folders' config.json decide the architecture (the preset is only a guess of them)."""
    from varbench.engine.backbones.hart.model import HART, HART_PRESETS, hart_config_from_json, load_hart_weights
    from varbench.engine.backbones.hart.runtime import HartRuntime
    from varbench.engine.backbones.hart.tokenizer import build_hart_tokenizer, load_hart_tokenizer
    from varbench.engine.text import WordTextEncoder

    if model_cfg.random_weights and model_cfg.text_encoder != "word":   # before building 0.7B parameters
        raise ValueError("model.random_weights=true needs a text encoder without weights; set model.text_encoder=word")
    if model_cfg.random_weights:
        cfg = HART_PRESETS[model_cfg.preset]
        torch.manual_seed(int(model_cfg.get("seed", 0) or 0))
        with torch.device(device):
            model = HART(cfg)
            quant, decoder = build_hart_tokenizer(model_cfg.vae_preset, cfg.patch_nums)
    else:
        llm = require_file(model_cfg.weights, "HART transformer folder (hart-0.7b-1024px/llm)", setting="model.weights")
        tok = require_file(model_cfg.vae, "HART tokenizer folder (hart-0.7b-1024px/tokenizer)", setting="model.vae")
        cfg = hart_config_from_json(require_file(llm / "config.json", "HART transformer config.json", setting="model.weights"),
                                    tok / "config.json")
        with torch.device("meta"):
            model = HART(cfg)
        model = model.to_empty(device="cpu")
        load_hart_weights(model, llm)
        quant, decoder = load_hart_tokenizer(tok, cfg.patch_nums)
    if model_cfg.text_encoder == "qwen2":
        from varbench.engine.backbones.hart.text import HartTextEncoder

        # the release encodes under the loop's fp16 autocast on CUDA (sample.py); fp32 elsewhere
        half = dtype if device.type == "cuda" and dtype != torch.float32 else None
        text = HartTextEncoder(model_cfg.text_encoder_path, max_length=cfg.context_token, autocast_dtype=half)
    elif model_cfg.text_encoder == "word":
        text = WordTextEncoder(dim=cfg.context_dim, max_len=cfg.context_token)
    else:
        raise ValueError(f"model.text_encoder={model_cfg.text_encoder!r} on HART; use qwen2 (released) or word (random)")
    return HartRuntime(model, quant, decoder, text, device=device, dtype=dtype)


#: family -> the function that builds its runtime from a model config (a new backbone adds its line)
BUILDERS = {"infinity": build_infinity_runtime, "hart": build_hart_runtime}


def configure_runtime(rt, runtime_cfg: Any):
    """Apply `runtime.cuda_graphs` (auto | true | false), `runtime.fused_entropy` and the systems knobs
    (`runtime.compile`/`compile_fullgraph`: the block functions, varbench.engine.backbones.infinity.compiled;
    `runtime.quant`: the blocks' linears, .../infinity/quant.py; `runtime.attn_backend`: the SDPA kernel,
    varbench.engine.attn_backend) to a built runtime. HART runs eagerly (no captured steps, no fused entropy kernel, no compiled
    blocks): auto means off there, true is refused (and compile at the config boundary)."""
    from varbench.core.errors import ConfigError

    graphs = str(runtime_cfg.get("cuda_graphs", "auto")).lower()
    if graphs not in ("auto", "true", "false"):
        raise ValueError(f"runtime.cuda_graphs={graphs!r}; use auto, true or false")
    if is_hart(rt):
        if graphs == "true":
            raise ConfigError("runtime.cuda_graphs=true: the HART runtime has no CUDA-graph path (it runs eagerly); "
                              "use runtime.cuda_graphs=auto (or false)")
        rt.attn_backend = str(runtime_cfg.get("attn_backend", "auto"))   # read by HART's generate (below)
        return rt
    if graphs == "true" and rt.device.type != "cuda":
        raise ValueError(f"runtime.cuda_graphs=true needs a CUDA device, but the runtime is on {rt.device}; "
                         "use runtime.cuda_graphs=auto (or false)")
    from varbench.engine.backbones.infinity.compiled import MODES_WITH_OWN_CUDA_GRAPHS, block_ops
    from varbench.engine.backbones.infinity.quant import quantise_blocks

    compile_mode = runtime_cfg.get("compile", "off")
    compile_mode = "off" if compile_mode in (False, None) else str(compile_mode)
    # inductor's own CUDA graphs (reduce-overhead, max-autotune) replace ours (compiled.py's docstring)
    own_graphs = compile_mode in MODES_WITH_OWN_CUDA_GRAPHS
    rt.cuda_graphs = (rt.device.type == "cuda" and not own_graphs) if graphs == "auto" else graphs == "true"
    rt.fused_entropy = bool(runtime_cfg.get("fused_entropy", True))
    # per-image plans of different shapes: one padded step (default) or sub-batches (HART always splits)
    rt.adaptive_batch = str(runtime_cfg.get("adaptive_batch", "pad"))
    rt.block_ops = block_ops(compile_mode, bool(runtime_cfg.get("compile_fullgraph", False)))
    quantise_blocks(rt, str(runtime_cfg.get("quant", "none") or "none"))
    rt.attn_backend = str(runtime_cfg.get("attn_backend", "auto"))
    return rt


def build_policy_from_cfg(method_cfg: Any):
    from omegaconf import OmegaConf

    from varbench.policies import build_policy

    knobs = method_cfg.get("knobs")
    knobs = OmegaConf.to_container(knobs, resolve=True) if knobs is not None else {}
    return build_policy(method_cfg.name, **knobs)


def generation_resolution(rt, h_div_w: float, pn: str, schedule=None) -> list[int]:
    """[H, W] in pixels of the images a job generates: the last token grid times the decoder's stride."""
    if is_hart(rt):
        p = rt.schedule[-1][0]
        stride = rt.vae.cfg.downsample if rt.vae is not None else 16
        return [p * stride, p * stride]
    from varbench.engine.backbones.infinity.schedules import scale_schedule

    h, w = (schedule or scale_schedule(h_div_w, pn))[-1]
    stride = rt.vae.cfg.patch_size * (2 if rt.cfg.patchify else 1) if hasattr(rt.vae, "cfg") else 16
    return [h * stride, w * stride]


def generation_kwargs(cfg: Any, rt) -> dict:
    """The keyword arguments of ``rt.generate`` that a job's config sets: the ``generation`` group
    (aspect ratio, resolution preset, top-k/top-p, CFG and temperature as a number or a per-scale
    list, the negative prompt) and the model's explicit scale ``schedule`` when it has one."""
    from omegaconf import OmegaConf

    g = cfg.generation
    kw = dict(h_div_w=float(g.h_div_w), pn=str(g.pn), top_k=int(g.top_k), top_p=float(g.top_p),
              cfg=OmegaConf.to_object(g.cfg) if OmegaConf.is_list(g.cfg) else float(g.cfg),
              tau=OmegaConf.to_object(g.tau) if OmegaConf.is_list(g.tau) else float(g.tau),
              negative_prompt=g.negative_prompt)
    schedule = cfg.model.get("schedule")
    if schedule is not None:
        kw["schedule"] = [tuple(hw) for hw in schedule]
    if is_hart(rt):
        # HART's codebook mixing (sample.py's --more_smooth); the key exists only in HART configs
        kw["more_smooth"] = bool(g.get("more_smooth", False))
    return kw


def model_weight_files(model_cfg) -> dict:
    """``{name: path}`` of every file or folder the model loads weights from (none for random init).
    Names are file names (``infinity_2b_reg.pth``); HART's folders, whose own names (``llm``,
    ``tokenizer``) say little, are named with their parent (``hart-0.7b-1024px/llm``)."""
    if model_cfg.get("preset") == "toy":
        from varbench.toy.load import FILES, WEIGHTS_DIR

        return {name: WEIGHTS_DIR / name for name in FILES.values()}
    if model_cfg.get("random_weights"):
        return {}
    hart = model_family(model_cfg) == "hart"
    out = {}
    paths = [model_cfg.get("weights"), model_cfg.get("vae")]
    if model_cfg.get("text_encoder") in ("t5", "qwen2"):
        paths.append(model_cfg.get("text_encoder_path"))
    for i, p in enumerate(paths):
        if p:
            path = Path(str(p))
            out[f"{path.parent.name}/{path.name}" if hart and i < 2 else path.name] = str(p)
    return out


def method_file_hashes(method: dict) -> dict:
    """``{name: sha256}`` of the files a method loads besides the model's weights: SkipVAR's four
    decision-model files (``decision_models/<file>``; a ``compose`` member's as
    ``policies[i].decision_models/<file>``). They are hashed into the generation and entry keys, as
    the weights are: retraining a decision-model folder in place (``experiments.skipvar_train`` into
    the same ``--out``) makes new images and a new record. Files that are absent contribute nothing
    (the policy reports them, naming the folder, when it loads)."""
    from varbench.policies.skipvar_features import decision_model_paths

    knobs = method.get("knobs") or {}
    members = [("", method.get("name"), knobs)]
    if method.get("name") == "compose":
        members = [(f"policies[{i}].", m.get("name"), m.get("knobs") or {})
                   for i, m in enumerate(knobs.get("policies") or []) if isinstance(m, dict)]
    named = {}
    for prefix, name, kn in members:
        if name == "skipvar":
            paths = decision_model_paths(kn.get("decision_models"), kn.get("classifier") or "Logistic_Regression")
            named.update({f"{prefix}decision_models/{n}": p for n, p in paths.items()})
    return weight_hashes(named)


def model_weight_hashes(model_cfg) -> dict:
    """``{file name: sha256}`` of the model's weights (folders: ``<folder>/<file>``); no paths."""
    return weight_hashes(model_weight_files(model_cfg))
