"""Prompt sets: the official benchmark prompt files, loaded and fingerprinted.

Usage::

    from varbench.harness.prompts import load_prompt_set
    ps = load_prompt_set({"name": "geneval", "loader": "geneval",
                          "path": "data/geneval/evaluation_metadata.jsonl",
                          "samples_per_prompt": 4, "limit_per_tag": 2})
    for item in ps:                       # PromptItem(index, prompt, metadata)
        item.index, item.prompt, item.metadata["tag"]
    ps.sha256                             # hash of the file(s) read (see "Hashes")
    ps.describe()                         # the record's `benchmark` block (minus seeds)

Loaders (``cfg.loader``):

=============  ==========================================  ==========================================
loader         ``cfg.path``                                items
=============  ==========================================  ==========================================
geneval        ``evaluation_metadata.jsonl`` (553 lines)   metadata = the whole JSON object of the line
                                                           (``tag``, ``include``, ``exclude``, ``prompt``)
hpsv2          folder with ``<style>.json`` files          4 x 800 prompts, styles concatenated in
                                                           ``cfg.styles`` order (default anime,
                                                           concept-art, paintings, photo); metadata
                                                           ``{"style", "style_index"}``
imagereward    ``benchmark-prompts.json`` (100 prompts)    metadata ``{"id"}``
dpgbench       folder of ``<id>.txt`` files (1,065)        metadata ``{"id"}`` (the file stem)
mjhq           MJHQ-30K's ``meta_data.json`` (30,000)      metadata ``{"id", "category"}``, in the file's order
smoke          (none: built into this module)              8 GenEval-style prompts with a ``tag``
toy            (none: generated, varbench.toy.world)       procedural GenEval-style scenes (lazy import)
=============  ==========================================  ==========================================

Indices are stable: ``PromptItem.index`` is the prompt's position in the *full* official set
(the line number for GenEval, the offset in the concatenation for HPSv2, the list position for
ImageReward, the natural-sort position for DPG-Bench), also when ``limit``/``limit_per_tag``
select a subset. So a quick run's images sit under the same ``<index:05d>`` folders as a full
run's, and the same seed rule gives the same images.

DPG-Bench note: its file stems are ids such as ``partiprompts94`` or ``COCOval2014000000212403``
(only 299 of them are bare integers), so the index is the position in a *natural* sort
(prefix, then the trailing integer numerically: ``0, 1, 2, ..., 10``; ``COCOval...``,
``countbench1``, ..., ``partiprompts1``, ``partiprompts2``, ...). The DPG scorer keys images by
``metadata["id"]``, which is the authoritative name.

Quick runs: ``limit`` keeps the first N prompts (after ``limit_per_tag``); ``limit_per_tag``
(GenEval only) keeps the first N prompts of each tag, so a 12-prompt run still covers all six
GenEval tasks. Both trade statistical power for time; records keep n_prompts and an items hash.

Hashes:

* single-file sets: ``sha256`` = sha256 of the file's bytes (compare with ``sha256sum``).
* multi-file sets (HPSv2 styles, the DPG folder): sha256 of the text made of one line
  ``"<file sha256>  <file name>\\n"`` per file, sorted by file name (code-point order). That is
  exactly ``sha256sum``'s output format, so ``cd prompts && LC_ALL=C sha256sum *.txt | sha256sum``
  reproduces the DPG value.
* ``items_sha256``: sha256 of the canonical JSON list of ``[index, prompt]`` of the *selected*
  items, so two runs can prove they saw the same prompts (lm-eval's task hash idea).

Missing files: with ``allow_download: true`` a single-file set is fetched once from its published
URL (urllib; ``file://`` works too) into ``cfg.path`` and must match the pinned sha256, otherwise
nothing is written and the error shows both hashes. Without it, one error names the file, the
path searched, the URL and the config key to set. An existing file whose hash differs from the
pinned one only warns (you may be running a modified set on purpose); the record carries the
actual hash and ``sha256_matches: false``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from varbench.core.errors import BadSettingError, FixableError, GarbledFileError, MalformedFileError
from varbench.core import inputs
from varbench.core.filehash import sha256_file
from varbench.core.registry import PROMPT_LOADERS_GROUP, LazyRegistry
from varbench.core.jsonio import atomic_write_bytes


class PromptSetError(FixableError, RuntimeError):
    """A prompt set that cannot be loaded. Its subclasses say why, each with its own first words:
    :class:`PromptFileMissingError` (absent, or a download that failed or did not match its pin),
    :class:`PromptFileError` (there, but malformed), :class:`PromptSettingError` (a ``benchmark.*``
    value out of range)."""


class PromptFileMissingError(PromptSetError, FileNotFoundError):
    """The prompt file or folder is not there (and was not, or could not be, downloaded)."""

    first_words = "missing"


class PromptFileError(PromptSetError, MalformedFileError):
    """The prompt file is there but is not what the loader reads: not UTF-8, not parseable, the wrong
    shape, a folder where a file belongs (the file and its line/column or byte offset named)."""


class PromptSettingError(PromptSetError, BadSettingError):
    """A ``benchmark.*`` setting out of range or unknown (``limit``, ``samples_per_prompt``, ``loader``)."""


def _strict(read, path: Path, what: str):
    """``read(path, what)`` (a :mod:`varbench.core.inputs` reader) with its fault as a :class:`PromptFileError`."""
    try:
        return read(path, what)
    except MalformedFileError as e:
        raise PromptFileError(e.path, e.problem, line=e.line, column=e.column, byte=e.byte, fix=e.fix) from None


@dataclasses.dataclass(frozen=True)
class PromptItem:
    """One prompt. ``index`` is stable across subsets (see module docstring). ``rewritten``: the text
    the model is given instead, when ``benchmark.rewrite`` names a rewrite file (scoring still reads
    ``prompt`` and ``metadata``)."""

    index: int
    prompt: str
    metadata: dict
    rewritten: str | None = None

    @property
    def generation_prompt(self) -> str:
        """The text the model generates from: the rewritten prompt when there is one."""
        return self.prompt if self.rewritten is None else self.rewritten


@dataclasses.dataclass
class PromptSet:
    """A loaded prompt set.

    ``sha256`` fingerprints the source file(s) as read (even if modified); ``expected_sha256`` is
    the pinned official hash (None for sets with no pin, e.g. smoke); ``files`` maps each file read
    to its sha256; ``full_size`` is the number of prompts before ``limit``/``limit_per_tag``.
    """

    name: str
    items: list[PromptItem]
    source_path: str | None
    sha256: str
    samples_per_prompt: int = 1
    loader: str = ""
    source_url: str | None = None
    expected_sha256: str | None = None
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    full_size: int = 0
    selection: dict = dataclasses.field(default_factory=dict)
    #: every prompt before ``limit``/``limit_per_tag`` (None: ``items`` is the whole set); the job
    #: batches an image with its neighbours in this list, so a subset's images equal the full set's
    all_items: list[PromptItem] | None = dataclasses.field(default=None, repr=False, compare=False)
    #: the rewrite file (``benchmark.rewrite``) by name and sha256; None: prompts used as written
    rewrite: dict | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[PromptItem]:
        return iter(self.items)

    @property
    def n_prompts(self) -> int:
        return len(self.items)

    @property
    def items_sha256(self) -> str:
        payload = json.dumps([[it.index, it.prompt] for it in self.items], ensure_ascii=False,
                             separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()

    @property
    def key_sha256(self) -> str:
        """What the store and record keys hash for the prompts: the prompt file(s)' ``sha256``, and with a
        rewrite file also its sha256 (so keys without one are unchanged)."""
        if not self.rewrite:
            return self.sha256
        return hashlib.sha256(f"{self.sha256}\nrewrite {self.rewrite['sha256']}".encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        """The record's ``benchmark`` block; the runner adds ``seeds``. ``rewrite`` and ``key_sha256``
        only when a rewrite file was used."""
        extra = {"rewrite": dict(self.rewrite), "key_sha256": self.key_sha256} if self.rewrite else {}
        return {**extra, 
            "name": self.name,
            "loader": self.loader,
            "source": self.source_url,
            "source_path": self.source_path,
            "sha256": self.sha256,
            "sha256_expected": self.expected_sha256,
            "sha256_matches": None if self.expected_sha256 is None else self.sha256 == self.expected_sha256,
            "files": dict(self.files),
            "items_sha256": self.items_sha256,
            "n_prompts": self.n_prompts,
            "full_size": self.full_size,
            "samples_per_prompt": self.samples_per_prompt,
            "selection": dict(self.selection),
        }


# --------------------------------------------------------------------------------------------
# Pinned official files (facts from shared/data/README.md; sha256 of the bytes as published).

@dataclasses.dataclass(frozen=True)
class PinnedFile:
    name: str
    sha256: str
    urls: tuple[str, ...]  # tried in order when downloading; the first is the one quoted in errors


_GENEVAL_COMMIT = "af4902f24d3ca90ebbb446dd9891a59e0f82725f"
_IMAGEREWARD_COMMIT = "c1392c6dd0fd6ecd6d416c96959ab744a6d0a8fb"
_HPS_APPLE_COMMIT = "12c59520669b195e919540b940a510cef6f46ae7"
_DPG_COMMIT = "3c228f1dc6c4d3cad0a47493816151a419f14db3"

GENEVAL_FILE = PinnedFile(
    "evaluation_metadata.jsonl",
    "5c48e0813e812e3c373fa5c8ed07a8f0a483be30272b4427b0559c8048e67c13",
    (f"https://raw.githubusercontent.com/djghosh13/geneval/{_GENEVAL_COMMIT}/prompts/evaluation_metadata.jsonl",),
)
IMAGEREWARD_FILE = PinnedFile(
    "benchmark-prompts.json",
    "34682e824ebb3ad8e2531b3cde1b362dc72e1e29946ff6fab77bb49e9edb4b21",
    (f"https://raw.githubusercontent.com/THUDM/ImageReward/{_IMAGEREWARD_COMMIT}/benchmark/benchmark-prompts.json",),
)
HPS_STYLES = ("anime", "concept-art", "paintings", "photo")
_HPS_SHA = {
    "anime": "6b38a479cc6f899866e9b7a8bf91f096b4afc6883b95275a61891327182b14ae",
    "concept-art": "530d057deafcb82c581e9d1be2ffcb98828fe99f0b54257414d2ab8a5cf2b83e",
    "paintings": "6570d39467e08b24b64e5b8a4177b0f61c525631121dc5a91fe2ab956eab4d5f",
    "photo": "92a3c9a0f743f66eb87bd112cdda830d6bdb4c073c86021d53b74001fcb18052",
}
# Canonical source: the HF dataset zhwang/HPDv2; the GitHub copy (apple/ml-diffusion-alignment-
# gflownet) is the byte-verified one the pins were taken from, so it is tried second.
HPS_FILES = {
    s: PinnedFile(
        f"{s}.json", _HPS_SHA[s],
        (f"https://huggingface.co/datasets/zhwang/HPDv2/resolve/main/benchmark/{s}.json",
         f"https://raw.githubusercontent.com/apple/ml-diffusion-alignment-gflownet/{_HPS_APPLE_COMMIT}"
         f"/alignment/assets/HPDv2/benchmark_{s}.json"),
    )
    for s in HPS_STYLES
}
#: Folder digest (see "Hashes") of the 1,065 DPG-Bench prompt files, computed from the files
#: whose per-file hashes are listed in shared/data/dpgbench/SHA256SUMS.
DPG_FOLDER_SHA256 = "317085a5cddf9620595bb38cba7b9fa25ecfb081846bc91b840c98366d46f56e"
DPG_URL = f"https://github.com/TencentQQGYLab/ELLA/tree/{_DPG_COMMIT}/dpg_bench/prompts"


# --------------------------------------------------------------------------------------------
# Helpers

def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        val = cfg.get(key, default)
    else:
        val = getattr(cfg, key, default)
    return default if val is None else val


def digest_listing(entries: Mapping[str, str]) -> str:
    """sha256 over ``"<sha256>  <name>\\n"`` lines sorted by name (``sha256sum`` format)."""
    text = "".join(f"{entries[name]}  {name}\n" for name in sorted(entries))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def download_file(pin: PinnedFile, dest: Path, urls: Sequence[str] | None = None) -> Path:
    """Fetch ``pin`` into ``dest`` (atomically) from the first URL whose bytes match the pin.

    Raises PromptSetError listing every URL tried and why it failed; on a hash mismatch nothing
    is written, so a corrupted or changed upstream file never lands where the loader reads.
    """
    failures = []
    for url in urls or pin.urls:
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - URLs are pinned
                data = resp.read()
        except (urllib.error.URLError, OSError, ValueError) as e:
            failures.append(f"{url}: {e}")
            continue
        got = hashlib.sha256(data).hexdigest()
        if got != pin.sha256:
            failures.append(f"{url}: sha256 mismatch (expected {pin.sha256}, got {got}; {len(data)} bytes)")
            continue
        atomic_write_bytes(dest, data)
        return dest
    raise PromptFileMissingError(
        f"could not download {pin.name} into {dest}; nothing was written.\n  "
        + "\n  ".join(failures)
        + "\n  fix: download it by hand and set benchmark.path=..., or check the pinned URL."
    )


def _missing_error(what: str, path: Path, url: str, path_hint: str, can_download: bool) -> PromptSetError:
    fix = f"set benchmark.path={path_hint}"
    if can_download:
        fix += " (where the file is), or benchmark.allow_download=true to fetch it (sha256 verified)"
    return PromptFileMissingError(
        f"{what} not found.\n  searched: {path}\n  published at: {url}\n  fix: {fix}."
    )


def _resolve_file(pin: PinnedFile, path: Path, allow_download: bool, what: str,
                  urls: Sequence[str] | None = None) -> tuple[str, str | None]:
    """Make sure ``path`` exists (downloading if allowed); return (actual sha256, expected)."""
    if path.exists() and not path.is_file():       # the kind of path is wrong: not "missing"
        raise PromptFileError(path, f"is {'a folder' if path.is_dir() else 'not a regular file'}; the {what} "
                                    "must be a file", fix=f"set benchmark.path=/path/to/{pin.name}")
    if not path.is_file():
        if not allow_download:
            raise _missing_error(what, path, (urls or pin.urls)[0], f"/path/to/{pin.name}", True)
        download_file(pin, path, urls)
    actual = sha256_file(path)
    if actual != pin.sha256:
        warnings.warn(
            f"{path}: sha256 {actual} differs from the official {pin.name} ({pin.sha256}); "
            "using it as given and recording the actual hash.", stacklevel=3,
        )
    return actual, pin.sha256


def _read_json(path: Path, what: str = "prompt file") -> Any:
    return _strict(inputs.read_json, path, what)


# --------------------------------------------------------------------------------------------
# Loaders: each returns (items, PromptSet kwargs)

def _load_geneval(cfg: Any) -> tuple[list[PromptItem], dict]:
    path = Path(_get(cfg, "path", GENEVAL_FILE.name)).expanduser()
    sha, expected = _resolve_file(GENEVAL_FILE, path, bool(_get(cfg, "allow_download", False)),
                                  "GenEval prompt file evaluation_metadata.jsonl", _urls(cfg))
    items = []
    for i, meta in _strict(lambda p, w: list(inputs.read_jsonl(p, w)), path, "GenEval prompt file"):
        if not isinstance(meta, dict) or not isinstance(meta.get("prompt"), str):
            raise PromptFileError(path, f"has no \"prompt\" text (a GenEval line is a JSON object with "
                                        f"\"prompt\", \"tag\", \"include\"); got {json.dumps(meta)[:80]}", line=i + 1)
        items.append(PromptItem(i, meta["prompt"], meta))
    if not items:
        raise PromptFileError(path, "holds no prompts (an empty file)", fix="benchmark.path must be GenEval's "
                                                                  "evaluation_metadata.jsonl")
    return items, dict(source_path=str(path), sha256=sha, expected_sha256=expected,
                       source_url=GENEVAL_FILE.urls[0], files={path.name: sha})


def _load_imagereward(cfg: Any) -> tuple[list[PromptItem], dict]:
    path = Path(_get(cfg, "path", IMAGEREWARD_FILE.name)).expanduser()
    sha, expected = _resolve_file(IMAGEREWARD_FILE, path, bool(_get(cfg, "allow_download", False)),
                                  "ImageReward prompt file benchmark-prompts.json", _urls(cfg))
    data = _read_json(path, "ImageReward prompt file")
    if not isinstance(data, list) or not data:
        raise PromptFileError(path, f"must be a non-empty JSON list of {{\"id\", \"prompt\"}} objects, "
                                    f"got {type(data).__name__}{' (empty)' if data == [] else ''}")
    for i, row in enumerate(data):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or "id" not in row:
            raise PromptFileError(path, f"entry {i} (0-based) needs \"id\" and \"prompt\" text, got {str(row)[:80]!r}")
    items = [PromptItem(i, row["prompt"], {"id": row["id"]}) for i, row in enumerate(data)]
    return items, dict(source_path=str(path), sha256=sha, expected_sha256=expected,
                       source_url=IMAGEREWARD_FILE.urls[0], files={path.name: sha})


def _load_hpsv2(cfg: Any) -> tuple[list[PromptItem], dict]:
    folder = Path(_get(cfg, "path", "hpsv2")).expanduser()
    styles = list(_get(cfg, "styles", HPS_STYLES))
    unknown = [s for s in styles if s not in HPS_FILES]
    if unknown:
        raise PromptSettingError(f"unknown HPSv2 style(s) {unknown}; choose from {list(HPS_STYLES)} "
                             "(benchmark.styles=[...])")
    allow = bool(_get(cfg, "allow_download", False))
    files, items = {}, []
    # Indices are offsets in the official 4-style concatenation, so a style subset keeps them.
    offsets, off = {}, 0
    for s in HPS_STYLES:
        offsets[s] = off
        off += 800  # every official style file has 800 prompts (README); checked below
    for s in styles:
        pin = HPS_FILES[s]
        path = folder / pin.name
        sha, _ = _resolve_file(pin, path, allow, f"HPSv2 benchmark prompts {pin.name} (style {s})")
        files[pin.name] = sha
        prompts = _read_json(path, f"HPSv2 prompt file ({s})")
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise PromptFileError(path, "must be a JSON list of prompt strings")
        if not prompts:
            raise PromptFileError(path, "holds no prompts (an empty list); the official files have 800")
        if len(prompts) > 800:
            raise PromptFileError(path, f"has {len(prompts)} prompts; the official files have 800")
        items.extend(PromptItem(offsets[s] + j, p, {"style": s, "style_index": j})
                     for j, p in enumerate(prompts))
    expected = digest_listing({HPS_FILES[s].name: HPS_FILES[s].sha256 for s in styles})
    return items, dict(source_path=str(folder), sha256=digest_listing(files), expected_sha256=expected,
                       source_url="https://huggingface.co/datasets/zhwang/HPDv2 (benchmark/)", files=files)


_NATURAL = re.compile(r"^(.*?)(\d*)$")


def _natural_key(stem: str) -> tuple[str, int, str]:
    prefix, digits = _NATURAL.match(stem).groups()
    return (prefix, int(digits) if digits else -1, stem)


def _load_dpgbench(cfg: Any) -> tuple[list[PromptItem], dict]:
    folder = Path(_get(cfg, "path", "dpgbench/prompts")).expanduser()
    if folder.exists() and not folder.is_dir():
        raise PromptFileError(folder, "is a file; benchmark.path must be the DPG-Bench prompt folder of <id>.txt files",
                              fix="set benchmark.path=/path/to/dpg_bench/prompts")
    if not folder.is_dir():
        raise PromptFileMissingError(
            f"DPG-Bench prompt folder (1,065 <id>.txt files) not found.\n  searched: {folder}\n"
            f"  published at: {DPG_URL}\n  fix: set benchmark.path=/path/to/dpg_bench/prompts "
            "(automatic download is not offered for a 1,065-file folder: copy dpg_bench/prompts "
            "from a clone of TencentQQGYLab/ELLA at that commit)."
        )
    paths = sorted(folder.glob("*.txt"), key=lambda p: _natural_key(p.stem))
    if not paths:
        raise PromptFileError(folder, "holds no .txt prompt files", fix="benchmark.path must be dpg_bench/prompts")
    files = {p.name: sha256_file(p) for p in paths}
    sha = digest_listing(files)
    if sha != DPG_FOLDER_SHA256:
        warnings.warn(f"{folder}: folder digest {sha} differs from the official DPG-Bench prompts "
                      f"({DPG_FOLDER_SHA256}); using it as given and recording the actual hash.",
                      stacklevel=3)
    # Prompts are stored as given, minus surrounding whitespace (some files end with a newline);
    # decoded strictly (varbench.core.inputs): a byte that is not UTF-8 names the file and its offset.
    items = [PromptItem(i, _strict(inputs.read_text, p, "DPG-Bench prompt file").strip(), {"id": p.stem})
             for i, p in enumerate(paths)]
    return items, dict(source_path=str(folder), sha256=sha, expected_sha256=DPG_FOLDER_SHA256,
                       source_url=DPG_URL, files=files)


MJHQ_URL = "https://huggingface.co/datasets/playgroundai/MJHQ-30K (meta_data.json)"


def _load_mjhq(cfg: Any) -> tuple[list[PromptItem], dict]:
    """MJHQ-30K's prompts: ``meta_data.json`` maps each image id to ``{"category", "prompt"}``. No hash
    is pinned (none is published with the file); the record carries the file's sha256."""
    path = Path(_get(cfg, "path", "mjhq30k/meta_data.json")).expanduser()
    if path.is_dir():
        path = path / "meta_data.json"
    if not path.is_file():
        raise _missing_error("MJHQ-30K prompt file meta_data.json", path, MJHQ_URL, "/path/to/mjhq30k/meta_data.json", False)
    data = _read_json(path)
    if not isinstance(data, dict) or not data:
        raise PromptSetError(f"{path} must be a JSON object mapping image ids to {{\"category\", \"prompt\"}}")
    items = []
    for i, (key, row) in enumerate(data.items()):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise PromptSetError(f"{path}: entry {key!r} needs a \"prompt\" text, got {str(row)[:80]!r}")
        items.append(PromptItem(i, row["prompt"], {"id": str(key), "category": row.get("category")}))
    sha = sha256_file(path)
    return items, dict(source_path=str(path), sha256=sha, expected_sha256=None, source_url=MJHQ_URL,
                       files={path.name: sha})


