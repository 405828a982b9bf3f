"""A procedural world of flat shapes with GenEval-style captions.

Why it exists: real GenEval needs a 68 M-parameter detector, CLIP and a trained 2B text-to-image
model; none of that is available (or affordable) on a CPU. This world is small enough that a tiny
model can learn it on a CPU in minutes, and simple enough that its evaluator
(`evaluators/toy_geneval.py`) is *exact*: quality differences between acceleration methods then
show up as real, measurable accuracy differences instead of noise.

The world:

* shapes: circle, square, triangle (upright, apex at the top); every shape's box is square
  (width == height), so shape identity is carried by how much of the box it fills
  (square 1.0, circle pi/4 ~ 0.785, triangle 0.5) and where the mass sits (triangle: bottom-heavy);
* colours: red, green, blue, yellow (flat fills, far apart in RGB) on a plain light-grey background;
* 1 to 4 objects per scene, each near a slot of a layout that the caption fixes (one object:
  centre; two: side by side in caption order, or stacked for "above"/"below"; three: a triangle;
  four: a 2x2 grid), moved by a small random jitter, never overlapping, with a gap between them so
  that colour segmentation cannot merge two objects. Colours the caption leaves open are random.
  Why slots (toy-world-2) instead of uniform placement (toy-world-1): a next-scale model samples
  the bits of each coarse token independently, so a layout that is uniform over the canvas must be
  carried by a 16-bit 1x1 code or comes out with missing or extra objects; a 1.8 M-parameter
  model trained for an hour on 2 CPU cores reached only 0.33 toy GenEval on world-1. Slots keep
  everything GenEval checks (class, count, colour, relation) while making the layout a function
  of the caption, which such a model learns in that budget;
* each scene has a caption in one of GenEval's six forms and a metadata dict in GenEval's
  `evaluation_metadata.jsonl` form (`tag`, `include`, `exclude`, `prompt`), so the official rules apply.

Geometry lives in normalised coordinates ([0, 1] x [0, 1], y grows downwards like image rows), so
one scene renders at any `image_size`. Everything is a pure function of a seed.

Bump `WORLD_VERSION` whenever anything here changes what a seed renders or captions: evaluator
`version_info` carries it, and records made with different world versions must not be compared.
"""
from __future__ import annotations

import dataclasses
from typing import Union

import numpy as np
from PIL import Image, ImageDraw

#: Version of the world (palette, geometry ranges, captions, sampling). See module docstring.
WORLD_VERSION = "toy-world-2"

#: Shape classes, in a fixed order (the order is part of the world: it fixes what a seed samples).
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles"}

#: Object colours (names are a subset of GenEval's colour list). Chosen far apart in RGB: the
#: closest pair (red/yellow) is ~160 apart, so a nearest-colour rule with a tolerance well below
#: half of that cannot confuse them even on blurry model outputs.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
}
#: Plain background; every palette colour is > 160 away from it.
BACKGROUND: tuple[int, int, int] = (235, 235, 235)

#: GenEval's six prompt forms, in GenEval's file order.
TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
#: Counts used by counting prompts (GenEval uses 2, 3 and 4).
COUNTS: tuple[int, ...] = (2, 3, 4)
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
#: Relations of GenEval's position prompts, and the relation each one flips to.
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
OPPOSITE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}

