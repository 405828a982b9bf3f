"""Images/s of each quality scorer at its real architecture size, with RANDOM weights.

    python -m experiments.scorer_throughput --device cuda --scorers hpsv2,imagereward,geneval,fidelity \
        --images 64 --batch 16 --out results/scorer_throughput.json
    python -m experiments.scorer_throughput --size tiny --images 4 --batch 2 --image-size 64   # CPU test path

Released scorer weights cannot be downloaded here, but a forward pass costs the same whatever the
weight values are. So this script writes random weights of each scorer's *real* architecture into a
temporary folder, in the exact file formats the evaluators load (HPS `{"state_dict": ...}` .pt,
ImageReward.pt in the *original* upstream key layout, a bert-base-uncased-shaped vocab.txt, a
Mask2Former `save_pretrained` folder, an open_clip state dict, a torchvision AlexNet hub checkpoint
for LPIPS), builds every evaluator with `evaluators.build_evaluator` pointing at those files, and
times `update()` over synthetic images: the same code path a benchmark run takes, preprocessing
included. Scores produced here mean nothing; only seconds and memory do.

What is timed, per scorer: one untimed warm-up `update()` of one batch (CUDA kernels, cuDNN autotune,
GenEval's per-class colour text embeddings), then `reset()`, then `update()` once per batch of
`--batch` images over `--images` images, bracketed by `torch.cuda.synchronize()`. `compute()` runs
afterwards, untimed, only to check that every image was scored. Setup (model construction, hashing,
loading, moving to the device) and weight-file writing are reported separately.

`--size tiny` uses the committed tiny architectures (tests/fixtures/evaluators/*.json, the
geneval_tiny config, the tiny tokenizer) but writes their random weights with the *same* writers as
`--size real`, so the CPU test exercises every file format the device run will write.

GenEval with random weights: the official thresholds (0.3/0.9) would reject every random detection,
so the rules would never reach the colour CLIP. Thresholds are therefore 0, and the random detector's
class bias is raised (+3 logits) for the classes the synthetic metadata names, so those classes are
reliably among the top-100 detections and colour/position rules run as on a real image. The number
of colour-CLIP crops classified is reported (`extra.colour_crops`).

The JSON is rewritten after every scorer (atomically), so a run cut off by a time limit keeps every
finished scorer. Exit status is 1 if any scorer failed (its error is in the JSON).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "varbench" / "toy" / "scorers"   # the tiny random scorers
SCHEMA = "scorer_throughput/1"
RANDOM_NOTE = ("weights are RANDOM (same architecture and file format as the released checkpoints): "
               "seconds and memory only; every score in this run is meaningless")
TOKENIZER_NOTE = ("ImageReward real-size tokenizer is a placeholder vocab.txt with bert-base-uncased's 30522-entry "
                  "layout (real special tokens at ids 0-103, the synthetic prompts' words, a-z and ##a-##z, then "
                  "placeholder words); token ids differ from bert-base-uncased, token count per prompt is similar, "
                  "and the model always sees 35 padded tokens, so timing is unaffected")
#: scorer key -> (evaluator name, extra kwargs). The *_amp variants time the fp16-autocast option.
SCORERS: dict[str, tuple[str, dict]] = {
    "hpsv2": ("hpsv2", {"precision": "fp32"}),
    "hpsv2_amp": ("hpsv2", {"precision": "amp"}),
    "imagereward": ("imagereward", {}),
    "geneval": ("geneval", {"precision": "fp32"}),
    "geneval_amp": ("geneval", {"precision": "amp"}),
    "fidelity": ("fidelity", {}),
}
DEFAULT_SCORERS = "hpsv2,imagereward,geneval,fidelity"
#: BLIP's contrastive embedding width (vision_proj/text_proj rows in ImageReward.pt; unused for scoring)
BLIP_EMBED_DIM = 256
#: logit bias added to the random detector's classifier for the classes the synthetic metadata names
GENEVAL_CLASS_BIAS = 3.0


# ---------------------------------------------------------------------------------------------------
# synthetic inputs
#: (tag, prompt, GenEval metadata) cycled over the images; classes are COCO names as GenEval spells them
GENEVAL_CASES = [
    ("single_object", "a photo of a dog", {"include": [{"class": "dog", "count": 1}]}),
    ("two_object", "a photo of a dog and a bench", {"include": [{"class": "dog", "count": 1}, {"class": "bench", "count": 1}]}),
    ("counting", "a photo of three cups", {"include": [{"class": "cup", "count": 3}], "exclude": [{"class": "cup", "count": 4}]}),
    ("colors", "a photo of a red car", {"include": [{"class": "car", "count": 1, "color": "red"}]}),
    ("position", "a photo of a dog left of a bench",
     {"include": [{"class": "bench", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}]}),
    ("color_attr", "a photo of a blue car and a yellow cup",
     {"include": [{"class": "car", "count": 1, "color": "blue"}, {"class": "cup", "count": 1, "color": "yellow"}]}),
]
HPS_STYLES = ("anime", "concept-art", "paintings", "photo")
EXTRA_PROMPT = ", highly detailed, golden hour light, 35mm photograph"


def geneval_classes() -> list[str]:
    return sorted({c["class"] for _, _, m in GENEVAL_CASES for c in m["include"]})


def synthetic_image(rng: np.random.Generator, size: int):
    """A smooth random colour field plus mild noise: photo-like statistics, cheap to make at 1024^2."""
    from PIL import Image

    grid = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), "RGB")
    base = np.asarray(grid.resize((size, size), Image.BICUBIC), dtype=np.int16)
    noise = rng.integers(-12, 13, base.shape, dtype=np.int16)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")


def synthetic_samples(n: int, size: int, seed: int = 0) -> list:
    """`n` Samples with GenEval metadata (tag/include/exclude), an HPS style and a reference image (fidelity)."""
    from varbench.evaluators.base import Sample

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        tag, prompt, meta = GENEVAL_CASES[i % len(GENEVAL_CASES)]
        img = synthetic_image(rng, size)
        ref = np.asarray(img, dtype=np.int16) + rng.integers(-4, 5, (size, size, 3), dtype=np.int16)
        from PIL import Image

        out.append(Sample(prompt_index=i // 2, sample_index=i % 2, prompt=prompt + EXTRA_PROMPT, image=img, seed=i,
                          metadata={"tag": tag, "prompt": prompt, "style": HPS_STYLES[i % 4], **meta},
                          reference=Image.fromarray(np.clip(ref, 0, 255).astype(np.uint8), "RGB")))
    return out


# ---------------------------------------------------------------------------------------------------
# random weights in the released formats
Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


def module_shapes(build: Callable[[], torch.nn.Module]) -> Shapes:
    """{key: (shape, dtype)} of `build()`'s state dict, built on the meta device (no memory, no init cost).

    Some library versions call `.item()` during construction, which the meta device cannot do; then the
    module is built on the CPU instead (same shapes, just slower and memory-hungry)."""
    try:
        with torch.device("meta"):
            m = build()
    except Exception as e:  # noqa: BLE001 - any construction failure on meta: fall back to a real build
        print(f"[scorer_throughput] meta-device build failed ({type(e).__name__}: {e}); building on CPU", flush=True)
        m = build()
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in m.state_dict().items()}
    del m
    return shapes


def random_state(shapes: Shapes, device: str = "cpu", dtype: Optional[torch.dtype] = None, seed: int = 0) -> dict:
    """Random CPU tensors for `shapes`, drawn on `device` (fast on a GPU), stored as `dtype` (None = as shaped).

    Init keeps activations in a normal range (what matters for timing: no inf/NaN, no denormals):
    1-D `*weight` (norm scales) = 1 + N(0, 0.02), other floats N(0, 0.02), 0-d tensors (logit scales)
    log(1/0.07), integer buffers (position ids) arange along their last dimension.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for k, (shape, dt) in shapes.items():
        if not dt.is_floating_point:
            n = shape[-1] if shape else 1
            out[k] = torch.arange(n, dtype=dt).expand(shape).clone() if shape else torch.tensor(0, dtype=dt)
            continue
        if len(shape) == 0:
            t = torch.tensor(math.log(1 / 0.07))
        else:
            t = torch.randn(shape, generator=gen, device=device) * 0.02
            if len(shape) == 1 and k.endswith("weight"):
                t += 1.0
        out[k] = t.to(dtype or dt).cpu()
    return out


