"""data.source synthetic: a paper preset's benchmark drawn by the synthetic generator at its own shape (classes,
protocol, images per class, image side, image preset), so the preset runs unchanged without its dataset."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import build_config
from pipeline.data.cec_splits import BENCHMARKS
from pipeline.data.pack import ImagePack
from pipeline.data.prepare import build_pack
from pipeline.data.presets import get_preset
from pipeline.data.synthetic import EXTRA_TEXTURES, MAX_CLASSES, MAX_EXTENDED, TEXTURES, class_attributes


def test_more_than_108_classes_keep_the_first_108_and_are_all_distinct():
    small, large = class_attributes(100, 3), class_attributes(MAX_EXTENDED, 3, base_classes=100)
    assert np.array_equal(large[:100], small)  # the default benchmark's classes and order, unchanged
    assert len({tuple(row) for row in large}) == MAX_EXTENDED == 240
    assert (large[:MAX_CLASSES, 2] < len(TEXTURES)).all() and (large[MAX_CLASSES:, 2] == len(TEXTURES)).any()
    assert len(TEXTURES + EXTRA_TEXTURES) == 4


@pytest.mark.parametrize("preset", ["cifar100", "mini_imagenet", "cub200"])
def test_one_key_gives_each_paper_preset_its_benchmark_shape(preset):
    """No root, no split files: the preset's config resolves with the benchmark's protocol, counts and side."""
    data = build_config({"preset": preset, "data": {"source": "synthetic"}}).data
    b = BENCHMARKS[preset]
    assert data.protocol_shape() == (b.base_classes, b.ways, b.shots, b.sessions)
    assert data.generated_counts() == (b.train_per_class, b.train_per_class, b.test_per_class)
    assert data.resolved_image_size == {"cifar100": 32, "mini_imagenet": 84, "cub200": 224}[preset]


def test_a_cub_shaped_pack_has_200_classes_at_224_px_under_cub_preset(tmp_path):
    """Counts cut down for the test (the keys a user can set), the rest CUB's: 100 base classes + 10 sessions of
    10-way 5-shot, 224 px images (drawn at 32, resized: smooth at the pixel scale) and CUB's image preset."""
    cfg = build_config({"preset": "cub200", "data": {"source": "synthetic", "train_per_class": 2,
                                                     "novel_pool_per_class": 5, "test_per_class": 1}})
    build_pack(cfg.data, tmp_path / "pack.h5")
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        protocol = pack.protocol
        assert (pack.preset, pack.image_size, protocol.num_classes) == ("cub200", 224, 200)
        assert len(protocol.sessions) == 11 and all(len(s.classes) == 10 and len(s.train_ids) == 50
                                                    for s in protocol.sessions[1:])
        assert len(protocol.sessions[0].train_ids) == 200 and len(protocol.test_ids) == 200
        images = pack.read_images(np.arange(8))
        assert get_preset(pack.preset, pack.image_size).input_size == 224
        # CUB's view: whole images, shorter side 256, on a 512 canvas (a square synthetic image fills 256 x 256)
        assert pack.canvas == 512 and pack.read_extents(np.arange(8)).tolist() == [[256, 256]] * 8
    assert images.shape == (8, 512, 512, 3) and not images[:, 256:].any() and not images[:, :, 256:].any()
    images = images[:, :256, :256]
    steps = np.abs(np.diff(images.astype(np.int16), axis=2)).mean()
    assert steps < 6  # a 7x bilinear upscale: neighbouring pixels nearly equal (a native 224 px draw has noise)
