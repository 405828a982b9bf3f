"""GenEval (djghosh13/geneval) compositional accuracy, with two detector backends.

* `backend="official"`: runs the upstream scorer (`evaluation/evaluate_images.py`, mmdet 2.x +
  Mask2Former Swin-S + open_clip ViT-L-14) as a subprocess in a Python environment the user names,
  over our images written in GenEval's layout (`<prompt_index:05d>/metadata.jsonl`,
  `<prompt_index:05d>/samples/<sample_index:04d>.png`), and parses its results jsonl. Numbers are the
  published protocol's. Scoring happens in `compute()` (one subprocess for all images).
* `backend="native"`: in-process. transformers `Mask2FormerForUniversalSegmentation` (weights from a
  local `save_pretrained` folder: the HF COCO-instance checkpoint, or a converted mmdet checkpoint) with
  mmdet-style instance post-processing at full resolution (softmax, top-100 over query x class, mask
  logits > 0 at the original size, score = class prob x mean mask prob, box = tight mask box), then the
  official rules (`geneval_rules`) and CLIP colour classification. Only the mmdet checkpoint reproduces
  published numbers (the 0.3/0.9 thresholds were tuned on its scores); `version_info()["detector"]` says
  which weights were used.

Colour classification (both backends' rule 5): the object is composited over flat #999 grey with its
mask, cropped to its box, CLIP-preprocessed (shorter side -> 224 bicubic, centre crop), and classified
zero-shot over 10 colours x 3 templates with open_clip `ViT-L-14-quickgelu` (OpenAI weights need
QuickGELU; plain `ViT-L-14` silently uses GELU in open_clip >= 3).

Colour-step precision: upstream runs the CLIP classifier through clip_benchmark's
`zero_shot_classifier` / `run_classification`, whose default `amp=True` puts both text and image
encoding under fp16 autocast on CUDA. `precision="auto"` (the default) does the same: fp16 autocast
on a CUDA device, fp32 on the CPU (autocast there is off upstream too). "amp" and "fp32" force one
or the other ("amp" on a CPU device still runs fp32). `version_info()` records the requested and the
effective precision; the detector always runs in fp32.

Prompt rewriting (Infinity's GPT-4o rewriter, the "†" numbers) affects generation only; the evaluator
always scores against the original GenEval metadata. `prompt_rewrite` is recorded so runs that used
rewritten prompts are never compared with runs that did not.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from varbench.evaluators.geneval import rules as R
from varbench.evaluators.common import to_pil_rgb
from varbench.evaluators.weights import WeightsNotFoundError, WrongWeightsError, check_sha256, load_state_dict, resolve_file, strict_load
from varbench.evaluators.base import EvalResult, Evaluator, Sample, bootstrap_std

IMAGENET_MEAN_255 = (123.675, 116.28, 103.53)
IMAGENET_STD_255 = (58.395, 57.12, 57.375)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PUBLISHED_DET = ("mmdet: https://download.openmmlab.com/mmdetection/v2.0/mask2former/ "
                 "(mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco; convert with "
                 "`python -m varbench.evaluators.geneval_convert_mmdet SRC.pth OUT_DIR`) or HF facebook/mask2former-swin-small-coco-instance (save_pretrained folder)")
PUBLISHED_CLIP = ("HF timm/vit_large_patch14_clip_224.openai (open_clip_pytorch_model.bin), "
                  "i.e. open_clip ViT-L-14 'openai' weights")


# ---------------------------------------------------------------------------------------------------
# native detector
class Mask2FormerDetector:
    """transformers Mask2Former + mmdet-style test pipeline and instance post-processing.

    `scale` = mmdet's keep-ratio Resize (long, short) limits, (1333, 800) in GenEval's config; tests
    shrink it. Resize is torch bilinear (mmcv uses cv2 bilinear: sub-0.5-grey-level differences).
    """

    def __init__(self, folder: Path, device: str = "cpu", scale=(1333, 800), max_per_image: int = 100,
                 size_divisor: int = 32):
        from transformers import Mask2FormerForUniversalSegmentation

        # fp32 always: transformers 5 keeps a folder saved in fp16 in fp16, which would silently change
        # detection scores near the 0.3/0.9 thresholds
        self.model = Mask2FormerForUniversalSegmentation.from_pretrained(str(folder)).float().eval().to(device)
        n = self.model.config.num_labels
        if n != 80:
            raise WrongWeightsError(f"GenEval detector in {str(folder)!r} has {n} classes; need the 80-class COCO "
                                    f"*instance* model ({PUBLISHED_DET}).")
        self.device, self.scale, self.max_per_image, self.size_divisor = device, tuple(scale), max_per_image, size_divisor

    @torch.no_grad()
    def __call__(self, image) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        """PIL RGB -> (per-class float32 arrays (N, 5) [x1 y1 x2 y2 score], per-class lists of HxW bool masks)."""
        arr = torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1)  # 3,H,W in 0..255 RGB
        h0, w0 = arr.shape[1:]
        long_, short_ = max(self.scale), min(self.scale)
        sf = min(long_ / max(h0, w0), short_ / min(h0, w0))
        h1, w1 = int(h0 * sf + 0.5), int(w0 * sf + 0.5)
        x = F.interpolate(arr[None], size=(h1, w1), mode="bilinear", align_corners=False)
        mean = torch.tensor(IMAGENET_MEAN_255).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD_255).view(1, 3, 1, 1)
        x = (x - mean) / std
        d = self.size_divisor
        ph, pw = (h1 + d - 1) // d * d, (w1 + d - 1) // d * d
        x = F.pad(x, (0, pw - w1, 0, ph - h1), value=0.0)
        out = self.model(pixel_values=x.to(self.device))
        cls_logits = out.class_queries_logits[0].float()  # Q, C+1
        masks = F.interpolate(out.masks_queries_logits.float(), size=(ph, pw), mode="bilinear", align_corners=False)
        masks = masks[:, :, :h1, :w1]
        masks = F.interpolate(masks, size=(h0, w0), mode="bilinear", align_corners=False)[0]  # Q, H0, W0
        return self.postprocess(cls_logits, masks)

    def postprocess(self, cls_logits: torch.Tensor, mask_logits: torch.Tensor):
        """mmdet MaskFormerFusionHead.instance_postprocess + mask2bbox, then grouped per class."""
        num_q, num_c1 = cls_logits.shape
        num_classes = num_c1 - 1
        scores = F.softmax(cls_logits, dim=-1)[:, :-1]
        labels = torch.arange(num_classes, device=scores.device).unsqueeze(0).repeat(num_q, 1).flatten(0, 1)
        k = min(self.max_per_image, scores.numel())
        top_scores, top_idx = scores.flatten(0, 1).topk(k, sorted=False)
        top_labels = labels[top_idx]
        m = mask_logits[top_idx // num_classes]
        binary = (m > 0).float()
        mask_scores = (m.sigmoid() * binary).flatten(1).sum(1) / (binary.flatten(1).sum(1) + 1e-6)
        det_scores = top_scores * mask_scores
        binary = binary.bool()
        boxes = torch.zeros((k, 4), dtype=torch.float32)
        x_any, y_any = binary.any(dim=1), binary.any(dim=2)
        for i in range(k):
            xs, ys = torch.where(x_any[i])[0], torch.where(y_any[i])[0]
            if len(xs) and len(ys):
                boxes[i] = torch.tensor([xs[0], ys[0], xs[-1] + 1, ys[-1] + 1], dtype=torch.float32)
        dets = torch.cat([boxes, det_scores.cpu()[:, None]], 1).numpy().astype(np.float32)
        lab = top_labels.cpu().numpy()
        bm = binary.cpu().numpy()
        per_class = [dets[lab == c] for c in range(num_classes)]
        per_masks = [list(bm[lab == c]) for c in range(num_classes)]
        return per_class, per_masks


class ColorClassifier:
    """GenEval's CLIP zero-shot colour classifier (clip_benchmark-style classifier weights)."""

    def __init__(self, model, tokenizer, image_size: int, device: str, amp: bool):
        self.model, self.tok, self.size, self.device, self.amp = model, tokenizer, image_size, device, amp
        self._weights: dict[str, torch.Tensor] = {}

    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.float16, enabled=self.amp and str(self.device).startswith("cuda"))

    @torch.no_grad()
    def classifier(self, classname: str) -> torch.Tensor:
        if classname not in self._weights:
            cols = []
            with self._autocast():
                for c in R.COLORS:
                    texts = [t.format(c=c, classname=classname) for t in R.COLOR_TEMPLATES]
                    emb = F.normalize(self.model.encode_text(self.tok(texts).to(self.device)), dim=-1).mean(dim=0)
                    cols.append(emb / emb.norm())
            self._weights[classname] = torch.stack(cols, dim=1)
        return self._weights[classname]

    def preprocess(self, img) -> torch.Tensor:
        import torchvision.transforms.functional as TF
        from torchvision.transforms import InterpolationMode

        img = TF.center_crop(TF.resize(img, self.size, InterpolationMode.BICUBIC), self.size).convert("RGB")
        return TF.normalize(TF.to_tensor(img), CLIP_MEAN, CLIP_STD)

    @torch.no_grad()
    def __call__(self, image, objs, classname: str) -> list[str]:
        from PIL import Image

        blank = Image.new("RGB", image.size, color="#999")
        crops = []
        for box, mask in objs:
            im = image
            if mask is not None:
                im = Image.composite(image, blank, Image.fromarray(np.asarray(mask, dtype=bool)))
            crops.append(self.preprocess(im.crop(tuple(box[:4]))))
        with self._autocast():
            feats = F.normalize(self.model.encode_image(torch.stack(crops).to(self.device)), dim=-1)
            logits = 100.0 * feats @ self.classifier(classname)
        return [R.COLORS[i] for i in logits.argmax(1).tolist()]


