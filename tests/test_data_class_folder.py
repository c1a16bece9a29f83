"""Class-folder trees (flat and nested) with a seeded protocol generator -> pack."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data.class_folder import read_class_folder
from pipeline.data.pack import ImagePack
from pipeline.data.sampling import seeded_protocol
from stages.prepare import run
from tests.data_fixtures import assert_prepare_fails, write_class_folder, write_image

FLAT = {f"class_{k}": 10 for k in range(7)}
NESTED = {"birds/crow": 6, "birds/owl": 6, "fish/carp": 6, "fish/eel": 6, "trees/oak": 6}


def params(root: Path, **kw) -> dict:
    return {"dataset": "class_folder", "root": str(root), "ways": 2, "shots": 3, "sessions": 2, "test_fraction": 0.2,
            "image_size": 8, "seed": 7, **kw}


def test_flat_tree_pack(tmp_path: Path) -> None:
    pixels = write_class_folder(tmp_path / "raw", FLAT, size=(8, 8))
    summary = run(params(tmp_path / "raw"), tmp_path / "pack.h5")
    # 7 classes: 3 base + 2 sessions x 2 ways; each class holds out round(0.2 * 10) = 2 test images
    assert summary["base_classes"] == 3 and summary["train_images_per_session"] == [24, 6, 6]
    assert summary["test_images"] == 14 and summary["classes"] == 7
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        p = pack.protocol
        assert sorted(pack.class_names) == sorted(FLAT)
        for i in range(len(pack)):  # stored at native size: exact pixels, label = the folder
            np.testing.assert_array_equal(pack.images[i], pixels[pack.source_keys[i]])
            assert pack.source_keys[i].split("/")[0] == pack.class_names[pack.labels[i]]
        train_keys = {pack.source_keys[i] for s in p.sessions for i in s.train_ids}
        test_keys = {pack.source_keys[i] for i in p.test_ids}
        assert not train_keys & test_keys
        base_names = [pack.class_names[c] for c in p.sessions[0].classes]
        assert len(train_keys) == 24 + 12 and all(sum(k.startswith(n + "/") for k in train_keys) == 8
                                                  for n in base_names)
        assert pack.provenance["protocol"] == {"generator": "class_folder", "seed": 7, "base_classes": 3, "ways": 2,
                                               "shots": 3, "sessions": 2, "test_fraction": 0.2,
                                               "shuffle_classes": True}


def test_nested_tree_names_and_sorted_order(tmp_path: Path) -> None:
    write_class_folder(tmp_path / "raw", NESTED, size=(12, 6))
    source = read_class_folder(tmp_path / "raw")
    assert source.class_names == sorted(NESTED)
    assert np.bincount(source.labels).tolist() == [6] * 5
    run(params(tmp_path / "raw", ways=1, shots=2, sessions=2, shuffle_classes=False), tmp_path / "pack.h5")
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        assert pack.class_names == sorted(NESTED)  # unshuffled: base = the first three names
        key = pack.source_keys[0]
        img = Image.open(tmp_path / "raw" / key).convert("RGB")  # 12 x 6 -> 16 x 8 -> centre 8 x 8
        expected = np.asarray(img.resize((16, 8), Image.Resampling.BILINEAR).crop((4, 0, 12, 8)))
        np.testing.assert_array_equal(pack.images[0], expected)


def test_generator_is_seeded(tmp_path: Path) -> None:
    write_class_folder(tmp_path / "raw", FLAT, size=(8, 8))
    source = read_class_folder(tmp_path / "raw")

    def draw(seed: int):
        split, sessions = seeded_protocol(source, None, 2, 3, 2, 0.2, seed)
        return split.is_train, sessions

    (a_train, a_sessions), (b_train, b_sessions), (c_train, _) = draw(1), draw(1), draw(2)
    assert np.array_equal(a_train, b_train) and all(np.array_equal(x, y) for x, y in zip(a_sessions, b_sessions,
                                                                                         strict=True))
    assert not np.array_equal(a_train, c_train)
    assert run(params(tmp_path / "raw"), tmp_path / "a.h5")["content_hash"] == \
        run(params(tmp_path / "raw"), tmp_path / "b.h5")["content_hash"]


def _make(tmp_path: Path, what: str) -> Path:
    root = tmp_path / "raw"
    if what == "missing":
        return root
    if what == "loose_images":
        write_class_folder(root, FLAT, size=(8, 8))
        write_image(root / "stray.png", np.zeros((8, 8, 3), np.uint8))
    elif what == "nested_class":
        write_class_folder(root, {**FLAT, "class_1/sub": 10}, size=(8, 8))
    elif what == "empty":
        (root / "nothing").mkdir(parents=True)
    elif what == "too_few_classes":
        write_class_folder(root, {"a": 5, "b": 5, "c": 5, "d": 5}, size=(8, 8))
    elif what == "too_few_shots":
        write_class_folder(root, {**FLAT, "class_6": 3}, size=(8, 8))
    elif what == "single_image":
        write_class_folder(root, {**FLAT, "class_6": 1}, size=(8, 8))
    elif what == "corrupt":
        write_class_folder(root, FLAT, size=(8, 8))
        (root / "class_3" / "img_04.png").write_bytes(b"\x89PNG broken")
    return root


@pytest.mark.parametrize(("what", "overrides", "message"), [
    ("missing", {}, "missing class-folder dataset directory .*raw"),
    ("loose_images", {}, "raw holds images directly; expected root/<class>/<image>"),
    ("nested_class", {}, "raw/class_1 holds images and also class folder 'class_1/sub'"),
    ("empty", {}, "no images found under .*raw"),
    ("too_few_classes", {}, "4 classes cannot fill 2 sessions x 2 ways plus a base session"),
    ("too_few_classes", {"base_classes": 2}, "the protocol needs 6 classes \\(2 base \\+ 2 x 2\\), the dataset has 4"),
    ("too_few_shots", {"shuffle_classes": False, "base_classes": 5, "sessions": 1},
     "class 'class_6' has 2 training image\\(s\\), fewer than shots=3"),
    ("single_image", {}, "class 'class_6' has 1 image\\(s\\); need >= 2 to hold out a test image"),
    ("corrupt", {}, "unreadable image .*class_3/img_04.png"),
])
def test_bad_input_fails_cleanly(tmp_path: Path, what: str, overrides: dict, message: str) -> None:
    root = _make(tmp_path, what)
    out = tmp_path / "out" / "pack.h5"
    assert_prepare_fails(params(root, **overrides), out, message)
