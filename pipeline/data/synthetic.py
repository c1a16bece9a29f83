"""The embedded default benchmark: a seeded synthetic 100-class FSCIL dataset rendered straight into a pack.

A class is a combination of three attributes: a shape family (disc, square, triangle, ring, cross,
semicircle), a colour (six hues 60 degrees apart) and a texture (solid, stripes, checker); 6 x 6 x 3 = 108
combinations, of which a seeded permutation picks the classes and their order. Classes therefore come in
families sharing one or two attributes: distinct, but confusable. With `novel_shapes` n > 0 the incremental classes
instead take n shape families no base class has (star, crescent, bar, ell), in the six colours and three textures:
each novel class then brings a shape the base session never showed, as a new character or species does in real
FSCIL benchmarks, while the base classes (and every base image) stay those of n = 0. Within a class, images vary in
position, scale, rotation, hue/saturation/value, stripe period and phase, background (a random two-colour
gradient), distractors (three small solid shapes of the six base families, any colour) and pixel noise.

Protocol (CIFAR-like by default): classes 0..B-1 are the base classes with `train_per_class` training
images each; every incremental class gets a pool of `novel_pool_per_class` images from which `shots` are
drawn (the rest of the pool stays in the pack unused, e.g. for joint-training upper bounds); every class
has `test_per_class` test images. Pack layout: training pools class by class, then test images class by
class. Rendering is vectorised numpy over chunks of images (signed distance functions on a coordinate
grid), deterministic per seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from PIL import Image

from pipeline.data.pack import PackContent
from pipeline.data.presets import get_preset
from pipeline.data.protocol import FSCILProtocol, Session
from pipeline.data.source import fit_shorter_side
from pipeline.errors import FSCILError

SHAPES = ("disc", "square", "triangle", "ring", "cross", "semicircle")
NOVEL_SHAPES = ("star", "crescent", "bar", "ell")  # only incremental classes, and only with novel_shapes > 0
COLOURS = ("red", "yellow", "green", "cyan", "blue", "magenta")  # hues 0, 60, ..., 300 degrees
TEXTURES = ("solid", "stripes", "checker")
EXTRA_TEXTURES = ("rings",)  # only in the extension pool: classes beyond the 108 of the default benchmark
RENDER_CHUNK = 512
CLASSES_PER_SHAPE = len(COLOURS) * len(TEXTURES)
MAX_CLASSES = len(SHAPES) * CLASSES_PER_SHAPE  # of the six base families; novel_shapes adds its own families
# more classes than MAX_CLASSES (a CUB-200-shaped set): the 108, then the novel families' 72 and every family in rings
MAX_EXTENDED = MAX_CLASSES + len(NOVEL_SHAPES) * CLASSES_PER_SHAPE + (len(SHAPES) + len(NOVEL_SHAPES)) * len(COLOURS)


@dataclass(frozen=True)
class SyntheticSpec:
    """Sizes of the synthetic benchmark."""

    base_classes: int = 60
    ways: int = 5
    shots: int = 5
    sessions: int = 8
    train_per_class: int = 100
    novel_pool_per_class: int = 20
    test_per_class: int = 40
    image_size: int = 32
    seed: int = 0
    novel_shapes: int = 0  # incremental classes in shape families no base class has (0: the default benchmark)
    render_size: int | None = None  # images drawn at this side and resized to image_size (None: drawn at image_size)

    @property
    def num_classes(self) -> int:
        return self.base_classes + self.ways * self.sessions


def class_count_error(base_classes: int, incremental_classes: int, novel_shapes: int) -> tuple[str, str] | None:
    """(the key to blame, why) when the synthetic set cannot hold this many classes, else None: without novel
    shapes all classes share the 108 combinations, and up to 240 with the extension pool (`class_attributes`); with
    n novel families the base classes take the 108 and the incremental classes the n x 18 of their own families."""
    if not 0 <= novel_shapes <= len(NOVEL_SHAPES):
        return "novel_shapes", f"must be 0..{len(NOVEL_SHAPES)}, got {novel_shapes}"
    if novel_shapes == 0 and base_classes + incremental_classes > MAX_EXTENDED:
        return "base_classes", f"+ ways x sessions must be <= {MAX_EXTENDED} for synthetic, got " \
                               f"{base_classes + incremental_classes}"
    if novel_shapes and (base_classes > MAX_CLASSES or incremental_classes > CLASSES_PER_SHAPE * novel_shapes):
        return "novel_shapes", f"{novel_shapes} gives at most {CLASSES_PER_SHAPE * novel_shapes} incremental " \
                               f"classes (and {MAX_CLASSES} base); the protocol needs {incremental_classes} " \
                               f"incremental and {base_classes} base classes"
    return None


def class_attributes(num_classes: int, seed: int, base_classes: int | None = None,
                     novel_shapes: int = 0) -> np.ndarray:
    """(num_classes, 3) int (shape, colour, texture) indices: a seeded choice and order of the 108 combinations.

    novel_shapes n > 0: the first `base_classes` rows are those of n = 0 and the rest a seeded choice of the
    combinations of the n families of NOVEL_SHAPES (shape indices 6, 7, ...), so no base class shares a novel
    class's shape. More than 108 classes (novel_shapes 0): the 108 in the same order, then a seeded order of the
    extension pool (the novel families in the three textures, every family in rings), so the first 108 classes are
    those of any smaller set."""
    base_classes = num_classes if base_classes is None else base_classes
    error = class_count_error(base_classes, num_classes - base_classes, novel_shapes)
    if error is not None:
        raise FSCILError(f"synthetic: {' '.join(error)}")
    rng = np.random.default_rng([seed, 1])
    combos = _combinations(range(len(SHAPES)))
    if novel_shapes == 0 and num_classes <= MAX_CLASSES:
        return combos[rng.permutation(len(combos))[:num_classes]]
    if novel_shapes == 0:
        families = range(len(SHAPES) + len(NOVEL_SHAPES))
        extension = np.concatenate([_combinations(range(len(SHAPES), len(families))),
                                    np.array([(f, c, len(TEXTURES)) for f in families for c in range(len(COLOURS))])])
        order = np.random.default_rng([seed, 5]).permutation(len(extension))[:num_classes - MAX_CLASSES]
        return np.concatenate([combos[rng.permutation(len(combos))], extension[order]])
    base = combos[rng.permutation(len(combos))[:base_classes]]
    novel = _combinations(range(len(SHAPES), len(SHAPES) + novel_shapes))
    order = np.random.default_rng([seed, 4]).permutation(len(novel))[:num_classes - base_classes]
    return np.concatenate([base, novel[order]])


def _combinations(shapes: range) -> np.ndarray:
    return np.array([(s, c, t) for s in shapes for c in range(len(COLOURS)) for t in range(len(TEXTURES))])


def class_names(attributes: np.ndarray) -> list[str]:
    return [f"{(SHAPES + NOVEL_SHAPES)[s]}-{COLOURS[c]}-{(TEXTURES + EXTRA_TEXTURES)[t]}" for s, c, t in attributes]


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(..., 3) RGB in [0, 1] from hue in turns and saturation/value in [0, 1]."""
    out = []
    for n in (5.0, 3.0, 1.0):
        k = (n + h * 6.0) % 6.0
        out.append(v - v * s * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0))
    return np.stack(out, axis=-1)