#: Object side length as a fraction of the image side: 0.22 is 14 px at 64x64, big enough for a
#: tiny model to draw a recognisable shape; 0.26 still leaves a wide gap between 2x2 slots.
SIZE_RANGE: tuple[float, float] = (0.22, 0.26)
#: Largest random move of an object's centre from its slot, per axis (fraction of the side; ~2 px).
JITTER = 0.03
#: Slot centres (x, y), normalised, per layout. "row"/"column" hold two objects in caption order
#: (left to right / top to bottom); the 0.27/0.73 grid keeps boxes >= 0.14 apart at any jitter.
LAYOUTS: dict[str, tuple[tuple[float, float], ...]] = {
    "single": ((0.5, 0.5),),
    "row": ((0.27, 0.5), (0.73, 0.5)),
    "column": ((0.5, 0.27), (0.5, 0.73)),
    "triangle": ((0.27, 0.27), (0.73, 0.27), (0.5, 0.73)),
    "grid": ((0.27, 0.27), (0.73, 0.27), (0.27, 0.73), (0.73, 0.73)),
}
COUNT_LAYOUT = {1: "single", 2: "row", 3: "triangle", 4: "grid"}
#: Minimum empty gap between two objects' boxes (fraction of the side; ~4 px at 64x64). The slots
#: guarantee it; `_place` checks it so that a change to the knobs above cannot silently break it.
GAP = 0.06
#: Margin between objects and the image border (fraction of the side).
BORDER = 0.03
#: A position scene must satisfy its relation with GenEval's direction score along the named axis
#: at least this strong and the other axis at most `POSITION_OFF_AXIS`: the caption's relation then
#: holds with room to spare and no second relation holds (so a flipped caption is plainly wrong).
POSITION_MIN_AXIS = 0.65
POSITION_OFF_AXIS = 0.35


@dataclasses.dataclass(frozen=True)
class ToyObject:
    """One shape. Box in normalised coordinates: (x0, y0) top-left, side `size`."""

    shape: str
    color: str
    x0: float
    y0: float
    size: float

    @property
    def box(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1), normalised, GenEval's box convention."""
        return (self.x0, self.y0, self.x0 + self.size, self.y0 + self.size)

    def pixel_box(self, image_size: int) -> tuple[int, int, int]:
        """(x0, y0, side) in pixels: the exact square `render` fills at `image_size`."""
        side = max(int(round(self.size * image_size)), 1)
        return int(round(self.x0 * image_size)), int(round(self.y0 * image_size)), side


@dataclasses.dataclass(frozen=True)
class ToyScene:
    """A scene: what to draw (`objects`), what it says (`caption`), what GenEval checks (`metadata`)."""

    caption: str
    metadata: dict
    objects: tuple[ToyObject, ...]
    tag: str


# ----------------------------------------------------------------------------------------------
# geometry


def relations(box_a, box_b) -> set[str]:
    """Set of GenEval relations ("left of", "right of", "above", "below") of box A to box B:
    GenEval's own rule (`varbench.evaluators.geneval.rules.relative_position`)."""
    from varbench.evaluators.geneval.rules import relative_position

    return relative_position((np.asarray(box_a, dtype=float),), (np.asarray(box_b, dtype=float),), 0.1)


def _clear_relation(box_a, box_b, rel: str) -> bool:
    """True if `rel` holds strongly and no other relation comes close (see POSITION_* knobs), by
    GenEval's direction scores (`varbench.evaluators.geneval.rules.position_scores`)."""
    from varbench.evaluators.geneval.rules import position_scores

    scores = position_scores((np.asarray(box_a, dtype=float),), (np.asarray(box_b, dtype=float),), 0.1)
    if scores is None:
        return False
    dx, dy = float(scores[0]), float(scores[1])
    along, across = (dx, dy) if rel in ("left of", "right of") else (dy, dx)
    sign = -1.0 if rel in ("left of", "above") else 1.0
    return sign * along >= POSITION_MIN_AXIS and abs(across) <= POSITION_OFF_AXIS


def _separated(a: ToyObject, b: ToyObject) -> bool:
    """Boxes at least GAP apart along some axis (so the shapes can never touch)."""
    ax0, ay0, ax1, ay1 = a.box
    bx0, by0, bx1, by1 = b.box
    return ax1 + GAP <= bx0 or bx1 + GAP <= ax0 or ay1 + GAP <= by0 or by1 + GAP <= ay0