def _open_clip_model(name: str, config: Optional[str]):
    import open_clip

    if config:
        open_clip.add_model_config(config)
    return open_clip.create_model(name, pretrained=None, device="meta")


def open_clip_shapes(name: str, config: Optional[str] = None) -> Shapes:
    """State-dict shapes of open_clip architecture `name` (registered from `config` when given)."""
    return module_shapes(lambda: _open_clip_model(name, config))


def write_hps(folder: Path, model_name: str, model_config: Optional[str], device: str) -> Path:
    """HPS_v2.1_compressed.pt: `{"state_dict": open_clip state dict}`, fp16 (the loader casts to fp32)."""
    path = folder / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": random_state(open_clip_shapes(model_name, model_config), device, torch.float16, seed=1)}, path)
    return path


def write_open_clip(path: Path, model_name: str, model_config: Optional[str], device: str) -> Path:
    """Plain open_clip state dict (GenEval colour CLIP), fp16 (the loader casts to fp32)."""
    torch.save(random_state(open_clip_shapes(model_name, model_config), device, torch.float16, seed=2), path)
    return path


# ImageReward: our module keys -> upstream ImageReward.pt keys (inverse of map_imagereward_state_dict)
_IR_VISION_INVERSE = [
    (r"^embeddings\.class_embedding$", "cls_token"),
    (r"^embeddings\.position_embedding$", "pos_embed"),
    (r"^embeddings\.patch_embedding\.(weight|bias)$", r"patch_embed.proj.\1"),
    (r"^encoder\.layers\.(\d+)\.layer_norm1\.(weight|bias)$", r"blocks.\1.norm1.\2"),
    (r"^encoder\.layers\.(\d+)\.layer_norm2\.(weight|bias)$", r"blocks.\1.norm2.\2"),
    (r"^encoder\.layers\.(\d+)\.self_attn\.qkv\.(weight|bias)$", r"blocks.\1.attn.qkv.\2"),
    (r"^encoder\.layers\.(\d+)\.self_attn\.projection\.(weight|bias)$", r"blocks.\1.attn.proj.\2"),
    (r"^encoder\.layers\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)$", r"blocks.\1.mlp.\2.\3"),
    (r"^post_layernorm\.(weight|bias)$", r"norm.\1"),
]


