"""The synthetic default benchmark: protocol, speed, determinism, distinct but confusable classes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.data.pack import ImagePack
from pipeline.data.synthetic import COLOURS, NOVEL_SHAPES, SHAPES, TEXTURES, class_attributes, render
from stages.prepare import run


@pytest.fixture(scope="module")
def default_pack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, float]:
    out = tmp_path_factory.mktemp("synthetic") / "pack.h5"
    start = time.perf_counter()
    summary = run({"dataset": "synthetic"}, out)
    return out, summary, time.perf_counter() - start


def test_default_protocol_and_speed(default_pack: tuple[Path, dict, float]) -> None:
    out, summary, seconds = default_pack
    assert seconds < 60
    assert summary["train_images_per_session"] == [6000] + [25] * 8
    with ImagePack.open(out) as pack:
        p = pack.protocol
        assert pack.images.shape == (100 * 40 + 60 * 100 + 40 * 20, 32, 32, 3)
        assert (p.num_classes, p.num_base_classes, p.num_incremental, p.ways, p.shots) == (100, 60, 8, 5, 5)
        p.validate(pack.labels, ways=5, shots=5)
        assert np.bincount(pack.labels[p.test_ids]).tolist() == [40] * 100
        assert np.bincount(pack.labels[p.sessions[0].train_ids]).tolist() == [100] * 60
        assert len(set(pack.class_names)) == 100
        assert pack.preset == "synthetic" and pack.provenance["params"]["seed"] == 0
        pack.verify()


def test_images_are_learnable_but_not_trivial(default_pack: tuple[Path, dict, float]) -> None:
    """A nearest-class-mean classifier on 8x8 colour thumbnails: clearly above chance, far from perfect."""
    out, _, _ = default_pack
    with ImagePack.open(out) as pack:
        p, labels = pack.protocol, pack.labels
        train, test = p.sessions[0].train_ids, p.test_ids_seen(0, labels)
        x = pack.images[:].astype(np.float32) / 255
    thumbs = x.reshape(len(x), 8, 4, 8, 4, 3).mean(axis=(2, 4)).reshape(len(x), -1)
    means = np.stack([thumbs[train][labels[train] == c].mean(0) for c in range(60)])
    dist = ((thumbs[test][:, None] - means[None]) ** 2).sum(-1)
    accuracy = (dist.argmin(1) == labels[test]).mean()
    assert 3 / 60 < accuracy < 0.6
    assert 0.1 < x.std() < 0.4 and 0.3 < x.mean() < 0.7


def test_classes_are_distinct_combinations_in_families() -> None:
    attrs = class_attributes(100, seed=0)
    assert len({tuple(a) for a in attrs}) == 100
    assert attrs.max(0).tolist() == [len(SHAPES) - 1, len(COLOURS) - 1, len(TEXTURES) - 1]
    # every class has a sibling that differs in exactly one attribute: confusable families
    same = (attrs[:, None, :] == attrs[None, :, :]).sum(-1)
    assert ((same == 2).sum(1) > 0).all()
    # rendered with identical nuisance draws, any two classes give clearly different images
    imgs = np.stack([render(a[None], 32, np.random.default_rng(123))[0] for a in attrs]).astype(np.float32) / 255
    changed = (np.abs(imgs[:, None] - imgs[None]).max(-1) > 0.1).sum(axis=(2, 3))  # pixels that differ visibly
    np.fill_diagonal(changed, 1024)
    assert changed.min() >= 10


def test_generation_is_deterministic_per_seed(tmp_path: Path) -> None:
    small = {"dataset": "synthetic", "train_per_class": 6, "novel_pool_per_class": 6, "test_per_class": 2}
    a, b = run(small, tmp_path / "a.h5"), run(small, tmp_path / "b.h5")
    c = run({**small, "seed": 1}, tmp_path / "c.h5")
    assert a["content_hash"] == b["content_hash"] != c["content_hash"]
    with ImagePack.open(tmp_path / "a.h5") as pa, ImagePack.open(tmp_path / "b.h5") as pb, \
            ImagePack.open(tmp_path / "c.h5") as pc:
        np.testing.assert_array_equal(pa.images[:], pb.images[:])
        assert pa.protocol == pb.protocol and pa.class_names == pb.class_names
        assert pa.class_names != pc.class_names
        # shots are drawn from each novel class's pool of 6
        assert pa.protocol.sessions[3].train_ids.size == 25 and a["images"] == 60 * 6 + 40 * 6 + 100 * 2


def test_protocol_size_is_configurable(tmp_path: Path) -> None:
    summary = run({"dataset": "synthetic", "base_classes": 10, "ways": 3, "shots": 2, "sessions": 4,
                   "train_per_class": 4, "novel_pool_per_class": 3, "test_per_class": 1, "image_size": 16},
                  tmp_path / "p.h5")
    assert summary["train_images_per_session"] == [40, 6, 6, 6, 6]
    assert (summary["classes"], summary["image_size"], summary["test_images"]) == (22, 16, 22)


def test_novel_shapes_change_only_the_incremental_classes(tmp_path: Path) -> None:
    """novel_shapes 3: every incremental class has a shape family no base class has, and the base session (classes,
    images, test images) and the protocol stay exactly those of the default benchmark."""
    small = {"dataset": "synthetic", "train_per_class": 6, "novel_pool_per_class": 6, "test_per_class": 2}
    run(small, tmp_path / "plain.h5")
    run({**small, "novel_shapes": 3}, tmp_path / "novel.h5")
    attrs = class_attributes(100, seed=0, base_classes=60, novel_shapes=3)
    np.testing.assert_array_equal(attrs[:60], class_attributes(100, seed=0)[:60])
    assert (attrs[:60, 0] < len(SHAPES)).all() and set(attrs[60:, 0]) == {6, 7, 8}
    assert len({tuple(a) for a in attrs}) == 100
    with ImagePack.open(tmp_path / "plain.h5") as plain, ImagePack.open(tmp_path / "novel.h5") as novel:
        assert plain.protocol == novel.protocol
        np.testing.assert_array_equal(plain.labels, novel.labels)
        base = plain.labels < 60
        np.testing.assert_array_equal(plain.images[:][base], novel.images[:][base])
        assert (plain.images[:][~base] != novel.images[:][~base]).any()
        assert novel.class_names[:60] == plain.class_names[:60]
        assert {name.split("-")[0] for name in novel.class_names[60:]} == set(NOVEL_SHAPES[:3])
    # each new family renders differently from every base family under identical nuisance draws
    shapes = [render(np.array([[s, 0, 0]]), 32, np.random.default_rng(7))[0].astype(np.float32) / 255
              for s in range(len(SHAPES) + len(NOVEL_SHAPES))]
    for new in range(len(SHAPES), len(shapes)):
        assert min((np.abs(shapes[new] - shapes[old]).max(-1) > 0.1).sum() for old in range(new)) >= 10
