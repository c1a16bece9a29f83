"""Omniglot: official-layout zips read in place, the same tree extracted, checksums, the CLI, the real small1 zip."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from pipeline.data.omniglot import OFFICIAL_DIGESTS, read_omniglot
from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError
from tests.data_fixtures import assert_prepare_fails, omniglot_small1
from tests.pipeline_fixtures import cli

SET = "images_background"
# 8 characters of 2 alphabets, 6 drawers each; written in a scrambled order so sorting is tested
TREE = {f"{a}/character{c:02d}": 6 for a in ("Greek", "Balinese") for c in (3, 1, 4, 2)}
SIDE = 10


def _png(pixels: np.ndarray) -> bytes:
    """A binary (mode "1") PNG like the official ones; `pixels` is (H, W) bool."""
    import io

    buf = io.BytesIO()
    Image.fromarray(pixels).convert("1").save(buf, format="PNG")
    return buf.getvalue()


def write_omniglot_zip(path: Path, tree: dict[str, int] = TREE, set_name: str = SET, seed: int = 0,
                       extra: dict[str, bytes] | None = None) -> dict[str, np.ndarray]:
    """`<set>/<alphabet>/<character>/<drawer>.png` members (with directory entries, as in the official zips);
    returns {member name: expected (H, W, 3) uint8 pixels, the grayscale replicated}."""
    rng = np.random.default_rng(seed)
    expected: dict[str, np.ndarray] = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{set_name}/", b"")
        for cls, n in tree.items():
            zf.writestr(f"{set_name}/{cls}/", b"")
            for k in (range(n - 1, -1, -1)):
                ink = rng.random((SIDE, SIDE)) < 0.3
                name = f"{set_name}/{cls}/{k + 1:04d}_{k + 1:02d}.png"
                zf.writestr(name, _png(~ink))  # white background (True), black strokes
                expected[name] = np.repeat((~ink).astype(np.uint8)[..., None] * 255, 3, axis=2)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return expected


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_zip(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "raw" / "my_omniglot.zip"
    return path, write_omniglot_zip(path)


# ---- the reader ----------------------------------------------------------------------------------------
def test_zip_class_names_labels_counts_and_pixels(fake_zip) -> None:
    path, expected = fake_zip
    source = read_omniglot(path)
    assert source.name == "omniglot" and source.archive == path
    assert source.class_names == sorted(TREE) and source.class_names[0] == "Balinese/character01"
    assert np.bincount(source.labels).tolist() == [6] * len(TREE) and source.is_train.all()
    assert sorted(source.keys) == sorted(expected)
    for i, key in enumerate(source.keys):
        parts = key.split("/")
        assert source.class_names[source.labels[i]] == f"{parts[1]}/{parts[2]}"
        img = source.load(i, SIDE)  # original size: exact pixels, no resize
        assert img.dtype == np.uint8 and img.shape == (SIDE, SIDE, 3)
        np.testing.assert_array_equal(img, expected[key])
    assert set(np.unique(np.stack([source.load(i, SIDE) for i in range(len(source))]))) == {0, 255}
    assert source.provenance["num_files"] == len(expected)
    assert source.provenance["checksums"] == {path.name: f"sha256:{sha256(path)}"}


@pytest.mark.parametrize("level", ["set", "parent"])
def test_extracted_folder_gives_the_same_classes_and_pixels(fake_zip, tmp_path: Path, level: str) -> None:
    path, expected = fake_zip
    with zipfile.ZipFile(path) as zf:
        zf.extractall(tmp_path / "extracted")
    root = tmp_path / "extracted" / SET if level == "set" else tmp_path / "extracted"
    from_zip, from_folder = read_omniglot(path), read_omniglot(root)
    assert from_folder.name == "omniglot" and from_folder.archive is None
    assert from_folder.class_names == from_zip.class_names == sorted(TREE)
    np.testing.assert_array_equal(from_folder.labels, from_zip.labels)
    for i in range(len(from_folder)):
        member = from_folder.paths[i].relative_to(tmp_path / "extracted").as_posix()
        assert from_zip.class_names[from_zip.labels[i]] == from_folder.class_names[from_folder.labels[i]]
        np.testing.assert_array_equal(from_folder.load(i, SIDE), expected[member])
        np.testing.assert_array_equal(from_folder.load(i, 8), from_zip.load(from_zip.keys.index(member), 8))


def test_folder_holding_one_official_zip_reads_it(tmp_path: Path) -> None:
    expected = write_omniglot_zip(tmp_path / "raw" / "images_background.zip")
    source = read_omniglot(tmp_path / "raw", verify_checksums=False)
    assert source.archive == tmp_path / "raw" / "images_background.zip"
    assert source.class_names == sorted(TREE) and sorted(source.keys) == sorted(expected)


# ---- checksums -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(OFFICIAL_DIGESTS))
def test_official_name_with_other_content_is_a_checksum_mismatch(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    write_omniglot_zip(path)
    algo = "md5" if len(OFFICIAL_DIGESTS[name]) == 32 else "sha256"
    with pytest.raises(FSCILError, match=f"checksum mismatch for .*{name}: {algo} .*expected "
                                         f"{OFFICIAL_DIGESTS[name]}") as err:
        read_omniglot(path)
    assert "\n" not in str(err.value)
    source = read_omniglot(path, verify_checksums=False)  # the user opted out: accepted, still recorded
    assert source.class_names == sorted(TREE)
    assert source.provenance["checksums"] == {name: f"sha256:{sha256(path)}"}


def test_user_checksum_of_an_unofficial_zip(fake_zip) -> None:
    path, _ = fake_zip
    md5 = hashlib.md5(path.read_bytes()).hexdigest()
    source = read_omniglot(path, checksums={path.name: md5.upper()})
    assert source.provenance["checksums"] == {path.name: f"md5:{md5}"}
    assert read_omniglot(path, checksums={path.name: sha256(path)}).provenance["checksums"] == \
        {path.name: f"sha256:{sha256(path)}"}
    with pytest.raises(FSCILError, match=f"checksum mismatch for .*{path.name}: sha256 {sha256(path)}, "
                                         f"expected {'0' * 64}"):
        read_omniglot(path, checksums={path.name: "0" * 64})
    read_omniglot(path, verify_checksums=False, checksums={path.name: "0" * 64})
    read_omniglot(path, checksums={"other.zip": "0" * 64})  # keyed by file name: not this archive


def test_user_checksum_on_top_of_the_official_one(tmp_path: Path) -> None:
    path = tmp_path / "images_background_small1.zip"
    write_omniglot_zip(path)
    with pytest.raises(FSCILError, match="checksum mismatch"):  # the official digest is still checked
        read_omniglot(path, checksums={path.name: sha256(path)})


def test_not_a_zip_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "omniglot.zip"
    path.write_bytes(b"PK\x03\x04 this is not\n a zip archive")
    with pytest.raises(FSCILError, match="omniglot.zip: not a readable zip file") as err:
        read_omniglot(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("member", ["images_background/Greek/character01/sub/0001_01.png",
                                    "images_background/Greek/0001_01.png", "loose.png"])
def test_member_at_the_wrong_depth_is_named(tmp_path: Path, member: str) -> None:
    path = tmp_path / "omniglot.zip"
    write_omniglot_zip(path, extra={member: _png(np.ones((SIDE, SIDE), bool))})
    with pytest.raises(FSCILError, match=f"member '{member}' is not <set>/<alphabet>/<character>/<image>.png") \
            as err:
        read_omniglot(path)
    assert "\n" not in str(err.value)


def test_zip_without_images(tmp_path: Path) -> None:
    path = tmp_path / "omniglot.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("images_background/README.txt", b"nothing here")
    with pytest.raises(FSCILError, match="omniglot.zip: no PNG images inside"):
        read_omniglot(path)


def test_folder_at_the_wrong_level(fake_zip, tmp_path: Path) -> None:
    path, _ = fake_zip
    with zipfile.ZipFile(path) as zf:
        zf.extractall(tmp_path / "extracted")
    with pytest.raises(FSCILError, match="class folder 'extracted/images_background/Balinese/character01' is not "
                                         "<alphabet>/<character>"):
        read_omniglot(tmp_path)  # holds raw/ and extracted/: two levels too many


# ---- the prepare stage through the CLI -----------------------------------------------------------------
def _cli_params(tmp_path: Path, root: Path, **data) -> Path:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "preset": "omniglot", "device": "cpu", "base": {"batch_size": 8},  # prepare checks it against the data
        "data": {"root": str(root), "base_classes": 4, "ways": 2, "shots": 2, "sessions": 2, "image_size": SIDE,
                 **data}}))
    return params


def _prepare(params: Path, data_dir: Path) -> dict:
    result = cli("stage", "prepare", "--params", str(params), "--data-dir", str(data_dir))
    assert result.exit_code == 0, result.output
    return json.loads(next(line for line in result.output.splitlines() if line.startswith("{")))


def test_cli_prepare_builds_a_seeded_pack(fake_zip, tmp_path: Path) -> None:
    path, expected = fake_zip
    params = _cli_params(tmp_path, path)
    first = _prepare(params, tmp_path / "a")
    assert first["dataset"] == "omniglot"
    with ImagePack.open(tmp_path / "a" / "pack.h5") as pack:
        p = pack.protocol
        assert (pack.dataset, pack.preset, pack.image_size) == ("omniglot", "omniglot", SIDE)
        assert p.num_base_classes == 4 and p.num_incremental == 2 and (p.ways, p.shots) == (2, 2)
        assert [len(s.classes) for s in p.sessions] == [4, 2, 2]
        # test_fraction 0.25 from the preset: round(0.25 * 6) = 2 test images per class, 4 training
        assert [len(s.train_ids) for s in p.sessions] == [16, 4, 4] and len(p.test_ids) == 16
        assert sorted(pack.class_names) == sorted(TREE)
        keys = pack.source_keys
        for i in range(len(pack)):
            np.testing.assert_array_equal(pack.images[i], expected[keys[i]])
            parts = keys[i].split("/")
            assert pack.class_names[pack.labels[i]] == f"{parts[1]}/{parts[2]}"
        assert pack.provenance["protocol"]["generator"] == "class_folder"
        assert pack.provenance["protocol"]["test_fraction"] == 0.25
        assert pack.provenance["checksums"] == {path.name: f"sha256:{sha256(path)}"}
    second = _prepare(params, tmp_path / "b")
    assert first["content_hash"] == second["content_hash"]
    other_seed = _prepare(_cli_params(tmp_path, path, seed=1), tmp_path / "c")
    assert other_seed["content_hash"] != first["content_hash"]


def _bad_root(tmp_path: Path, what: str) -> Path:
    if what == "missing":
        return tmp_path / "nowhere.zip"
    path = tmp_path / "raw" / "omniglot.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    if what == "not_zip":
        path.write_text("not a zip\n")
    elif what == "deep_member":
        write_omniglot_zip(path, extra={f"{SET}/Greek/character01/x/0001_01.png": _png(np.ones((4, 4), bool))})
    elif what == "official_mismatch":
        path = path.with_name("images_background_small1.zip")
        write_omniglot_zip(path)
    elif what == "corrupt_png":  # in a ninth character that sorts first: a base class, all its images packed
        write_omniglot_zip(path, extra={f"{SET}/Balinese/character00/0001_01.png": b"\x89PNG broken"} |
                           {f"{SET}/Balinese/character00/{k:04d}_01.png": _png(np.ones((SIDE, SIDE), bool))
                            for k in range(2, 7)})
    elif what == "empty_dir":
        path = tmp_path / "raw" / "empty"
        path.mkdir()
    return path


@pytest.mark.parametrize(("what", "overrides", "message"), [
    ("missing", {}, "missing Omniglot data .*nowhere.zip"),
    ("not_zip", {}, "omniglot.zip: not a readable zip file"),
    ("deep_member", {}, "member 'images_background/Greek/character01/x/0001_01.png' is not"),
    ("official_mismatch", {}, "checksum mismatch for .*images_background_small1.zip: sha256"),
    ("corrupt_png", {"base_classes": 5, "shuffle_classes": False},
     "unreadable image .*omniglot.zip:images_background/Balinese/character00/0001_01.png"),
    ("empty_dir", {}, "no images found under .*raw/empty"),
])
def test_bad_root_fails_cleanly(tmp_path: Path, what: str, overrides: dict, message: str) -> None:
    root = _bad_root(tmp_path, what)
    data = {"dataset": "omniglot", "root": str(root), "base_classes": 4, "ways": 2, "shots": 2, "sessions": 2,
            "test_fraction": 0.25, "image_size": SIDE, **overrides}
    assert_prepare_fails(data, tmp_path / "out" / "pack.h5", message)


def test_protocol_too_large_for_the_characters(fake_zip, tmp_path: Path) -> None:
    path, _ = fake_zip
    data = {"dataset": "omniglot", "root": str(path), "base_classes": 60, "ways": 5, "shots": 5, "sessions": 8,
            "image_size": SIDE}
    assert_prepare_fails(data, tmp_path / "out" / "pack.h5", "the protocol needs 100 classes")


# ---- the real background_small1 zip --------------------------------------------------------------------
@pytest.fixture
def small1() -> Path:
    return omniglot_small1()


def test_real_small1_verifies_and_counts(small1: Path) -> None:
    source = read_omniglot(small1)
    want = OFFICIAL_DIGESTS["images_background_small1.zip"]
    assert source.provenance["checksums"] == {small1.name: f"sha256:{want}"}
    assert len(source.class_names) == 136 and np.bincount(source.labels).tolist() == [20] * 136
    assert {n.split("/")[0] for n in source.class_names} == {"Balinese", "Early_Aramaic", "Greek", "Korean", "Latin"}
    img = source.load(0, 105)
    assert img.shape == (105, 105, 3) and set(np.unique(img)) == {0, 255}
    assert (img[..., 0] == img[..., 1]).all() and (img[..., 1] == img[..., 2]).all()


def test_real_small1_default_protocol_pack(small1: Path, tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"preset": "omniglot", "device": "cpu", "data": {"root": str(small1)}}))
    summary = _prepare(params, tmp_path / "data")
    assert summary["dataset"] == "omniglot"
    with ImagePack.open(tmp_path / "data" / "pack.h5") as pack:
        p = pack.protocol
        assert pack.image_size == 32 and len(pack.class_names) == 100
        assert [len(s.classes) for s in p.sessions] == [60] + [5] * 8 and (p.ways, p.shots) == (5, 5)
        # test_fraction 0.25 (the preset's): 5 of each character's 20 images are test images
        assert [len(s.train_ids) for s in p.sessions] == [60 * 15] + [25] * 8 and len(p.test_ids) == 100 * 5
        assert pack.provenance["protocol"] == {"generator": "class_folder", "seed": 0, "base_classes": 60,
                                               "ways": 5, "shots": 5, "sessions": 8, "test_fraction": 0.25,
                                               "shuffle_classes": True}
        assert pack.provenance["checksums"] == \
            {small1.name: f"sha256:{OFFICIAL_DIGESTS['images_background_small1.zip']}"}
        images = pack.read_images(np.arange(0, len(pack), 97))
        assert images.shape[1:] == (32, 32, 3) and images.dtype == np.uint8