def unmap_imagereward_keys(keys) -> dict[str, str]:
    """{our key: upstream ImageReward.pt key}; raises on a key no rule covers (the inverse must be total)."""
    import re

    out, unknown = {}, []
    for k in keys:
        if k.startswith("vision."):
            sub = k[len("vision."):]
            for pat, rep in _IR_VISION_INVERSE:
                if re.match(pat, sub):
                    out[k] = "blip.visual_encoder." + re.sub(pat, rep, sub)
                    break
            else:
                unknown.append(k)
        elif k.startswith("text."):
            out[k] = "blip.text_encoder." + k[len("text."):]
        elif k.startswith("mlp.layers."):
            out[k] = k
        else:
            unknown.append(k)
    if unknown:
        raise KeyError(f"no upstream ImageReward key for {unknown[:4]}")
    return out


def imagereward_upstream_shapes(config: dict) -> Shapes:
    """Shapes of an ImageReward.pt in the upstream layout for `config` (REAL_CONFIG = the released model).

    = our module's keys renamed back, plus what the upstream file carries and scoring drops: BLIP's
    `vision_proj`/`text_proj` (256-d contrastive heads) and the text `embeddings.position_ids` buffer.
    """
    from varbench.evaluators.imagereward import ImageRewardModel

    ours = module_shapes(lambda: ImageRewardModel(config))
    names = unmap_imagereward_keys(ours)
    up = {names[k]: v for k, v in ours.items()}
    vh, th = config["vision"]["hidden_size"], config["text"]["hidden_size"]
    up["blip.vision_proj.weight"], up["blip.vision_proj.bias"] = ((BLIP_EMBED_DIM, vh), torch.float32), ((BLIP_EMBED_DIM,), torch.float32)
    up["blip.text_proj.weight"], up["blip.text_proj.bias"] = ((BLIP_EMBED_DIM, th), torch.float32), ((BLIP_EMBED_DIM,), torch.float32)
    up.setdefault("blip.text_encoder.embeddings.position_ids",
                  ((1, config["text"]["max_position_embeddings"]), torch.int64))
    return up