def read_rewrite_file(path: str | Path) -> dict[str, str]:
    """A prompt -> rewritten prompt map (``benchmark.rewrite``): one JSON object whose keys are the
    benchmark's prompts as written and whose values are the texts to generate from, the format of
    Infinity's ``evaluation/gen_eval/prompt_rewrite_cache.json``. Read by the one strict reader
    (`varbench.core.inputs`): a file that is not UTF-8, does not parse, repeats a prompt, is not such
    an object or maps a prompt to something other than non-empty text raises
    :class:`MalformedFileError` naming the file and the line, column and byte."""
    path = Path(path).expanduser()
    if not path.exists():
        raise PromptSetError(f"prompt rewrite file not found.\n  searched: {path}\n  published at: your own rewriter's "
                             f"output (Infinity's format: evaluation/gen_eval/prompt_rewrite_cache.json)\n  fix: set "
                             f"benchmark.rewrite=/path/to/rewrites.json, or null to use the prompts as written.")
    what = 'prompt rewrite file (benchmark.rewrite: {"<prompt>": "<rewritten prompt>"})'
    data = inputs.read_json(path, what)
    text = inputs.read_text(path, what)
    if not isinstance(data, dict):
        raise inputs.malformed(path, text, 0, f"is a JSON {type(data).__name__}, not a JSON object; the {what} must be "
                                              "one JSON object")
    for k, v in data.items():
        if not isinstance(v, str) or not v.strip():
            at = max(text.find(json.dumps(k, ensure_ascii=False)), text.find(json.dumps(k)), 0)
            raise inputs.malformed(path, text, at, f"the rewrite of {k[:60]!r} is {str(v)[:40]!r}, not a non-empty text")
    return data