def _place(rng: np.random.Generator, specs: list[tuple[str, str]], layout: str) -> tuple[ToyObject, ...]:
    """Objects (shape, colour) at the slots of `layout`, in order, each with a random size and
    jitter. Deterministic given the generator state."""
    objs: list[ToyObject] = []
    for (shape, color), (cx, cy) in zip(specs, LAYOUTS[layout], strict=True):
        size = float(rng.uniform(*SIZE_RANGE))
        jx, jy = rng.uniform(-JITTER, JITTER, size=2)
        objs.append(ToyObject(shape, color, float(cx + jx - size / 2), float(cy + jy - size / 2), size))
    for i, o in enumerate(objs):
        x0, y0, x1, y1 = o.box
        if min(x0, y0) < BORDER or max(x1, y1) > 1 - BORDER or not all(_separated(o, p) for p in objs[:i]):
            raise AssertionError(f"layout {layout!r} breaks BORDER/GAP with SIZE_RANGE={SIZE_RANGE}, JITTER={JITTER}")
    return tuple(objs)


# ----------------------------------------------------------------------------------------------
# scenes


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _two(rng: np.random.Generator, pool) -> tuple[str, str]:
    """Two distinct items of `pool`, in random order (GenEval never pairs a class with itself)."""
    i, j = rng.choice(len(pool), size=2, replace=False)
    return pool[int(i)], pool[int(j)]


def _pick(rng: np.random.Generator, pool):
    return pool[int(rng.integers(len(pool)))]


def sample_scene(rng: Union[int, np.random.Generator], tag: str | None = None) -> ToyScene:
    """Sample one scene.

    rng: an int seed (the scene is then a pure function of (seed, tag)) or a numpy Generator
         (advanced in place; use it to draw training streams).
    tag: one of TAGS, or None to draw the tag uniformly.
    """
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(int(rng))
    if tag is None:
        tag = _pick(rng, TAGS)
    if tag not in TAGS:
        raise ValueError(f"unknown tag {tag!r}; expected one of {', '.join(TAGS)}")
    colors = tuple(PALETTE)

    if tag == "single_object":
        shape = _pick(rng, SHAPES)
        objs = _place(rng, [(shape, _pick(rng, colors))], "single")
        caption = f"a photo of {_a(shape)} {shape}"
        include = [{"class": shape, "count": 1}]
        exclude = None
    elif tag == "two_object":
        s1, s2 = _two(rng, SHAPES)
        objs = _place(rng, [(s1, _pick(rng, colors)), (s2, _pick(rng, colors))], "row")
        caption = f"a photo of {_a(s1)} {s1} and {_a(s2)} {s2}"
        include = [{"class": s1, "count": 1}, {"class": s2, "count": 1}]
        exclude = None
    elif tag == "counting":
        shape, n = _pick(rng, SHAPES), _pick(rng, COUNTS)
        color = _pick(rng, colors)  # one colour for the group: counting prompts do not name one
        objs = _place(rng, [(shape, color)] * n, COUNT_LAYOUT[n])
        caption = f"a photo of {NUMBER_WORDS[n]} {PLURALS[shape]}"
        include = [{"class": shape, "count": n}]
        exclude = [{"class": shape, "count": n + 1}]  # GenEval: counting excludes count + 1
    elif tag == "colors":
        shape, color = _pick(rng, SHAPES), _pick(rng, colors)
        objs = _place(rng, [(shape, color)], "single")
        caption = f"a photo of {_a(color)} {color} {shape}"
        include = [{"class": shape, "count": 1, "color": color}]
        exclude = None
    elif tag == "position":
        target, subject = _two(rng, SHAPES)
        rel = _pick(rng, RELATIONS)
        first, second = (subject, target) if rel in ("left of", "above") else (target, subject)
        placed = _place(rng, [(first, _pick(rng, colors)), (second, _pick(rng, colors))],
                        "row" if rel in ("left of", "right of") else "column")
        objs = placed if first == target else placed[::-1]  # objs[0] is the target, as before
        if not _clear_relation(objs[1].box, objs[0].box, rel):
            raise AssertionError(f"slots do not give a clear {rel!r}; check LAYOUTS and JITTER")
        caption = f"a photo of {_a(subject)} {subject} {rel} {_a(target)} {target}"
        # GenEval lists the target first and points the subject at it with [relation, 0]
        include = [{"class": target, "count": 1}, {"class": subject, "count": 1, "position": [rel, 0]}]
        exclude = None
    else:  # color_attr
        s1, s2 = _two(rng, SHAPES)
        c1, c2 = _two(rng, colors)
        objs = _place(rng, [(s1, c1), (s2, c2)], "row")
        caption = f"a photo of {_a(c1)} {c1} {s1} and {_a(c2)} {c2} {s2}"
        include = [{"class": s1, "count": 1, "color": c1}, {"class": s2, "count": 1, "color": c2}]
        exclude = None

    metadata: dict = {"tag": tag, "include": include}
    if exclude is not None:
        metadata["exclude"] = exclude
    metadata["prompt"] = caption
    return ToyScene(caption=caption, metadata=metadata, objects=objs, tag=tag)