def write_imagereward(folder: Path, config: dict, device: str) -> Path:
    """ImageReward.pt: flat state dict in the upstream key layout, fp16 floats (the loader casts to fp32)."""
    path = folder / "ImageReward.pt"
    torch.save(random_state(imagereward_upstream_shapes(config), device, torch.float16, seed=3), path)
    return path


def write_bert_vocab(folder: Path, extra_words=(), size: int = 30522) -> Path:
    """A vocab.txt with bert-base-uncased's special-token layout and `size` entries (see TOKENIZER_NOTE)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?'-")
    words = sorted({w.strip(".,").lower() for w in extra_words if w.strip(".,")})
    for w in letters + [f"##{c}" for c in letters] + words:
        if w not in vocab:
            vocab.append(w)
    vocab += [f"placeholder{i}" for i in range(size - len(vocab))]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder


def write_geneval(folder: Path, m2f_config, clip_name: str, clip_config: Optional[str], device: str) -> Path:
    """`folder/m2f` (config.json + fp32 model.safetensors; fp32 because from_pretrained may keep the file's
    dtype) and `folder/clip.bin` (open_clip state dict). The classifier bias favours the metadata's classes."""
    from safetensors.torch import save_file
    from transformers import Mask2FormerForUniversalSegmentation

    from varbench.evaluators.geneval.rules import COCO80_GENEVAL

    m2f = folder / "m2f"
    m2f.mkdir(parents=True, exist_ok=True)
    state = random_state(module_shapes(lambda: Mask2FormerForUniversalSegmentation(m2f_config)), device, torch.float32,
                         seed=4)
    for c in geneval_classes():
        state["class_predictor.bias"][COCO80_GENEVAL.index(c)] += GENEVAL_CLASS_BIAS
    state["criterion.empty_weight"].fill_(1.0)  # loss-only buffer; as HF initialises it
    save_file({k: v.contiguous() for k, v in state.items()}, str(m2f / "model.safetensors"), metadata={"format": "pt"})
    m2f_config.save_pretrained(str(m2f))
    write_open_clip(folder / "clip.bin", clip_name, clip_config, device)
    return folder


def write_alexnet_hub(hub_dir: Path, device: str) -> Path:
    """torchvision AlexNet checkpoint where `torch.hub` looks for it (what LPIPS loads).

    Features (the only part LPIPS runs) are random fp32; the 58M-parameter classifier, never run by
    LPIPS, is stored as stride-0 zeros (a few bytes on disk, full shape after loading)."""
    import torchvision

    from varbench.evaluators.fidelity import LPIPS_BACKBONE_FILES

    shapes = module_shapes(lambda: torchvision.models.alexnet())
    state = random_state({k: v for k, v in shapes.items() if k.startswith("features.")}, device, seed=5)
    state.update({k: torch.zeros(()).expand(s) for k, (s, _) in shapes.items() if not k.startswith("features.")})
    path = hub_dir / "checkpoints" / LPIPS_BACKBONE_FILES["alex"]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