def apply_rewrite(items: list[PromptItem], path: str | Path) -> tuple[list[PromptItem], dict]:
    """``items`` with ``rewritten`` set from the rewrite file, and the record's ``rewrite`` block. Every
    prompt of the set must have a rewrite (the job batches an image with its neighbours in the full
    set, so a subset needs them too); otherwise ConfigError names how many lack one and which."""
    from varbench.core.errors import ConfigError

    mapping = read_rewrite_file(path)
    lacking = [it for it in items if it.prompt not in mapping]
    if lacking:
        shown = "; ".join(f"{it.index}: {it.prompt[:50]!r}" for it in lacking[:3])
        raise ConfigError(f"benchmark.rewrite: {path} has no rewrite for {len(lacking)} of the {len(items)} prompts "
                          f"(e.g. {shown}); it must map every prompt of the benchmark, as written, to its rewrite")
    p = Path(path).expanduser()
    block = {"file": p.name, "sha256": sha256_file(p), "n_rewrites": len(mapping)}
    return [dataclasses.replace(it, rewritten=mapping[it.prompt]) for it in items], block


#: Built-in smoke set: GenEval-format metadata (class names are COCO classes GenEval knows), one
#: or two prompts per GenEval tag, short enough for tiny random models.
SMOKE_METADATA: tuple[dict, ...] = (
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
    {"tag": "single_object", "include": [{"class": "bicycle", "count": 1}], "prompt": "a photo of a bicycle"},
    {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "umbrella", "count": 1}],
     "prompt": "a photo of a dog and an umbrella"},
    {"tag": "counting", "include": [{"class": "apple", "count": 3}], "exclude": [{"class": "apple", "count": 4}],
     "prompt": "a photo of three apples"},
    {"tag": "counting", "include": [{"class": "bird", "count": 2}], "exclude": [{"class": "bird", "count": 3}],
     "prompt": "a photo of two birds"},
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a photo of a red car"},
    {"tag": "position", "include": [{"class": "potted plant", "count": 1},
                                    {"class": "bench", "count": 1, "position": ["right of", 0]}],
     "prompt": "a photo of a bench right of a potted plant"},
    {"tag": "color_attr", "include": [{"class": "umbrella", "count": 1, "color": "blue"},
                                      {"class": "bus", "count": 1, "color": "yellow"}],
     "prompt": "a photo of a blue umbrella and a yellow bus"},
)


