"""miniImageNet (images/ + split csv files) + CEC index lists -> pack."""

from __future__ import annotations

import io
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
from PIL import Image

from pipeline.data.assemble import assemble
from pipeline.data.cec_splits import BENCHMARKS, read_cec_splits
from pipeline.data.mini_imagenet import read_mini_imagenet
from pipeline.data.pack import ImagePack
from stages.prepare import run
from tests.data_fixtures import (
    assert_prepare_fails,
    random_images,
    real_split_dir,
    tiny_jpeg_bytes,
    write_mini,
    write_split_files,
)

WNIDS = [f"n0100000{k}" for k in range(1, 7)]


def fname(c: int, k: int) -> str:
    return f"{WNIDS[c]}{k:08d}.jpg"


def jpeg(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def split_line(c: int, k: int) -> str:
    return f"MINI-ImageNet/train/{WNIDS[c]}/{fname(c, k)}"


def build_small(tmp_path: Path, size: tuple[int, int] = (12, 12), csv_dir: Path | None = None) -> dict:
    """6 classes x (4 train + 2 test); base = classes 0..3, session 2 = class 5, session 3 = class 4."""
    train = [(fname(c, k), WNIDS[c]) for c in range(6) for k in range(4)]
    test = [(fname(c, k), WNIDS[c]) for c in range(6) for k in range(4, 6)]
    pixels = random_images(36, size[1], size[0], seed=3)
    images = {f: jpeg(pixels[i]) for i, (f, _) in enumerate(train + test)}
    write_mini(tmp_path / "raw", train, test, images, csv_dir=csv_dir)
    write_split_files(tmp_path / "split", [[split_line(c, k) for c in range(4) for k in range(4)],
                                           [split_line(5, 0), split_line(5, 2)], [split_line(4, 1), split_line(4, 3)]])
    return {"dataset": "mini_imagenet", "root": str(tmp_path / "raw"), "split_dir": str(tmp_path / "split"),
            "base_classes": 4, "ways": 1, "shots": 2, "sessions": 2, "image_size": min(size)}


def decoded(root: Path, name: str) -> np.ndarray:
    return np.asarray(Image.open(root / "images" / name).convert("RGB"))


def test_pack_relabels_and_keeps_pixels(tmp_path: Path) -> None:
    params = build_small(tmp_path)
    summary = run(params, tmp_path / "pack.h5")
    assert summary["train_images_per_session"] == [16, 2, 2] and summary["test_images"] == 12
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        assert pack.class_names == WNIDS[:4] + [WNIDS[5], WNIDS[4]]
        p = pack.protocol
        assert [pack.source_keys[i] for i in p.sessions[1].train_ids] == [fname(5, 0), fname(5, 2)]
        assert [pack.source_keys[i] for i in p.sessions[2].train_ids] == [fname(4, 1), fname(4, 3)]
        assert pack.labels[p.sessions[2].train_ids].tolist() == [5, 5]
        for i in [0, 5, *p.sessions[1].train_ids, *p.test_ids[-3:]]:
            np.testing.assert_array_equal(pack.images[i], decoded(tmp_path / "raw", pack.source_keys[i]))
        test_names = [pack.source_keys[i] for i in p.test_ids]
        assert test_names[-2:] == [fname(4, 4), fname(4, 5)]  # class 4 is now the last class


def test_non_square_images_are_resized_then_centre_cropped(tmp_path: Path) -> None:
    params = build_small(tmp_path, size=(16, 12))
    run({**params, "image_size": 8}, tmp_path / "pack.h5")
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        img = Image.open(tmp_path / "raw" / "images" / pack.source_keys[3]).convert("RGB")
        expected = np.asarray(img.resize((11, 8), Image.Resampling.BILINEAR).crop((1, 0, 9, 8)))
        np.testing.assert_array_equal(pack.images[3], expected)


def test_csv_files_fall_back_to_the_split_folder(tmp_path: Path) -> None:
    params = build_small(tmp_path, csv_dir=tmp_path / "split")
    assert not (tmp_path / "raw" / "split").exists()
    assert run(params, tmp_path / "pack.h5")["classes"] == 6


def _break(tmp_path: Path, what: str) -> None:
    raw, split = tmp_path / "raw", tmp_path / "split"
    if what == "no_images_dir":
        for f in (raw / "images").iterdir():
            f.unlink()
        (raw / "images").rmdir()
    elif what == "no_csv":
        for f in (raw / "split").iterdir():
            f.unlink()
    elif what == "header":
        text = (raw / "split" / "train.csv").read_text()
        (raw / "split" / "train.csv").write_text(text.replace("filename,label", "file,wnid", 1))
    elif what == "bad_row":
        with open(raw / "split" / "test.csv", "a") as f:
            f.write("lonely.jpg\n")
    elif what == "unknown_in_split":
        (split / "session_2.txt").write_text(f"{split_line(5, 0)}\nMINI-ImageNet/train/n01000006/nope.jpg\n")
    elif what == "file_gone":
        (raw / "images" / fname(5, 2)).unlink()
    elif what == "corrupt":
        (raw / "images" / fname(2, 5)).write_bytes(b"\xff\xd8\xff garbage")
    elif what == "test_file_gone":
        (raw / "images" / fname(1, 4)).unlink()
    elif what == "no_test_images":
        lines = (raw / "split" / "test.csv").read_text().splitlines()
        (raw / "split" / "test.csv").write_text("\n".join(x for x in lines if WNIDS[4] not in x) + "\n")
    elif what == "two_classes_in_session":
        (split / "session_2.txt").write_text(f"{split_line(5, 0)}\n{split_line(4, 0)}\n")


@pytest.mark.parametrize(("what", "message"), [
    ("no_images_dir", "missing miniImageNet images directory .*raw/images"),
    ("no_csv", "missing miniImageNet split/train.csv and split/test.csv under .*raw"),
    ("header", "train.csv line 1: expected the header 'filename,label'"),
    ("bad_row", "test.csv line 14: expected 'filename,label', got 'lonely.jpg'"),
    ("unknown_in_split", "session_2.txt line 2: references missing image 'MINI-ImageNet/train/n01000006/nope.jpg'"),
    ("file_gone", f"session_2.txt line 2: references missing image file .*images/{fname(5, 2)}"),
    ("corrupt", f"unreadable image .*images/{fname(2, 5)}"),
    ("test_file_gone", f"missing image file .*images/{fname(1, 4)}"),
    ("no_test_images", f"class 5 \\('{WNIDS[4]}'\\) has no test images"),
    ("two_classes_in_session", "session_2.txt: 2 classes, expected 1"),
])
def test_bad_input_fails_cleanly(tmp_path: Path, what: str, message: str) -> None:
    params = build_small(tmp_path)
    _break(tmp_path, what)
    out = tmp_path / "pack.h5"
    assert_prepare_fails(params, out, message)


def test_real_cec_lists_give_60_plus_8x5x5(tmp_path: Path) -> None:
    split = real_split_dir("mini_imagenet")
    sessions = [(split / f"session_{t}.txt").read_text().split() for t in range(1, 10)]
    rows = sorted((PurePosixPath(line).name, PurePosixPath(line).parent.name) for s in sessions for line in s)
    rows.sort(key=lambda r: r[1])  # wnid-sorted, like the real train.csv
    wnids = list(dict.fromkeys(w for _, w in rows))
    test = [(f"{w}-test.jpg", w) for w in wnids]
    write_mini(tmp_path / "raw", rows, test, {f: tiny_jpeg_bytes((k % 256, 0, 0)) for k, (f, _) in enumerate(test)})
    # parse, validate and lay out the pack without decoding 30000 images (the small tests cover writing)
    source = read_mini_imagenet(tmp_path / "raw", split)
    train_sessions, digests = read_cec_splits(split, source, BENCHMARKS["mini_imagenet"])
    content = assemble(source, train_sessions, 8, "mini_imagenet", {}, ways=5, shots=5)
    p = content.protocol
    assert [len(s.train_ids) for s in p.sessions] == [30000] + [25] * 8
    assert (p.num_classes, p.num_base_classes, p.ways, p.shots) == (100, 60, 5, 5)
    session_wnids = [sorted({PurePosixPath(line).parent.name for line in s}) for s in sessions]
    assert content.class_names == [w for s in session_wnids for w in s]
    assert len(p.test_ids_seen(8, content.labels)) == 100 and len(digests) == 9
    assert next(iter(content.images)).shape == (512, 8, 8, 3)