# ---------------------------------------------------------------------------------------------------
# per-scorer: write files, evaluator kwargs
def prepare(key: str, size: str, work: Path, device: str, files: dict) -> tuple[dict, dict]:
    """Write (once per work folder) the files scorer `key` needs; return (evaluator kwargs, notes)."""
    name, extra = SCORERS[key]
    notes: dict[str, Any] = {}
    if name == "hpsv2":
        model_name, cfg = ("ViT-H-14", None) if size == "real" else ("hps_tiny", str(FIX / "hps_tiny.json"))
        if "hps" not in files:
            files["hps"] = write_hps(work, model_name, cfg, device)
        return {"weights": str(files["hps"]), "model_name": model_name, "model_config": cfg, **extra}, notes
    if name == "imagereward":
        from varbench.evaluators.imagereward import REAL_CONFIG

        if size == "real":
            config, cfg_path = REAL_CONFIG, None
            if "ir_tok" not in files:
                words = " ".join(p + EXTRA_PROMPT for _, p, _ in GENEVAL_CASES).split()
                files["ir_tok"] = write_bert_vocab(work / "bert-base-uncased", words)
            notes["tokenizer"] = TOKENIZER_NOTE
        else:
            cfg_path = str(FIX / "imagereward_tiny.json")
            config = json.loads(Path(cfg_path).read_text())
            files["ir_tok"] = FIX / "ir_tiny_tokenizer"
        if "ir" not in files:
            files["ir"] = write_imagereward(work, config, device)
        return {"weights": str(files["ir"]), "tokenizer_dir": str(files["ir_tok"]), "model_config": cfg_path, **extra}, notes
    if name == "geneval":
        if size == "real":
            from varbench.evaluators.geneval.convert_mmdet import build_hf_config

            m2f_cfg, clip_name, clip_cfg, scale = build_hf_config(), "ViT-L-14-quickgelu", None, (1333, 800)
        else:
            from transformers import Mask2FormerConfig

            m2f_cfg = Mask2FormerConfig.from_pretrained(str(FIX / "geneval_tiny" / "m2f"))
            clip_name, clip_cfg, scale = "clip_tiny_qg", str(FIX / "geneval_tiny" / "clip_tiny_qg.json"), (64, 64)
        if "geneval" not in files:
            files["geneval"] = write_geneval(work / "geneval", m2f_cfg, clip_name, clip_cfg, device)
        notes["thresholds"] = (f"threshold = counting_threshold = 0 (official 0.3/0.9) and classifier bias "
                               f"+{GENEVAL_CLASS_BIAS} for {geneval_classes()}, so random detections reach the rules")
        return {"backend": "native", "weights_dir": str(files["geneval"]), "detector_dir": "m2f",
                "detector_name": "random-weights", "clip_weights": "clip.bin", "clip_model": clip_name,
                "clip_model_config": clip_cfg, "detector_scale": list(scale), "threshold": 0.0,
                "counting_threshold": 0.0, **extra}, notes
    if name == "fidelity":
        if "alexnet" not in files:
            files["alexnet"] = write_alexnet_hub(work / "hub", device)
        notes["lpips"] = "AlexNet features random; PSNR/SSIM run on CPU by design of evaluators/fidelity.py"
        return {"lpips": True, "lpips_net": "alex", **extra}, notes
    raise ValueError(name)


@contextlib.contextmanager
def hub_dir(path: Optional[Path]):
    """Point torch.hub at `path` (LPIPS's AlexNet lookup) for the duration, then restore."""
    old = torch.hub.get_dir()
    if path is not None:
        torch.hub.set_dir(str(path))
    try:
        yield
    finally:
        torch.hub.set_dir(old)


class _CountingClassifier:
    """Wraps GenEval's colour classifier to count the crops it classifies (reported, not changing results)."""

    def __init__(self, inner):
        self.inner, self.calls, self.crops = inner, 0, 0

    def __call__(self, image, objs, classname):
        self.calls += 1
        self.crops += len(objs)
        return self.inner(image, objs, classname)


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _gb(n: int) -> float:
    return round(n / 2**30, 3)