def _load_smoke(cfg: Any) -> tuple[list[PromptItem], dict]:
    items = [PromptItem(i, m["prompt"], json.loads(json.dumps(m))) for i, m in enumerate(SMOKE_METADATA)]
    payload = "".join(json.dumps(m, sort_keys=True) + "\n" for m in SMOKE_METADATA).encode()
    return items, dict(source_path=None, sha256=hashlib.sha256(payload).hexdigest(), expected_sha256=None,
                       source_url="builtin:varbench.harness.prompts.SMOKE_METADATA", files={})


def _urls(cfg: Any) -> tuple[str, ...] | None:
    """Optional ``benchmark.url`` override (a mirror); still verified against the pinned hash."""
    url = _get(cfg, "url", None)
    return (str(url),) if url else None


#: Built-in loaders return (items, PromptSet keyword arguments). Registered loaders (below)
#: return a PromptSet; both get ``limit``/``limit_per_tag``/``samples_per_prompt`` applied here.
#: A `varbench.core.registry.LazyRegistry`: ``"module:function"`` entries are imported on first use;
#: installed packages add loaders through the `varbench.prompt_loaders` entry-point group.
def _a_loader_function(obj) -> str | None:
    """None for a function (what a loader slot takes: ``fn(cfg) -> PromptSet``); a class or module is not one."""
    return None if callable(obj) and not isinstance(obj, type) else "a function fn(benchmark_cfg) -> PromptSet"