def scene_seed(seed: int, index: int) -> int:
    """Seed of scene `index` of the prompt set drawn with `seed` (independent of the set's size)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def prompt_set(n: int, seed: int = 0) -> list[dict]:
    """`n` prompts with a balanced mix of the six tags (round robin, in TAGS order).

    Returns dicts {prompt, metadata, scene_seed}: `metadata` is GenEval's record for the prompt;
    `sample_scene(scene_seed, metadata["tag"])` rebuilds the scene (e.g. to render the ground
    truth). Prompt i depends only on (seed, i), so a smaller set is a prefix of a larger one.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    out = []
    for i in range(n):
        tag = TAGS[i % len(TAGS)]
        s = scene_seed(seed, i)
        scene = sample_scene(s, tag)
        out.append({"prompt": scene.caption, "metadata": scene.metadata, "scene_seed": s})
    return out


# ----------------------------------------------------------------------------------------------
# rendering


def render(scene: ToyScene, image_size: int = 64) -> Image.Image:
    """Draw `scene` on an `image_size` x `image_size` RGB canvas.

    Flat colours, no anti-aliasing: every pixel is exactly a palette colour or the background,
    which makes the image deterministic across platforms and the ground truth exact. 64 suits a
    tiny model; larger sizes cost quadratically more model compute but change nothing else.
    """
    if int(image_size) < 32:
        raise ValueError(f"image_size must be >= 32 (objects would be < 6 px), got {image_size}")
    image = Image.new("RGB", (int(image_size), int(image_size)), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for obj in scene.objects:
        x, y, s = obj.pixel_box(int(image_size))
        fill = PALETTE[obj.color]
        x1, y1 = x + s - 1, y + s - 1  # PIL boxes are inclusive
        if obj.shape == "square":
            draw.rectangle([x, y, x1, y1], fill=fill)
        elif obj.shape == "circle":
            draw.ellipse([x, y, x1, y1], fill=fill)
        elif obj.shape == "triangle":
            draw.polygon([(x + (s - 1) / 2.0, y), (x1, y1), (x, y1)], fill=fill)
        else:
            raise ValueError(f"unknown shape {obj.shape!r}; expected one of {', '.join(SHAPES)}")
    return image


def world_info() -> dict:
    """The world's parameters, for provenance (stored in evaluator `version_info`)."""
    return {
        "world_version": WORLD_VERSION,
        "shapes": list(SHAPES),
        "palette": {k: list(v) for k, v in PALETTE.items()},
        "background": list(BACKGROUND),
        "counts": list(COUNTS),
        "size_range": list(SIZE_RANGE),
        "jitter": JITTER,
        "layouts": {k: [list(c) for c in v] for k, v in LAYOUTS.items()},
        "gap": GAP,
    }


