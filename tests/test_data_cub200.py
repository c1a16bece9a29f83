"""CUB-200-2011 (images/ + four index files) + CEC index lists -> pack."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data.assemble import assemble
from pipeline.data.cec_splits import BENCHMARKS, read_cec_splits
from pipeline.data.cub200 import read_cub200
from pipeline.data.pack import ImagePack
from stages.prepare import run
from tests.data_fixtures import assert_prepare_fails, random_images, real_split_dir, write_cub, write_split_files

CLASSES = {1: "001.Aaa", 2: "002.Bbb", 3: "003.Ccc", 4: "004.Ddd", 5: "005.Eee"}


def rel(c: int, k: int) -> str:
    return f"{CLASSES[c]}/{CLASSES[c][4:]}_{k:04d}_{100 + k}.jpg"


def line(c: int, k: int) -> str:
    return f"CUB_200_2011/images/{rel(c, k)}"


def build_small(tmp_path: Path) -> dict:
    """5 classes x (4 train + 2 test) of 20x14 JPEGs; base = classes 1..3, session 2 = class 5, session 3 = class 4."""
    entries = [(rel(c, k), c, k < 4) for c in CLASSES for k in range(6)]
    pixels = random_images(len(entries), 14, 20, seed=4)
    images = {}
    for (r, _, _), px in zip(entries, pixels, strict=True):
        buf = io.BytesIO()
        Image.fromarray(px).save(buf, format="JPEG")
        images[r] = buf.getvalue()
    write_cub(tmp_path / "raw", entries, CLASSES, images)
    write_split_files(tmp_path / "split", [[line(c, k) for c in (1, 2, 3) for k in range(4)],
                                           [line(5, 1), line(5, 3)], [line(4, 0), line(4, 2)]])
    return {"dataset": "cub200", "root": str(tmp_path / "raw"), "split_dir": str(tmp_path / "split"),
            "base_classes": 3, "ways": 1, "shots": 2, "sessions": 2, "image_size": 8}


def test_pack_relabels_resizes_and_crops(tmp_path: Path) -> None:
    summary = run(build_small(tmp_path), tmp_path / "pack.h5")
    assert summary["train_images_per_session"] == [12, 2, 2] and summary["test_images"] == 10
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        assert pack.class_names == ["001.Aaa", "002.Bbb", "003.Ccc", "005.Eee", "004.Ddd"]
        p = pack.protocol
        assert [pack.source_keys[i] for i in p.sessions[1].train_ids] == [rel(5, 1), rel(5, 3)]
        test_keys = [pack.source_keys[i] for i in p.test_ids]
        assert test_keys[:2] == [rel(1, 4), rel(1, 5)] and test_keys[-2:] == [rel(4, 4), rel(4, 5)]
        assert pack.labels[p.test_ids].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        # the whole image: at image_size 8 the test resize is 9, so 20 x 14 -> 12 x 9 (the longer side truncated),
        # at the top-left of an 18 x 18 canvas, its extent (9, 12)
        assert pack.canvas == 18 and pack.images.shape[1:] == (18, 18, 3)
        for i in (0, int(p.sessions[2].train_ids[1]), int(p.test_ids[-1])):
            img = Image.open(tmp_path / "raw" / "CUB_200_2011" / "images" / pack.source_keys[i]).convert("RGB")
            expected = np.zeros((18, 18, 3), dtype=np.uint8)
            expected[:9, :12] = np.asarray(img.resize((12, 9), Image.Resampling.BILINEAR))
            np.testing.assert_array_equal(pack.images[i], expected)
            assert pack.extents[i].tolist() == [9, 12]
        assert set(pack.provenance["files"]) == {"images.txt", "train_test_split.txt", "image_class_labels.txt",
                                                 "classes.txt"}


def test_build_is_deterministic(tmp_path: Path) -> None:
    params = build_small(tmp_path)
    assert run(params, tmp_path / "a.h5")["content_hash"] == run(params, tmp_path / "b.h5")["content_hash"]


def _break(tmp_path: Path, what: str) -> dict:
    cub, split = tmp_path / "raw" / "CUB_200_2011", tmp_path / "split"
    extra: dict = {}
    if what == "no_classes":
        (cub / "classes.txt").unlink()
    elif what == "malformed":
        text = (cub / "images.txt").read_text().splitlines()
        text[2] = "three " + text[2].split()[1]
        (cub / "images.txt").write_text("\n".join(text) + "\n")
    elif what == "no_split_entry":
        lines = (cub / "train_test_split.txt").read_text().splitlines()
        (cub / "train_test_split.txt").write_text("\n".join(x for x in lines if not x.startswith("5 ")) + "\n")
    elif what == "unknown_class":
        lines = (cub / "image_class_labels.txt").read_text().splitlines()
        lines[1] = "2 9"
        (cub / "image_class_labels.txt").write_text("\n".join(lines) + "\n")
    elif what == "test_image_in_split":
        (split / "session_2.txt").write_text(f"{line(5, 1)}\n{line(5, 4)}\n")
    elif what == "no_test_images":
        lines = (cub / "train_test_split.txt").read_text().splitlines()  # ids 19..24 are class 4
        (cub / "train_test_split.txt").write_text("\n".join(f"{x.split()[0]} 1" if 23 <= int(x.split()[0]) <= 24
                                                            else x for x in lines) + "\n")
    elif what == "checksum":
        extra = {"checksums": {"images.txt": "ab" * 32}}
    elif what == "overlap":
        (split / "session_3.txt").write_text(f"{line(4, 0)}\n{line(1, 2)}\n")
    return extra


@pytest.mark.parametrize(("what", "message"), [
    ("no_classes", "missing CUB classes.txt file .*CUB_200_2011/classes.txt"),
    ("malformed", "images.txt line 3: expected '<id> <value>', got 'three "),
    ("no_split_entry", "train_test_split.txt: no entry for image id 5 \\(images.txt line 5\\)"),
    ("unknown_class", "image_class_labels.txt line 2: unexpected value '9'"),
    ("test_image_in_split", f"session_2.txt line 2: references missing image '{line(5, 4)}'"),
    ("no_test_images", "class 4 \\('004.Ddd'\\) has no test images"),
    ("checksum", "checksum mismatch for .*CUB_200_2011/images.txt: sha256 [0-9a-f]{64}, expected (ab){32}"),
    ("overlap", f"session_3.txt line 2: '{line(1, 2)}' is already listed at session_1.txt line 3"),
])
def test_bad_input_fails_cleanly(tmp_path: Path, what: str, message: str) -> None:
    params = build_small(tmp_path)
    params.update(_break(tmp_path, what))
    out = tmp_path / "pack.h5"
    assert_prepare_fails(params, out, message)


def test_real_cec_lists_give_100_plus_10x10x5(tmp_path: Path) -> None:
    split = real_split_dir("cub200")
    sessions = [(split / f"session_{t}.txt").read_text().split() for t in range(1, 12)]
    train = [x.split("images/", 1)[1] for s in sessions for x in s]
    folders = sorted({r.split("/")[0] for r in train})
    classes = {int(f[:3]): f for f in folders}
    entries = [(r, int(r[:3]), True) for r in train] + [(f"{f}/test_{f[4:]}.jpg", int(f[:3]), False) for f in folders]
    write_cub(tmp_path / "raw", entries, classes)
    # parse, validate and lay out the pack without decoding the 3500 images (the small tests cover writing)
    source = read_cub200(tmp_path / "raw")
    train_sessions, digests = read_cec_splits(split, source, BENCHMARKS["cub200"])
    content = assemble(source, train_sessions, 8, "cub200", {}, ways=10, shots=5)
    p = content.protocol
    assert [len(s.train_ids) for s in p.sessions] == [3000] + [50] * 10
    assert (p.num_classes, p.num_base_classes, p.ways, p.shots) == (200, 100, 10, 5)
    assert content.class_names == folders and content.class_names[100].startswith("101.")
    assert len(p.test_ids_seen(0, content.labels)) == 100 and len(digests) == 11


def test_the_stored_test_view_is_resize_256_and_centre_crop_224_of_the_original(tmp_path: Path) -> None:
    """What the authors' CUB pipeline shows the network at test time (Resize(256) + CenterCrop(224) of the original
    file), against our pack's whole-image view and `test_transform`; a train crop comes from the whole image."""
    import torch
    import torchvision.transforms as T

    from pipeline.data.augment import pack_batch, test_transform, train_augment
    from pipeline.data.presets import get_preset

    sizes = {(c, k): ((300, 220), (200, 330), (260, 260), (700, 240))[(c + k) % 4] for c in CLASSES for k in range(6)}
    entries = [(rel(c, k), c, k < 4) for c in CLASSES for k in range(6)]
    gen = np.random.default_rng(0)
    images = {}
    for r, c, _ in entries:
        k = int(r.split("_")[-2])
        w, h = sizes[(c, k)]
        buf = io.BytesIO()
        smooth = np.asarray(Image.fromarray(gen.integers(0, 256, (h // 10, w // 10, 3), dtype=np.uint8)).resize((w, h)))
        Image.fromarray(smooth).save(buf, format="PNG")
        images[r] = buf.getvalue()
    write_cub(tmp_path / "raw", entries, CLASSES, images)
    write_split_files(tmp_path / "split", [[line(c, k) for c in (1, 2, 3) for k in range(4)],
                                           [line(5, 1), line(5, 3)], [line(4, 0), line(4, 2)]])
    params = {"dataset": "cub200", "root": str(tmp_path / "raw"), "split_dir": str(tmp_path / "split"),
              "base_classes": 3, "ways": 1, "shots": 2, "sessions": 2, "image_size": 224}
    run(params, tmp_path / "pack.h5")
    preset = get_preset("cub200")
    reference = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(preset.mean, preset.std)])
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        ids = np.arange(len(pack))
        x, extents = pack_batch(pack, ids, torch.device("cpu"))
        ours = test_transform(x, preset, extents)
        for i in ids:
            original = Image.open(tmp_path / "raw" / "CUB_200_2011" / "images" / pack.source_keys[i]).convert("RGB")
            want = reference(original)
            # one uint8 step after normalisation at most (the same PIL resize; ToTensor and ours divide alike)
            assert (ours[i] - want).abs().max().item() < 1e-5, pack.source_keys[i]
        # 700 x 240 keeps 512 of its 746 columns (the canvas), the centre: its test view is unchanged
        assert sorted({tuple(e) for e in pack.extents.tolist()}) == [(256, 256), (256, 349), (256, 512), (422, 256)]
        crops = train_augment(x, preset, torch.Generator().manual_seed(0), extents)
        assert crops.shape == (len(ids), 3, 224, 224) and torch.isfinite(crops).all()
