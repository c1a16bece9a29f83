"""Omniglot (Lake, Salakhutdinov and Tenenbaum, Science 2015): handwritten characters of 50 alphabets.

The official distribution is a set of zip files, each holding `<set>/<alphabet>/<character>/<drawer>.png`
(105 x 105 binary images, 20 drawers per character):

    images_background.zip          30 alphabets, 964 characters
    images_evaluation.zip          20 alphabets, 659 characters
    images_background_small1.zip    5 alphabets, 136 characters
    images_background_small2.zip    5 alphabets, 112 characters

`data.root` is one of those zips (read in place, never extracted) or an extracted folder (`<set>/` itself, or a
folder holding it). A class is one character, named `<alphabet>/<character>`; classes are sorted by name. The
zips with a published digest are checked against it (and any zip against `data.checksums` keyed by its file
name); nothing is ever downloaded. Images are decoded as grayscale replicated to 3 channels. There is no official
FSCIL split: the protocol is drawn from the seed like a class-folder dataset's (`seeded_protocol`).
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import numpy as np

from pipeline.data.builders import seeded_pack
from pipeline.data.checksums import digest_algorithm, mismatch
from pipeline.data.class_folder import read_class_folder
from pipeline.data.source import SourceDataset
from pipeline.errors import FSCILError
from pipeline.file_digest import file_digest

# published digests of the official zips (md5 as listed by the common loaders; sha256 of small1 as distributed)
OFFICIAL_DIGESTS: dict[str, str] = {
    "images_background.zip": "68d2efa1b9178cc56df9314c21c6e718",
    "images_evaluation.zip": "6b91aef0f799c5bb55b94e3f2daec811",
    "images_background_small1.zip": "f38eb80f801274ac2b4dff5b24289016bfaba4a7d5bb50deebf27104ad6cb8a4",
}


def _check_archive(path: Path, extra: Mapping[str, str] | None, verify: bool) -> dict[str, str]:
    """Check the zip against its published digest (and `extra[name]`); returns {name: "algo:digest"}."""
    wanted = [d for d in (OFFICIAL_DIGESTS.get(path.name), (extra or {}).get(path.name)) if d]
    out = {path.name: f"sha256:{file_digest(path, 'sha256')}"}
    if not verify:
        return out
    for want in wanted:
        algo = digest_algorithm(want)
        got = file_digest(path, algo)
        if got != want.lower():
            raise mismatch(path, algo, got, want)
        out[path.name] = f"{algo}:{got}"
    return out


def _read_zip(path: Path, checksums: Mapping[str, str] | None, verify: bool) -> SourceDataset:
    provenance = {"archive": str(path), "checksums": _check_archive(path, checksums, verify)}
    try:
        with zipfile.ZipFile(path) as zf:
            names = sorted(n for n in zf.namelist() if n.lower().endswith(".png"))
    except zipfile.BadZipFile:
        raise FSCILError(f"{path}: not a readable zip file") from None
    members: dict[str, list[str]] = {}
    for name in names:
        parts = PurePosixPath(name).parts
        if len(parts) != 4:  # <set>/<alphabet>/<character>/<file>.png
            raise FSCILError(f"{path}: member {name!r} is not <set>/<alphabet>/<character>/<image>.png")
        members.setdefault(f"{parts[1]}/{parts[2]}", []).append(name)
    if not members:
        raise FSCILError(f"{path}: no PNG images inside (expected <set>/<alphabet>/<character>/<image>.png)")
    class_names = sorted(members)
    paths, labels = [], []
    for label, cls in enumerate(class_names):
        paths += members[cls]
        labels += [label] * len(members[cls])
    listing = hashlib.sha256("\n".join(paths).encode()).hexdigest()
    return SourceDataset(name="omniglot", root=path, class_names=class_names, labels=np.asarray(labels),
                         is_train=np.ones(len(labels), dtype=bool), keys=list(paths),
                         paths=[Path(p) for p in paths], archive=path,
                         provenance={**provenance, "num_files": len(paths), "listing_sha256": listing})


def _read_folder(root: Path) -> SourceDataset:
    """An extracted set: `root/<alphabet>/<character>/` or `root/<set>/<alphabet>/<character>/`."""
    source = read_class_folder(root)
    parts = [PurePosixPath(n).parts for n in source.class_names]
    if all(len(p) == 3 for p in parts) and len({p[0] for p in parts}) == 1:
        source.class_names = ["/".join(p[1:]) for p in parts]  # drop the one <set>/ level
    elif not all(len(p) == 2 for p in parts):
        bad = next(n for n, p in zip(source.class_names, parts, strict=True) if len(p) != 2)
        raise FSCILError(f"{root}: class folder {bad!r} is not <alphabet>/<character>")
    source.name = "omniglot"
    return source


def read_omniglot(root: Path, verify_checksums: bool = True, checksums: Mapping[str, str] | None = None
                  ) -> SourceDataset:
    """Every character image under `root` (an official zip or an extracted set folder), all as training samples."""
    root = Path(root)
    if root.is_file():
        return _read_zip(root, checksums, verify_checksums)
    if root.is_dir():
        zips = sorted(p for p in root.glob("*.zip") if p.name in OFFICIAL_DIGESTS)
        if len(zips) == 1 and not any(c.is_dir() for c in root.iterdir()):
            return _read_zip(zips[0], checksums, verify_checksums)
        return _read_folder(root)
    raise FSCILError(f"missing Omniglot data {root} (expected an official zip or its extracted folder)")


def build(cfg):
    """The pack of an Omniglot zip or folder, its protocol drawn from the seed (a `DATASETS` entry)."""
    return seeded_pack(cfg, read_omniglot(Path(cfg.root), cfg.verify_checksums, cfg.checksums))