def run_scorer(key: str, size: str, work: Path, device: str, samples: list, batch: int, files: dict,
               max_seconds: float) -> dict:
    """Write files, build + set up the evaluator, warm up, time `update()` batches; one result dict."""
    from varbench.evaluators import build_evaluator

    name = SCORERS[key][0]
    cuda = str(device).startswith("cuda")
    t0 = time.perf_counter()
    kwargs, notes = prepare(key, size, work, device, files)
    write_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    ev = build_evaluator(name, device=device, **({"batch_size": batch} if name in ("hpsv2", "imagereward") else {}), **kwargs)
    with hub_dir(work / "hub" if name == "fidelity" else None):
        ev.setup(device)
    _sync(device)
    setup_s = time.perf_counter() - t0
    mem_after_setup = torch.cuda.memory_allocated() if cuda else None
    counter = None
    if name == "geneval":
        counter = ev._clf = _CountingClassifier(ev._clf)
    t0 = time.perf_counter()
    ev.update(samples[:batch])
    _sync(device)
    warmup_s = time.perf_counter() - t0
    ev.reset()
    peak_setup = torch.cuda.max_memory_allocated() if cuda else None
    if counter:
        counter.calls = counter.crops = 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    batch_s, done = [], 0
    t_start = time.perf_counter()
    truncated = False
    for i in range(0, len(samples), batch):
        t0 = time.perf_counter()
        ev.update(samples[i:i + batch])
        _sync(device)
        batch_s.append(time.perf_counter() - t0)
        done = min(i + batch, len(samples))
        if time.perf_counter() - t_start > max_seconds and done < len(samples):
            truncated = True
            break
    total = sum(batch_s)
    res = ev.compute()
    scored = int(res.metrics.get("n_images", len(res.per_sample)))
    if scored != done:
        raise RuntimeError(f"{key}: timed {done} images but compute() reports {scored}")
    out = {"status": "ok", "evaluator": name, "images": done, "images_requested": len(samples), "truncated": truncated,
           "seconds": round(total, 4), "images_per_s": round(done / total, 4) if total > 0 else None,
           "s_per_image": round(total / done, 5) if done else None, "batch": batch,
           "batch_seconds": [round(b, 4) for b in batch_s], "warmup_s": round(warmup_s, 3),
           "setup_s": round(setup_s, 3), "write_s": round(write_s, 3),
           "config": {k: v for k, v in kwargs.items() if k not in ("weights", "weights_dir", "tokenizer_dir")},
           "notes": notes, "version_info": _jsonable(ev.version_info())}
    if cuda:
        out["peak_gpu_mem_gb_timed"] = _gb(torch.cuda.max_memory_allocated())
        out["peak_gpu_mem_gb_setup_warmup"] = _gb(peak_setup)
        out["gpu_mem_gb_after_setup"] = _gb(mem_after_setup)
    pre = preprocess_seconds(name, samples[:batch])
    if pre is not None:
        out["preprocess_s_per_image"] = round(pre, 5)  # CPU image preprocessing alone (part of the timed update)
    if counter:
        out["extra"] = {"colour_calls": counter.calls, "colour_crops": counter.crops,
                        "correct_images": res.metrics.get("correct_images")}
    del ev
    return out


def preprocess_seconds(name: str, samples: list) -> Optional[float]:
    """Seconds per image of the evaluator's own CPU preprocessing alone (HPS, ImageReward), for the breakdown."""
    if name == "hpsv2":
        from varbench.evaluators.hpsv2 import hps_preprocess as fn
    elif name == "imagereward":
        from varbench.evaluators.imagereward import ir_preprocess as fn
    else:
        return None
    t0 = time.perf_counter()
    for s in samples:
        fn(s.image)
    return (time.perf_counter() - t0) / max(len(samples), 1)


def _jsonable(x):
    try:
        json.dumps(x)
        return x
    except TypeError:
        return json.loads(json.dumps(x, default=str))


