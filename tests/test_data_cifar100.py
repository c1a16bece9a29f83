"""CIFAR-100 (python pickles) + CEC index lists -> pack: relabelling, membership, exact pixels, bad inputs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError
from stages.prepare import run
from tests.data_fixtures import assert_prepare_fails, random_images, real_split_dir, write_cifar, write_split_files

NAMES = [f"c{k}" for k in range(10)]
TRAIN_Y = np.repeat(np.arange(10), 6)  # indices 6c..6c+5 are class c
TEST_Y = np.repeat(np.arange(10), 3)
TRAIN_X = random_images(60, 8, 8, seed=1)
TEST_X = random_images(30, 8, 8, seed=2)
# base = classes 0..5; session 2 introduces classes 8 and 9, session 3 classes 6 and 7
SESSIONS = [[str(i) for i in range(36)], ["48", "50", "54", "55"], ["37", "39", "42", "43"]]


def small_params(tmp_path: Path, **overrides) -> dict:
    params = {"dataset": "cifar100", "root": str(tmp_path / "raw"), "split_dir": str(tmp_path / "split"),
              "base_classes": 6, "ways": 2, "shots": 2, "sessions": 2, "verify_checksums": False,
              "image_size": 8}
    return {**params, **overrides}


@pytest.fixture
def small(tmp_path: Path) -> dict:
    write_cifar(tmp_path / "raw", TRAIN_X, TRAIN_Y, TEST_X, TEST_Y, NAMES)
    write_split_files(tmp_path / "split", SESSIONS)
    return small_params(tmp_path)


def test_pack_relabels_in_session_order_with_exact_pixels(small: dict, tmp_path: Path) -> None:
    summary = run(small, tmp_path / "pack.h5")
    assert summary["train_images_per_session"] == [36, 4, 4] and summary["test_images"] == 30
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        assert pack.class_names == ["c0", "c1", "c2", "c3", "c4", "c5", "c8", "c9", "c6", "c7"]
        p = pack.protocol
        assert [s.classes.tolist() for s in p.sessions] == [[0, 1, 2, 3, 4, 5], [6, 7], [8, 9]]
        old_of_new = np.array([0, 1, 2, 3, 4, 5, 8, 9, 6, 7])
        # session 2 of the split files (indices 48, 50 of class 8; 54, 55 of class 9) is pack session 1
        s1 = p.sessions[1].train_ids
        np.testing.assert_array_equal(pack.labels[s1], [6, 6, 7, 7])
        np.testing.assert_array_equal(pack.read_images(s1), TRAIN_X[[48, 50, 54, 55]])
        np.testing.assert_array_equal(pack.read_images(p.sessions[2].train_ids), TRAIN_X[[37, 39, 42, 43]])
        base = p.sessions[0].train_ids
        np.testing.assert_array_equal(pack.read_images(base), TRAIN_X[:36])
        np.testing.assert_array_equal(old_of_new[pack.labels[base]], TRAIN_Y[:36])
        # the test set: every test image of the 10 classes, labels mapped to the new ids
        test = p.test_ids
        test_src = np.array([int(k.split("/")[1]) for k in np.array(pack.source_keys)[test]])
        np.testing.assert_array_equal(pack.read_images(test), TEST_X[test_src])
        np.testing.assert_array_equal(old_of_new[pack.labels[test]], TEST_Y[test_src])
        assert sorted(test_src.tolist()) == list(range(30))
        assert p.test_ids_seen(1, pack.labels).size == 24
        assert set(pack.provenance["files"]) == {"cifar-100-python/train", "cifar-100-python/test",
                                                 "cifar-100-python/meta"}
        assert set(pack.provenance["split_files"]) == {"split/session_1.txt", "split/session_2.txt",
                                                       "split/session_3.txt"}


def test_two_builds_are_identical(small: dict, tmp_path: Path) -> None:
    a, b = run(small, tmp_path / "a.h5"), run(small, tmp_path / "b.h5")
    assert a["content_hash"] == b["content_hash"]
    with ImagePack.open(tmp_path / "a.h5") as pa, ImagePack.open(tmp_path / "b.h5") as pb:
        np.testing.assert_array_equal(pa.images[:], pb.images[:])
        assert pa.protocol == pb.protocol


def test_user_checksums_replace_the_official_ones(small: dict, tmp_path: Path) -> None:
    folder = tmp_path / "raw" / "cifar-100-python"
    sums = {f"cifar-100-python/{n}": hashlib.md5((folder / n).read_bytes()).hexdigest() for n in ("train", "test",
                                                                                                 "meta")}
    summary = run({**small, "verify_checksums": True, "checksums": sums}, tmp_path / "pack.h5")
    assert summary["images"] == 36 + 4 + 4 + 30  # classes 6..9 keep only their 2 shots each


def _break(tmp_path: Path, what: str) -> None:
    raw, split = tmp_path / "raw" / "cifar-100-python", tmp_path / "split"
    if what == "no_root":
        for f in raw.iterdir():
            f.unlink()
        raw.rmdir()
    elif what == "no_meta":
        (raw / "meta").unlink()
    elif what == "corrupt":
        (raw / "train").write_bytes(b"\x80\x02garbage")
    elif what in ("index_range", "not_int", "overlap", "reintroduced", "shots"):
        lines = {"index_range": ["48", "999", "54", "55"], "not_int": ["48", "fifty", "54", "55"],
                 "overlap": ["48", "50", "54", "3"], "reintroduced": None, "shots": ["48", "50", "51", "55"]}[what]
        if lines is None:
            (split / "session_3.txt").write_text("37\n39\n42\n49\n")
        else:
            (split / "session_2.txt").write_text("\n".join(lines) + "\n")
    elif what == "missing_session":
        (split / "session_3.txt").unlink()
    elif what == "extra_session":
        (split / "session_4.txt").write_text("40\n")


@pytest.mark.parametrize(("what", "overrides", "message"), [
    ("no_root", {}, "missing CIFAR-100 directory .*raw/cifar-100-python"),
    ("no_meta", {}, "missing CIFAR-100 file .*cifar-100-python/meta"),
    ("corrupt", {}, "corrupt CIFAR-100 file .*cifar-100-python/train"),
    (None, {"verify_checksums": True},
     "checksum mismatch for .*cifar-100-python/meta: md5 [0-9a-f]{32}, expected 7973b15100ade9c7d40fb424638fde48"),
    ("user_sums", {"verify_checksums": True},
     "checksum mismatch for .*cifar-100-python/test: sha256 [0-9a-f]{64}, expected 0{64}"),
    ("index_range", {}, "session_2.txt line 2: references missing image '999'"),
    ("not_int", {}, "session_2.txt line 2: expected an integer train index, got 'fifty'"),
    ("overlap", {}, "session_2.txt line 4: '3' is already listed at session_1.txt line 4"),
    ("reintroduced", {}, "session_3.txt line 4: class 'c8' was already introduced by session_2.txt"),
    ("shots", {}, "session_2.txt: class 'c8' has 3 samples, expected 2"),
    ("missing_session", {}, "missing split file .*split/session_3.txt"),
    ("extra_session", {}, "split folder .*split has session_4.txt, expected session_1..3.txt"),
    (None, {"split_dir": "/nonexistent/split"}, "missing split directory /nonexistent/split"),
])
def test_bad_input_fails_cleanly(small: dict, tmp_path: Path, what: str | None, overrides: dict,
                                 message: str) -> None:
    if what and what != "user_sums":
        _break(tmp_path, what)
    if what == "user_sums":  # correct md5 sums for two files, a wrong sha256 for the third
        raw = tmp_path / "raw" / "cifar-100-python"
        sums = {f"cifar-100-python/{n}": hashlib.md5((raw / n).read_bytes()).hexdigest() for n in ("train", "meta")}
        overrides = {**overrides, "checksums": {**sums, "cifar-100-python/test": "0" * 64}}
    out = tmp_path / "out" / "pack.h5"
    assert_prepare_fails({**small, **overrides}, out, message)


# ---- the real CEC index lists ---------------------------------------------------------------------------
def _fake_cifar_for_real_splits(tmp_path: Path, swap: bool = False) -> tuple[Path, np.ndarray, list[list[int]]]:
    """50000 small train images whose labels agree with the real lists (500 per base class, 5 per novel)."""
    split = real_split_dir("cifar100")
    sessions = [[int(v) for v in (split / f"session_{t}.txt").read_text().split()] for t in range(1, 10)]
    labels = 60 + np.arange(50000) % 40  # indices the lists never use: any novel class
    labels[sessions[0]] = np.arange(30000) // 500
    for t, ids in enumerate(sessions[1:], start=2):
        first = 60 + 5 * (t - 2)
        if swap and t in (2, 3):
            first = 60 + 5 * (3 - t)  # sessions 2 and 3 trade their classes
        labels[ids] = first + np.arange(25) // 5
    x = random_images(50000, 8, 8, seed=5)
    write_cifar(tmp_path / "raw", x, labels, random_images(200, 8, 8, seed=6), np.repeat(np.arange(100), 2),
                [f"class{k:03d}" for k in range(100)])
    return split, x, sessions


def test_real_cec_lists_give_60_plus_8x5x5(tmp_path: Path) -> None:
    split, x, sessions = _fake_cifar_for_real_splits(tmp_path)
    params = {"dataset": "cifar100", "root": str(tmp_path / "raw"), "split_dir": str(split),
              "verify_checksums": False, "image_size": 8}
    summary = run(params, tmp_path / "pack.h5")
    assert summary["train_images_per_session"] == [30000] + [25] * 8
    assert (summary["classes"], summary["base_classes"], summary["ways"], summary["shots"]) == (100, 60, 5, 5)
    with ImagePack.open(tmp_path / "pack.h5") as pack:
        assert pack.class_names == [f"class{k:03d}" for k in range(100)]  # identity relabelling
        p = pack.protocol
        assert p.sessions[8].classes.tolist() == [95, 96, 97, 98, 99]
        ids = p.sessions[4].train_ids
        # session_5.txt: 5 lines per class; the pack holds them class by class, each class in index order
        expected = [i for c in range(5) for i in sorted(sessions[4][5 * c : 5 * c + 5])]
        np.testing.assert_array_equal(pack.read_images(ids), x[expected])
        assert len(p.test_ids_seen(0, pack.labels)) == 120


def test_real_cec_lists_check_cifar_class_ranges(tmp_path: Path) -> None:
    split, _, _ = _fake_cifar_for_real_splits(tmp_path, swap=True)
    params = {"dataset": "cifar100", "root": str(tmp_path / "raw"), "split_dir": str(split),
              "verify_checksums": False, "image_size": 8}
    with pytest.raises(FSCILError, match=r"session_2.txt line 1: class 65 is not one of this session's classes 60..64"):
        run(params, tmp_path / "pack.h5")
    assert not (tmp_path / "pack.h5").exists()