LOADERS = LazyRegistry("benchmark loader", group=PROMPT_LOADERS_GROUP, expects=_a_loader_function, entries={
    "geneval": _load_geneval,
    "hpsv2": _load_hpsv2,
    "imagereward": _load_imagereward,
    "dpgbench": _load_dpgbench,
    "mjhq": _load_mjhq,
    "smoke": _load_smoke,
    # Lazy entries: imported on first use only.
    "toy": "varbench.harness.prompts:load_toy_prompts",
})


def register_loader(name: str, fn: Callable[[Any], PromptSet] | str) -> None:
    """Add a loader: ``fn(cfg) -> PromptSet``, or a lazy ``"module.path:function"`` string that
    is imported on first use (keeps ``import varbench.harness.prompts`` light).

    Example: ``register_loader("mine", "my_pkg.prompts:load_my_prompts")``.
    """
    LOADERS.register(name, fn)


def _select(items: list[PromptItem], limit: int | None, limit_per_tag: int | None, loader: str) -> list[PromptItem]:
    if limit_per_tag is not None:
        if not any("tag" in it.metadata for it in items):
            raise PromptSettingError(f"benchmark.limit_per_tag needs prompts with a 'tag' (GenEval, smoke); "
                                 f"loader {loader!r} has none. Use benchmark.limit instead.")
        seen: dict[str, int] = {}
        kept = []
        for it in items:
            tag = it.metadata.get("tag")
            if seen.get(tag, 0) < limit_per_tag:
                seen[tag] = seen.get(tag, 0) + 1
                kept.append(it)
        items = kept
    if limit is not None:
        items = items[:limit]
    return items