def _sdf(shape: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Signed distance (in object radii, negative inside) of each sample's shape family; px, py: (B, S, S).
    The NOVEL_SHAPES families are computed only when a sample has one (the default benchmark never does)."""
    r = np.sqrt(px * px + py * py)
    ax, ay = np.abs(px), np.abs(py)
    families = [
        r - 1.0,                                                             # disc
        np.maximum(ax, ay) - 0.85,                                           # square
        np.maximum(ax * 0.866 + py * 0.5, -py) - 0.5,                        # triangle (circumradius 1)
        np.abs(r - 0.75) - 0.25,                                             # ring
        np.minimum(np.maximum(ax - 1.0, ay - 0.32), np.maximum(ax - 0.32, ay - 1.0)),  # cross
        np.maximum(r - 1.0, -py),                                            # semicircle
    ]
    if shape.max(initial=0) >= len(SHAPES):
        families += [
            r - (0.65 + 0.35 * np.cos(5.0 * np.arctan2(py, px))),            # star (five points; approximate)
            np.maximum(r - 1.0, 0.8 - np.sqrt((px - 0.5) ** 2 + py * py)),   # crescent: a disc less an offset disc
            np.maximum(ax - 1.0, ay - 0.3),                                  # bar, 1 x 0.3
            np.minimum(_box(px + 0.55, py, 0.3, 0.95), _box(px, py - 0.65, 0.85, 0.3)),  # ell
        ]
    return np.choose(shape[:, None, None], families)


def _box(px: np.ndarray, py: np.ndarray, half_x: float, half_y: float) -> np.ndarray:
    return np.maximum(np.abs(px) - half_x, np.abs(py) - half_y)


def _local(grid_x: np.ndarray, grid_y: np.ndarray, cx, cy, radius, angle) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates in each object's frame (rotated, in units of its radius); all params (B,)."""
    dx, dy = grid_x[None] - cx[:, None, None], grid_y[None] - cy[:, None, None]
    cos, sin = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    rad = radius[:, None, None]
    return (cos * dx + sin * dy) / rad, (-sin * dx + cos * dy) / rad


def _coverage(sdf: np.ndarray, radius_px: np.ndarray) -> np.ndarray:
    """Anti-aliased coverage: a one-pixel ramp across the boundary."""
    return np.clip(0.5 - sdf * radius_px[:, None, None], 0.0, 1.0)[..., None]


def render(attributes: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Render one image per row of attributes (B, 3) -> uint8 (B, size, size, 3)."""
    b = len(attributes)
    shape, colour, texture = attributes[:, 0], attributes[:, 1], attributes[:, 2]
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0  # pixel centres in [-1, 1]
    gx, gy = np.meshgrid(coords, coords)
    half = size / 2.0

    # background: a two-colour linear gradient of low saturation
    c0 = _hsv_to_rgb(rng.random(b), rng.uniform(0.0, 0.35, b), rng.uniform(0.2, 0.9, b))
    c1 = _hsv_to_rgb(rng.random(b), rng.uniform(0.0, 0.35, b), rng.uniform(0.2, 0.9, b))
    theta = rng.uniform(0, 2 * np.pi, b)
    ramp = (np.cos(theta)[:, None, None] * gx + np.sin(theta)[:, None, None] * gy + 1.5) / 3.0
    img = c0[:, None, None] + (c1 - c0)[:, None, None] * ramp[..., None]

    # distractors: three small solid shapes of random family and colour
    for _ in range(3):
        radius = rng.uniform(0.12, 0.24, b)
        px, py = _local(gx, gy, rng.uniform(-0.8, 0.8, b), rng.uniform(-0.8, 0.8, b), radius,
                        rng.uniform(0, 2 * np.pi, b))
        alpha = _coverage(_sdf(rng.integers(0, len(SHAPES), b), px, py), radius * half)
        col = _hsv_to_rgb(rng.random(b), rng.uniform(0.3, 1.0, b), rng.uniform(0.3, 1.0, b))
        img = img * (1 - alpha) + col[:, None, None] * alpha

    # the class object
    radius = rng.uniform(0.28, 0.55, b)
    px, py = _local(gx, gy, rng.uniform(-0.3, 0.3, b), rng.uniform(-0.3, 0.3, b), radius,
                    rng.uniform(0, 2 * np.pi, b))
    alpha = _coverage(_sdf(shape, px, py), radius * half)
    hue = colour / len(COLOURS) + rng.uniform(-0.065, 0.065, b)  # neighbouring hues nearly touch
    col = _hsv_to_rgb(hue % 1.0, rng.uniform(0.55, 1.0, b), rng.uniform(0.55, 1.0, b))
    # texture in the object's frame, period in pixels
    period = rng.uniform(5.0, 8.0, b) / (radius * half)
    phase = rng.uniform(0, 2 * np.pi, (2, b))
    wave_x = np.sin(2 * np.pi * px / period[:, None, None] + phase[0][:, None, None])
    wave_y = np.sin(2 * np.pi * py / period[:, None, None] + phase[1][:, None, None])
    textures = [np.ones_like(px), wave_x, wave_x * wave_y]
    if texture.max(initial=0) >= len(TEXTURES):  # rings: only in the extension pool
        radial = np.sqrt(px * px + py * py)
        textures.append(np.sin(2 * np.pi * radial / period[:, None, None] + phase[0][:, None, None]))
    pattern = np.choose(texture[:, None, None], textures)
    depth = rng.uniform(0.45, 0.75, b)[:, None, None]
    shade = 1.0 - depth * (1.0 - np.clip(0.5 + 1.5 * pattern, 0.0, 1.0))
    img = img * (1 - alpha) + col[:, None, None] * shade[..., None] * alpha

    img = img + rng.normal(0.0, 1.0, img.shape) * rng.uniform(0.02, 0.09, b)[:, None, None, None]
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)


def _layout(spec: SyntheticSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample labels and is_test flags, in pack order: training pools class by class, then test images."""
    pool = np.where(np.arange(spec.num_classes) < spec.base_classes, spec.train_per_class, spec.novel_pool_per_class)
    train_labels = np.repeat(np.arange(spec.num_classes), pool)
    test_labels = np.repeat(np.arange(spec.num_classes), spec.test_per_class)
    labels = np.concatenate([train_labels, test_labels]).astype(np.int64)
    is_test = np.concatenate([np.zeros(len(train_labels), bool), np.ones(len(test_labels), bool)])
    return labels, is_test


def synthetic_protocol(spec: SyntheticSpec, labels: np.ndarray, is_test: np.ndarray) -> FSCILProtocol:
    """Base session = every base training image; session t = `shots` seeded picks from each of its classes' pools."""
    rng = np.random.default_rng([spec.seed, 2])
    train = np.flatnonzero(~is_test)
    base = train[labels[train] < spec.base_classes]
    sessions = [Session(0, np.arange(spec.base_classes), base)]
    for t in range(1, spec.sessions + 1):
        classes = np.arange(spec.base_classes + (t - 1) * spec.ways, spec.base_classes + t * spec.ways)
        ids = [np.sort(rng.choice(train[labels[train] == c], spec.shots, replace=False)) for c in classes]
        sessions.append(Session(t, classes, np.concatenate(ids)))
    return FSCILProtocol(sessions, np.flatnonzero(is_test))


def _stream(attributes: np.ndarray, labels: np.ndarray, size: int, seed: int,
            render_size: int | None = None) -> Iterator[np.ndarray]:
    rng = np.random.default_rng([seed, 3])
    for start in range(0, len(labels), RENDER_CHUNK):
        chunk = render(attributes[labels[start : start + RENDER_CHUNK]], render_size or size, rng)
        yield chunk if render_size in (None, size) else _resized(chunk, size)


def _resized(images: np.ndarray, size: int) -> np.ndarray:
    """(B, s, s, 3) uint8 -> (B, size, size, 3), bilinear: a large image side at the cost of a small one."""
    return np.stack([np.asarray(Image.fromarray(img).resize((size, size), Image.BILINEAR)) for img in images])


def synthetic_pack_content(spec: SyntheticSpec, preset: str = "synthetic") -> PackContent:
    """The synthetic benchmark as PackContent; images are rendered chunk by chunk as the writer consumes them."""
    if spec.novel_pool_per_class < spec.shots or spec.train_per_class < 1 or spec.test_per_class < 1:
        raise FSCILError("synthetic: need train_per_class >= 1, test_per_class >= 1, novel pool >= shots")
    attributes = class_attributes(spec.num_classes, spec.seed, spec.base_classes, spec.novel_shapes)
    labels, is_test = _layout(spec)
    protocol = synthetic_protocol(spec, labels, is_test)
    protocol.validate(labels, ways=spec.ways, shots=spec.shots)
    names = class_names(attributes)
    split = np.where(is_test, "test", "train")
    images = _stream(attributes, labels, spec.image_size, spec.seed, spec.render_size)
    view = get_preset(preset, spec.image_size)
    extents = None
    if view.view == "shorter_side":  # a benchmark that keeps whole images (CUB): each square image whole on its canvas
        extents = []
        images = _on_canvas(images, view, extents)
    return PackContent(
        dataset="synthetic",
        preset=preset,
        image_size=spec.image_size,
        labels=labels,
        class_names=names,
        protocol=protocol,
        images=images,
        provenance={"generator": "synthetic", "params": {k: getattr(spec, k) for k in spec.__dataclass_fields__}},
        source_keys=[f"{split[i]}/{names[labels[i]]}/{i}" for i in range(len(labels))],
        extents=extents,
    )


def _on_canvas(chunks: Iterator[np.ndarray], view, extents: list) -> Iterator[np.ndarray]:
    """Square image chunks as the shorter_side view stores them (`fit_shorter_side`), extents appended."""
    for chunk in chunks:
        placed = [fit_shorter_side(Image.fromarray(img), view.test_resize, view.canvas) for img in chunk]
        extents.extend(size for _, size in placed)
        yield np.stack([img for img, _ in placed])