def env_info(device: str) -> dict:
    import torchvision
    import transformers

    info = {"device": device, "torch": torch.__version__, "torchvision": torchvision.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "host": platform.node(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    try:
        import open_clip

        info["open_clip"] = open_clip.__version__
    except ImportError:
        info["open_clip"] = None
    if str(device).startswith("cuda"):
        info["device_name"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
        info["gpu_mem_total_gb"] = _gb(torch.cuda.get_device_properties(0).total_memory)
    else:
        info["device_name"] = platform.processor() or platform.machine()
    return info


def write_json(path: Path, obj: dict) -> None:
    """Atomic rewrite, so a kill mid-write never leaves a truncated file."""
    from varbench.core.jsonio import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", choices=("real", "tiny"), default="real",
                   help="real = released architectures (the point); tiny = test fixtures' architectures (CPU tests)")
    p.add_argument("--scorers", default=DEFAULT_SCORERS, help=f"comma list of {sorted(SCORERS)}")
    p.add_argument("--images", type=int, default=64, help="timed images per scorer (more = steadier numbers, longer run)")
    p.add_argument("--batch", type=int, default=16, help="images per update() call (and HPS/ImageReward forward batch)")
    p.add_argument("--image-size", type=int, default=1024, help="synthetic image side (Infinity generates 1024^2)")
    p.add_argument("--max-seconds", type=float, default=120.0,
                   help="per-scorer cap on the timed loop; stops after the batch that crosses it (marked truncated)")
    p.add_argument("--workdir", default=None, help="where random weight files go (default: a new temp folder, removed)")
    p.add_argument("--keep-files", action="store_true", help="keep the weight files (default: delete at the end)")
    p.add_argument("--out", default="results/scorer_throughput.json")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    a.scorer_list = [s.strip() for s in a.scorers.split(",") if s.strip()]
    bad = [s for s in a.scorer_list if s not in SCORERS]
    if bad:
        p.error(f"unknown scorer(s) {bad}; choose from {sorted(SCORERS)}")
    if a.images < 1 or a.batch < 1:
        p.error("--images and --batch must be >= 1")
    if str(a.device).startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False; use --device cpu")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    torch.manual_seed(a.seed)
    out_path = Path(a.out)
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="scorer_throughput_"))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    samples = synthetic_samples(a.images, a.image_size, a.seed)
    record = {"schema": SCHEMA, "note": RANDOM_NOTE, "size": a.size, "status": "running",
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "images": a.images, "batch": a.batch,
              "image_size": [a.image_size, a.image_size], "input_build_s": round(time.perf_counter() - t0, 3),
              "timing": "warm-up update() of one batch untimed; then update() per batch, cuda-synchronised",
              "env": env_info(a.device), "scorers": {}}
    print(f"[scorer_throughput] {a.size} size on {record['env']['device_name']} ({a.device}); {a.images} images "
          f"{a.image_size}^2, batch {a.batch}; weights in {work}", flush=True)
    write_json(out_path, record)
    files: dict = {}
    failed = []
    try:
        for key in a.scorer_list:
            print(f"[scorer_throughput] {key}: writing random weights + setup ...", flush=True)
            try:
                r = run_scorer(key, a.size, work, a.device, samples, a.batch, files, a.max_seconds)
                print(f"[scorer_throughput] {key}: {r['images_per_s']:.2f} images/s ({r['s_per_image'] * 1e3:.1f} ms/image"
                      f"{', peak %.2f GB' % r['peak_gpu_mem_gb_timed'] if 'peak_gpu_mem_gb_timed' in r else ''}); "
                      f"write {r['write_s']:.1f}s setup {r['setup_s']:.1f}s warm-up {r['warmup_s']:.1f}s", flush=True)
            except Exception as e:  # record and go on: the other scorers' numbers are still worth having
                failed.append(key)
                r = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
                print(f"[scorer_throughput] {key}: FAILED {r['error']}", flush=True)
            record["scorers"][key] = r
            record["elapsed_s"] = round(time.perf_counter() - t_all, 2)
            write_json(out_path, record)
            gc.collect()
            if str(a.device).startswith("cuda"):
                torch.cuda.empty_cache()
    finally:
        if not a.keep_files and not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    record["status"] = "failed" if failed else "done"
    record["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record["elapsed_s"] = round(time.perf_counter() - t_all, 2)
    write_json(out_path, record)
    print(f"[scorer_throughput] {record['status']} in {record['elapsed_s']:.0f}s -> {out_path}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