def load_prompt_set(cfg: Any) -> PromptSet:
    """Load the prompt set a benchmark config describes (dict or OmegaConf node).

    Keys: ``loader`` (required; one of LOADERS, see :func:`register_loader`), ``name`` (defaults
    to the loader), ``path``, ``styles`` (hpsv2), ``samples_per_prompt`` (default 1, or the
    registered loader's), ``allow_download`` (default false),
    ``url`` (optional mirror for the download of a single-file set; still hash-checked),
    ``limit``, ``limit_per_tag``.
    """
    loader = _get(cfg, "loader", None)
    if loader not in LOADERS:
        close = LOADERS.close_matches(loader, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise PromptSettingError(f"unknown benchmark.loader {loader!r}.{hint} Available: {sorted(LOADERS)}")
    if _get(cfg, "rewriter", None):
        raise PromptSettingError("benchmark.rewriter (a rewriter to run) is not supported: give its output instead, "
                                 "benchmark.rewrite=<file> ({\"<prompt>\": \"<rewritten prompt>\"}, Infinity's "
                                 "prompt_rewrite_cache.json format), and set benchmark.rewriter to null.")
    got = LOADERS.load(loader)(cfg)
    if isinstance(got, PromptSet):  # a registered loader: keep its fingerprint, apply selection here
        kw = {k: getattr(got, k) for k in ("source_path", "sha256", "source_url", "expected_sha256", "files")}
        items = list(got.items)
        full_size = got.full_size or len(items)
        default_spp = got.samples_per_prompt
    else:
        items, kw = got
        full_size = len(items)
        default_spp = 1
    if not items:
        raise PromptSetError(f"benchmark.loader {loader!r} gave no prompts (source: {kw.get('source_path') or loader})")
    rewrite = None
    if _get(cfg, "rewrite", None):   # generation reads the rewrites; scoring the prompts and metadata as written
        items, rewrite = apply_rewrite(items, str(_get(cfg, "rewrite")))
    limit, per_tag = _get(cfg, "limit", None), _get(cfg, "limit_per_tag", None)
    for key, val in (("limit", limit), ("limit_per_tag", per_tag)):
        if val is not None and (not isinstance(val, int) or isinstance(val, bool) or val < 1):
            raise PromptSettingError(f"benchmark.{key} must be a positive integer or null, got {val!r}")
    all_items = items
    items = _select(items, limit, per_tag, loader)
    spp = int(_get(cfg, "samples_per_prompt", default_spp))
    if spp < 1:
        raise PromptSettingError(f"benchmark.samples_per_prompt must be >= 1, got {spp}")
    return PromptSet(name=str(_get(cfg, "name", loader)), items=items, samples_per_prompt=spp, loader=loader,
                     full_size=full_size, selection={"limit": limit, "limit_per_tag": per_tag},
                     all_items=all_items, rewrite=rewrite, **kw)


def load_toy_prompts(cfg) -> PromptSet:
    """Prompt loader for `benchmark.loader: toy` (see `register_loader`): the toy world's prompts
    (`varbench.toy.world.prompt_set`).

    Reads `n_prompts` (default 120), `seed` (default 0) and `samples_per_prompt` (default 4) from
    the benchmark config (dict or OmegaConf node). The set is generated, not read, so its
    fingerprint is the sha256 of the generated metadata lines plus the world version.
    """
    from varbench.toy.world import WORLD_VERSION, prompt_set

    get = (lambda k, d: cfg.get(k, d)) if hasattr(cfg, "get") else (lambda k, d: getattr(cfg, k, d))
    n, seed, spp = get("n_prompts", 120), get("seed", 0), get("samples_per_prompt", 4)
    for key, val, lo in (("n_prompts", n, 1), ("seed", seed, 0), ("samples_per_prompt", spp, 1)):
        if not isinstance(val, int) or isinstance(val, bool) or val < lo:
            raise PromptSettingError(f"benchmark.{key} must be an integer >= {lo}, got {val!r} (varbench/conf/benchmark/toy.yaml)")
    prompts = prompt_set(n, seed)
    payload = WORLD_VERSION + "\n" + "".join(json.dumps(p["metadata"], sort_keys=True) + "\n" for p in prompts)
    return PromptSet(
        name=str(get("name", "toy")),
        items=[PromptItem(i, p["prompt"], dict(p["metadata"], scene_seed=p["scene_seed"])) for i, p in enumerate(prompts)],
        source_path=None,
        sha256=hashlib.sha256(payload.encode()).hexdigest(),
        samples_per_prompt=spp,
        loader="toy",
        source_url=f"builtin:varbench.toy.world.prompt_set(n={n}, seed={seed}) {WORLD_VERSION}",
        full_size=n,
    )