# ---------------------------------------------------------------------------------------------------
class GenEvalEvaluator(Evaluator):
    """GenEval accuracy: per-tag means and overall = mean of the six tag means.

    Args (common):
        backend: "native" (in-process, transformers Mask2Former) or "official" (upstream script subprocess).
        threshold / counting_threshold / max_objects / max_overlap / position_threshold: the official rule
            constants (0.3 / 0.9 / 16 / 1.0 / 0.1). Changing any makes numbers incomparable; all recorded.
        prompt_rewrite: recorded flag (off by default): whether generation used rewritten prompts.
        device: torch device (native backend).
    Native backend:
        detector_dir: `save_pretrained` folder of a Mask2Former COCO-instance model (relative to weights_dir).
        detector_name: label recorded in version_info (e.g. "mmdet-converted" or "hf-coco-instance").
        clip_weights: open_clip-format state dict for the colour CLIP (relative to weights_dir).
        clip_model: open_clip architecture ("ViT-L-14-quickgelu"); clip_model_config: JSON for tiny tests.
        detector_scale: mmdet keep-ratio resize limits (1333, 800); smaller = faster, not comparable.
        precision: CLIP colour step: "auto" (default: upstream's fp16 autocast on CUDA, fp32 on CPU),
            "amp" (fp16 autocast whenever the device is CUDA) or "fp32".
    Official backend:
        official_python: python executable of an env with mmdet 2.x/mmcv-full/open_clip/clip_benchmark.
        official_repo: geneval checkout (runs `<repo>/evaluation/evaluate_images.py`).
        official_model_path: folder with `mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth`.
        official_model_config: optional mmdet config path (default: the one inside mmdet).
        image_dir: where to write the GenEval-layout images (default: a temp dir, removed on reset()).
        official_timeout_s: subprocess time limit.
    """

    name = "geneval"

    def __init__(self, backend: str = "native", weights_dir: Optional[str] = None,
                 detector_dir: str = "mask2former_swin-s_coco_instance", detector_name: str = "unspecified",
                 clip_weights: str = "open_clip_vit_l14_openai.bin", clip_model: str = "ViT-L-14-quickgelu",
                 clip_model_config: Optional[str] = None, detector_scale: Sequence[int] = (1333, 800),
                 threshold: float = 0.3, counting_threshold: float = 0.9, max_objects: int = 16,
                 max_overlap: float = 1.0, position_threshold: float = 0.1, prompt_rewrite: bool = False,
                 precision: str = "auto", device: str = "cpu",
                 official_python: Optional[str] = None, official_repo: Optional[str] = None,
                 official_model_path: Optional[str] = None, official_model_config: Optional[str] = None,
                 image_dir: Optional[str] = None, official_timeout_s: float = 6 * 3600):
        if backend not in ("native", "official"):
            raise ValueError(f"geneval: backend must be 'native' or 'official', got {backend!r}")
        if precision not in ("auto", "amp", "fp32"):
            raise ValueError(f"geneval: precision must be 'auto' (upstream: fp16 autocast on CUDA, fp32 on CPU), 'amp' "
                             f"or 'fp32', got {precision!r}")
        self.backend, self.weights_dir = backend, weights_dir
        self.detector_dir, self.detector_name = detector_dir, detector_name
        self.clip_weights, self.clip_model, self.clip_model_config = clip_weights, clip_model, clip_model_config
        self.detector_scale = tuple(int(v) for v in detector_scale)
        self.rules = dict(threshold=float(threshold), counting_threshold=float(counting_threshold),
                          max_objects=int(max_objects), max_overlap=float(max_overlap))
        self.position_threshold = float(position_threshold)
        self.prompt_rewrite, self.precision, self.device = bool(prompt_rewrite), precision, device
        self.official_python, self.official_repo = official_python, official_repo
        self.official_model_path, self.official_model_config = official_model_path, official_model_config
        self.image_dir, self.official_timeout_s = image_dir, float(official_timeout_s)
        self.higher_is_better = {"overall": True, "correct_images": True, "correct_prompts": True,
                                 **{t: True for t in R.TAGS}}
        self._det = self._clf = None
        self._info: dict[str, Any] = {}
        self._rows: list[dict] = []
        self._pending: list[tuple[int, int, str]] = []  # official backend: written, not yet scored
        self._tmp: Optional[str] = None

    # -- setup -----------------------------------------------------------------------------------
    @property
    def clip_precision(self) -> str:
        """The colour step's effective precision on the current device: "amp" (fp16 autocast) or "fp32"."""
        cuda = str(self.device).startswith("cuda")
        return "amp" if cuda and self.precision in ("auto", "amp") else "fp32"

    def _under(self, p: Optional[str]) -> Optional[Path]:
        if p is None:
            return None
        p = Path(os.path.expanduser(str(p)))
        return p if p.is_absolute() or not self.weights_dir else Path(self.weights_dir) / p

    def setup(self, device: Optional[str] = None) -> None:
        if device is not None:
            self.device = device
        if self.backend == "official":
            self._setup_official()
        elif self._det is None:
            self._setup_native()

    def preflight(self, metadata) -> None:
        for i, m in enumerate(metadata):
            if "tag" not in m or "include" not in m:
                raise ValueError(f"prompt {i} has no GenEval metadata ('tag'/'include'): geneval scores the GenEval "
                                 "prompts (benchmark=geneval); drop it from `evaluator` for this benchmark")
        if self.backend == "official":
            self._official_files()
        else:
            self._native_files()

    def _official_files(self) -> tuple[Path, Path]:
        """(evaluate_images.py, detector checkpoint) of the official backend, each checked to exist."""
        py = self.official_python
        if not py or not (Path(py).exists() or shutil.which(py)):
            raise WeightsNotFoundError(f"geneval official backend: python executable {py!r} not found. Set "
                                       f"official_python to the interpreter of an env with mmdet 2.x, mmcv-full, "
                                       f"open_clip, clip_benchmark (see djghosh13/geneval README).")
        script = Path(self.official_repo or "") / "evaluation" / "evaluate_images.py"
        if not script.exists():
            raise WeightsNotFoundError(f"geneval official backend: {str(script)!r} not found; set official_repo to a "
                                       f"checkout of https://github.com/djghosh13/geneval.")
        ckpt = resolve_file(None, str(self._under(self.official_model_path) or "."),
                            "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth", what="GenEval mmdet detector",
                            published=PUBLISHED_DET)
        return script, ckpt

    def _setup_official(self) -> None:
        script, ckpt = self._official_files()
        self._info = {"detector": "official mmdet mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco",
                      "detector_weights": str(ckpt), "detector_sha256": check_sha256(ckpt, None, what="GenEval detector"),
                      "official_script": str(script)}

    def _native_files(self) -> tuple[Path, Path, list[Path], Path]:
        """(detector folder, its config.json, its weight files, the colour CLIP's weights), checked to exist."""
        det_dir = self._under(self.detector_dir)
        cfg = resolve_file(str(det_dir / "config.json"), None, "config.json", what="GenEval Mask2Former folder",
                           published=PUBLISHED_DET)
        wfiles = sorted(det_dir.glob("*.safetensors")) + sorted(det_dir.glob("*.bin"))
        if not wfiles and cfg.exists():   # (a preflight notes a missing folder once, as its config.json)
            raise WeightsNotFoundError(f"GenEval Mask2Former folder {str(det_dir)!r} has config.json but no weights "
                                       f"(*.safetensors/*.bin). Published at {PUBLISHED_DET}.")
        clip_path = resolve_file(str(self._under(self.clip_weights)), None, Path(self.clip_weights).name,
                                 what="GenEval colour CLIP weights", published=PUBLISHED_CLIP)
        return det_dir, cfg, wfiles, clip_path

    def _setup_native(self) -> None:
        import open_clip

        det_dir, cfg, wfiles, clip_path = self._native_files()
        self._det = Mask2FormerDetector(det_dir, self.device, self.detector_scale)
        if self.clip_model_config:
            open_clip.add_model_config(self.clip_model_config)
        model = open_clip.create_model(self.clip_model, pretrained=None, device="cpu")
        strict_load(model, load_state_dict(clip_path, what="GenEval colour CLIP"), what="GenEval colour CLIP",
                    path=clip_path)
        size = model.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        self._clf = ColorClassifier(model.eval().to(self.device), open_clip.get_tokenizer(self.clip_model), int(size),
                                    self.device, self.clip_precision == "amp")
        self._info = {"detector": self.detector_name, "detector_dir": str(det_dir),
                      "detector_sha256": {f.name: check_sha256(f, None, what="detector") for f in wfiles},
                      "detector_config_sha256": check_sha256(cfg, None, what="detector config"),
                      "detector_scale": list(self.detector_scale), "clip_model": self.clip_model,
                      "clip_weights": str(clip_path), "clip_sha256": check_sha256(clip_path, None, what="CLIP")}
        conv = det_dir / "conversion.json"  # written by varbench.evaluators.geneval.convert_mmdet: provenance of mmdet weights
        if conv.is_file():
            from varbench.core.inputs import read_json

            rec = read_json(conv, "detector conversion record")
            self._info["detector_conversion"] = {k: rec.get(k) for k in
                                                 ("converter_version", "source_file", "source_sha256", "expected_source")}

    # -- scoring ---------------------------------------------------------------------------------
    @staticmethod
    def _check_meta(s: Sample) -> dict:
        m = s.metadata
        if "tag" not in m or "include" not in m:
            raise ValueError(f"geneval: Sample(prompt_index={s.prompt_index}) metadata lacks 'tag'/'include'; pass the "
                             f"prompt's line of evaluation_metadata.jsonl as Sample.metadata.")
        return m

    def score_image(self, image, metadata: dict) -> tuple[bool, str, dict]:
        """Native backend: detect, apply the official rules, return (correct, reason, kept boxes per class)."""
        from PIL import ImageOps

        image = to_pil_rgb(ImageOps.exif_transpose(image) if hasattr(image, "getexif") else image)
        per_class, masks = self._det(image)
        objects = R.select_detections(per_class, masks, R.COCO80_GENEVAL, metadata["tag"], **self.rules)
        correct, reason = R.evaluate(objects, metadata, lambda objs, cls: self._clf(image, objs, cls),
                                     self.position_threshold)
        details = {k: [np.asarray(b).tolist() for b, _ in v] for k, v in objects.items()}
        return correct, reason, details

    def update(self, samples: Sequence[Sample]) -> None:
        if self.backend == "official":
            return self._write_layout(samples)
        if self._det is None:
            raise RuntimeError("geneval: call setup() before update()")
        for s in samples:
            meta = self._check_meta(s)
            correct, reason, details = self.score_image(s.image, meta)
            self._rows.append({"prompt_index": s.prompt_index, "sample_index": s.sample_index, "tag": meta["tag"],
                               "correct": bool(correct), "reason": reason, "details": details})

    def _write_layout(self, samples: Sequence[Sample]) -> None:
        if self.image_dir is None and self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="geneval_")
        root = Path(self.image_dir or self._tmp)
        for s in samples:
            meta = self._check_meta(s)
            d = root / f"{s.prompt_index:05d}"
            (d / "samples").mkdir(parents=True, exist_ok=True)
            # upstream reads this file with json.load: exactly one JSON object
            (d / "metadata.jsonl").write_text(json.dumps(meta) + "\n")
            to_pil_rgb(s.image).save(d / "samples" / f"{s.sample_index:04d}.png")
            self._pending.append((s.prompt_index, s.sample_index, meta["tag"]))

    def _run_official(self) -> None:
        if not self._pending:
            return
        root = Path(self.image_dir or self._tmp)
        outfile = root / "official_results.jsonl"
        cmd = [self.official_python, str(Path(self.official_repo) / "evaluation" / "evaluate_images.py"), str(root),
               "--outfile", str(outfile), "--model-path", str(self._under(self.official_model_path) or "."),
               "--options", f"threshold={self.rules['threshold']}",
               f"counting_threshold={self.rules['counting_threshold']}", f"max_objects={self.rules['max_objects']}",
               f"max_overlap={self.rules['max_overlap']}", f"position_threshold={self.position_threshold}"]
        if self.official_model_config:
            cmd += ["--model-config", str(self.official_model_config)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.official_timeout_s)
        if proc.returncode != 0 or not outfile.exists():
            raise RuntimeError(f"geneval official scorer failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                               f"stderr tail:\n{proc.stderr[-3000:]}")
        self._rows.extend(parse_official_results(outfile, expected=self._pending))
        self._pending = []

    def compute(self) -> EvalResult:
        if self.backend == "official":
            self._run_official()
        rows = sorted(self._rows, key=lambda r: (r["prompt_index"], r["sample_index"]))
        metrics = R.summarize(rows)
        metrics["n_images"] = float(len(rows))
        unc = {}
        # bootstrap over prompts: a prompt's samples move together
        groups: dict[int, list[tuple[str, float]]] = {}
        for r in rows:
            groups.setdefault(r["prompt_index"], []).append((r["tag"], float(r["correct"])))
        glist = list(groups.values())

        if len(glist) > 1:
            unc["overall"] = bootstrap_std(glist, statistic=R.overall_of_groups, n_boot=500)
            for tag in {r["tag"] for r in rows}:
                tg = [[v for t, v in g if t == tag] for g in glist]
                tg = [g for g in tg if g]
                unc[tag] = bootstrap_std(tg, n_boot=500)
        return EvalResult(metrics=metrics, uncertainty=unc, per_sample=rows)

    def reset(self) -> None:
        self._rows, self._pending = [], []
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def version_info(self) -> dict[str, Any]:
        from varbench.core.filehash import sha256_file

        # files by name and sha256, never by path: identical scorers on two machines agree
        info = dict(self._info)
        for key in ("detector_weights", "clip_weights"):
            if info.get(key):
                info[key] = Path(info[key]).name
        info.pop("detector_dir", None)                    # its files' sha256 are in detector_sha256
        script = info.pop("official_script", None)
        if script:
            info["official_script_sha256"] = sha256_file(script) if Path(script).is_file() else None
        conv = info.get("detector_conversion")
        if isinstance(conv, dict) and conv.get("source_file"):
            info["detector_conversion"] = {**conv, "source_file": Path(str(conv["source_file"])).name}
        return {"scorer": "geneval", "backend": self.backend, "rules": {**self.rules, "position_threshold": self.position_threshold},
                "rules_source": "djghosh13/geneval@af4902f evaluate_images.py", "prompt_rewrite": self.prompt_rewrite,
                "color_templates": list(R.COLOR_TEMPLATES), **self._precision_info(), **info}

    def _precision_info(self) -> dict[str, Any]:
        if self.backend == "official":  # the upstream script decides: clip_benchmark amp=True
            return {"precision": "official", "clip_precision": "clip_benchmark amp=True (fp16 autocast on CUDA)"}
        eff = self.clip_precision
        return {"precision": eff, "precision_requested": self.precision,
                "clip_precision": "fp16 autocast (CUDA)" if eff == "amp" else "fp32", "detector_precision": "fp32"}


_PATH_RE = re.compile(r"(\d+)[/\\]samples[/\\](\d+)\.\w+$")


def parse_official_results(path: Path, expected: Optional[Sequence[tuple[int, int, str]]] = None) -> list[dict]:
    """Rows from upstream's results jsonl (`filename`, `tag`, `correct`, `reason`, ...)."""
    from varbench.core.inputs import read_jsonl    # strict: a malformed line names its line, column and byte

    rows = []
    for _, rec in read_jsonl(Path(path), "GenEval results file"):
        m = _PATH_RE.search(rec["filename"])
        if not m:
            raise ValueError(f"geneval: cannot parse prompt/sample index from {rec['filename']!r} in {str(path)!r}")
        rows.append({"prompt_index": int(m.group(1)), "sample_index": int(m.group(2)), "tag": rec["tag"],
                     "correct": bool(rec["correct"]), "reason": rec.get("reason", ""),
                     "details": json.loads(rec["details"]) if isinstance(rec.get("details"), str) else rec.get("details")})
    if expected is not None:
        got = {(r["prompt_index"], r["sample_index"]) for r in rows}
        missing = [(p, s) for p, s, _ in expected if (p, s) not in got]
        if missing:
            raise RuntimeError(f"geneval official scorer returned no result for {len(missing)} images, e.g. {missing[:3]}")
    return rows
