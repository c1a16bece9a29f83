"""Fake datasets in the real on-disk formats, for the data tests (tiny images, written into tmp_path)."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SPLITS = SHARED / "splits" / "cec-index-list"
OMNIGLOT_SMALL1 = SHARED / "data" / "omniglot" / "images_background_small1.zip"


def require_shared(path: Path, what: str) -> Path:
    """`path` from ../shared; skipped where it is absent, except under CI (CI=true), where ../shared is always
    beside the clone, so a missing file fails the test instead of silently skipping it."""
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"shared {what} not found at {path} (CI runs with ../shared beside the clone)")
        pytest.skip(f"shared {what} not found at {path}")
    return path


def real_split_dir(name: str) -> Path:
    """The shared CEC index lists for `name`, or skip the test when they are not available."""
    return require_shared(SPLITS / name / "session_1.txt", "split files").parent


def omniglot_small1() -> Path:
    """The shared Omniglot background_small1 zip, or skip the test when it is not available."""
    return require_shared(OMNIGLOT_SMALL1, "Omniglot zip")


def random_images(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, height, width, 3), dtype=np.uint8)


def write_image(path: Path, pixels: np.ndarray, fmt: str = "PNG") -> None:
    """Write pixels; the format is chosen by `fmt`, not the file name (PNG keeps pixels exact)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format=fmt)


def tiny_jpeg_bytes(colour: tuple[int, int, int] = (90, 120, 150), size: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="JPEG")
    return buf.getvalue()


# ---- CIFAR-100 (python version) ------------------------------------------------------------------------
def write_cifar(root: Path, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                names: list[str]) -> Path:
    """cifar-100-python/{train,test,meta} pickles with bytes keys and channel-planar rows, like the official ones."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        rows = x.transpose(0, 3, 1, 2).reshape(len(x), -1)
        obj = {b"filenames": [f"{i}.png".encode() for i in range(len(x))], b"fine_labels": [int(v) for v in y],
               b"coarse_labels": [0] * len(y), b"data": rows}
        (folder / name).write_bytes(pickle.dumps(obj, protocol=2))
    meta = {b"fine_label_names": [n.encode() for n in names], b"coarse_label_names": [b"all"]}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    return root


def write_split_files(split_dir: Path, sessions: list[list[str]]) -> Path:
    split_dir.mkdir(parents=True, exist_ok=True)
    for t, lines in enumerate(sessions, start=1):
        (split_dir / f"session_{t}.txt").write_text("".join(f"{line}\n" for line in lines))
    return split_dir


# ---- miniImageNet --------------------------------------------------------------------------------------
def write_mini(root: Path, train_rows: list[tuple[str, str]], test_rows: list[tuple[str, str]],
               images: dict[str, bytes | np.ndarray] | None = None, csv_dir: Path | None = None) -> Path:
    """images/<file> plus split/{train,test}.csv (or csv_dir); `images` maps file name -> bytes or pixels."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    csv_dir = csv_dir or root / "split"
    csv_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.csv", train_rows), ("test.csv", test_rows)):
        (csv_dir / name).write_text("filename,label\n" + "".join(f"{f},{w}\n" for f, w in rows))
    default = tiny_jpeg_bytes()
    for filename, _ in train_rows + test_rows:
        content = (images or {}).get(filename, default)
        if isinstance(content, bytes):
            (root / "images" / filename).write_bytes(content)
        else:
            write_image(root / "images" / filename, content)
    return root


# ---- CUB-200-2011 --------------------------------------------------------------------------------------
def write_cub(root: Path, entries: list[tuple[str, int, bool]], classes: dict[int, str],
              images: dict[str, bytes | np.ndarray] | None = None) -> Path:
    """CUB_200_2011/ with images/<rel>, images.txt, train_test_split.txt, image_class_labels.txt, classes.txt.

    entries: (path relative to images/, 1-based class id, is_train) in image-id order.
    """
    cub = root / "CUB_200_2011"
    (cub / "images").mkdir(parents=True, exist_ok=True)
    (cub / "classes.txt").write_text("".join(f"{c} {n}\n" for c, n in sorted(classes.items())))
    (cub / "images.txt").write_text("".join(f"{i} {rel}\n" for i, (rel, _, _) in enumerate(entries, 1)))
    (cub / "image_class_labels.txt").write_text("".join(f"{i} {c}\n" for i, (_, c, _) in enumerate(entries, 1)))
    (cub / "train_test_split.txt").write_text("".join(f"{i} {int(t)}\n" for i, (_, _, t) in enumerate(entries, 1)))
    default = tiny_jpeg_bytes()
    for rel, _, _ in entries:
        content = (images or {}).get(rel, default)
        path = cub / "images" / rel
        if isinstance(content, bytes):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        else:
            write_image(path, content)
    return cub


# ---- class folders -------------------------------------------------------------------------------------
def write_class_folder(root: Path, counts: dict[str, int], size: tuple[int, int] = (10, 8), seed: int = 0
                       ) -> dict[str, np.ndarray]:
    """root/<class name (may contain '/')>/img_k.png with random pixels; returns {relative path: pixels}."""
    rng = np.random.default_rng(seed)
    written = {}
    for name, n in counts.items():
        for k in range(n):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            rel = f"{name}/img_{k:02d}.png"
            write_image(root / rel, pixels)
            written[rel] = pixels
    return written


def assert_prepare_fails(data_params: dict, out: Path, message: str) -> None:
    """The prepare stage rejects `data_params` with a one-line FSCILError matching `message`, both from the
    library and from `fscil stage prepare` (exit code 2), and leaves no pack (nor a temporary) at `out`."""
    import re

    import yaml

    from pipeline.errors import FSCILError
    from stages.prepare import run
    from tests.pipeline_fixtures import cli

    with pytest.raises(FSCILError, match=message) as err:
        run(data_params, out)
    assert "\n" not in str(err.value)
    import tempfile

    params = Path(tempfile.mkdtemp()) / "params.yaml"
    # a base batch the tiny data can fill: prepare checks the whole config against the protocol before the images
    params.write_text(yaml.safe_dump({"preset": "synthetic", "base": {"batch_size": 2},
                                      "data": {"image_size": None, **data_params}}))
    result = cli("stage", "prepare", "--params", str(params), "--data-dir", str(out.parent))
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 1 and re.search(message, errors[0]), result.output
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))
