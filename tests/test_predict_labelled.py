"""`fscil predict --labelled` and `api.evaluate` (pipeline/training/labelled.py): a model measured on a class-folder
tree. Oracle: the tree is a session's own test images written out as files under their class names, so accuracy on
all, base and novel classes and every class's accuracy equal what the session's evaluation stored (metrics.json);
the confusion matrix holds exactly those counts; folders of classes the model does not know are named, not scored."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pipeline import api
from pipeline.config import load_config
from pipeline.data.pack import ImagePack
from pipeline.training.apply import load_session_model
from pipeline.training.labelled import CONFUSION_CORNER
from tests.pipeline_fixtures import NUM_SESSIONS, cli
from tests.test_pictures import text_outside

UNKNOWN = "zz-not-a-class"


def labelled_tree(pack_path: Path, session: int, out: Path, unknown: int = 0) -> tuple[Path, dict[str, int]]:
    """The test images of the classes seen by `session`, one folder per class named as the pack names it; plus
    `unknown` images in a folder no model knows. Returns (tree, {class: images})."""
    counts: dict[str, int] = {}
    with ImagePack.open(pack_path) as pack:
        ids = pack.protocol.test_ids_seen(session, pack.labels)
        for i, image in zip(ids, pack.read_images(ids), strict=True):
            name = pack.class_names[int(pack.labels[i])]
            (out / name).mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(out / name / f"{i:05d}.png")
            counts[name] = counts.get(name, 0) + 1
        for k, image in enumerate(pack.read_images(ids[:unknown])):
            (out / UNKNOWN).mkdir(exist_ok=True)
            Image.fromarray(255 - image).save(out / UNKNOWN / f"{k}.png")
    return out, counts


def _stored(paths, session: int) -> dict:
    return json.loads(((paths.base if session == 0 else paths.session(session)) / "metrics.json").read_text())


def _source(tiny_run) -> list[str]:
    _, params, paths = tiny_run
    return ["--params", str(params), "--data-dir", str(paths.data_dir), "--device", "cpu"]


def test_labelled_tree_gives_the_sessions_own_accuracy_and_confusion(tiny_run, tmp_path, monkeypatch):
    _, _, paths = tiny_run
    session = NUM_SESSIONS
    tree, counts = labelled_tree(paths.pack, session, tmp_path / "tree", unknown=2)
    stored = _stored(paths, session)
    assert 0 < stored["novel_acc"] < 100 or 0 < stored["base_acc"] < 100  # an oracle with errors to count
    outside = []
    save = matplotlib.figure.Figure.savefig

    def checked(fig, target, *args, **kwargs):
        outside.extend(text_outside(fig))
        return save(fig, target, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", checked)
    out = tmp_path / "preds.csv"
    result = cli("predict", str(tree), "--labelled", "--session", str(session), "--out", str(out), *_source(tiny_run))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    n = sum(counts.values())
    acc_line = next(line for line in lines if line.startswith("accuracy "))
    assert acc_line.startswith(f"accuracy {stored['acc']:.2f} % (") and f" of {n} images, {len(counts)} classes" \
        in acc_line, acc_line
    split = next(line for line in lines if line.startswith("base "))
    assert f"base {stored['base_acc']:.2f} %" in split and f"novel {stored['novel_acc']:.2f} %" in split, split
    assert f"not known to the model, not scored: {UNKNOWN} (2 images)" in lines
    # the confusion matrix: the session's counts, class by class
    confusion = pd.read_csv(tmp_path / "preds.confusion.csv", index_col=0)
    assert confusion.index.name == CONFUSION_CORNER and UNKNOWN not in confusion.index
    names = list(confusion.columns)
    assert list(confusion.index) == [c for c in names if c in counts] and len(names) == stored["num_seen_classes"]
    assert confusion.sum(axis=1).to_dict() == counts
    per_class = [100.0 * confusion.loc[c, c] / counts[c] for c in confusion.index]
    assert per_class == pytest.approx([a for a in stored["per_class_acc"] if a is not None], abs=1e-3)
    assert 100.0 * np.trace(confusion.to_numpy()) / n == pytest.approx(stored["acc"], abs=1e-3)
    # the per-image rows: predict's columns, then the folder's class and whether it was hit
    table = pd.read_csv(out, keep_default_na=False)
    assert list(table.columns)[-2:] == ["label", "correct"] and len(table) == n + 2
    known = table[table["label"] != UNKNOWN]
    assert (known["correct"] == "True").sum() == np.trace(confusion.to_numpy())
    assert (table[table["label"] == UNKNOWN]["correct"] == "").all()
    assert (tmp_path / "preds.confusion.png").stat().st_size > 0 and outside == [], outside
    # run again: its own files are replaced, nothing else
    again = cli("predict", str(tree), "--labelled", "--session", str(session), "--out", str(out), *_source(tiny_run))
    assert again.exit_code == 0 and again.output == result.output


def test_the_python_entry_point_and_an_exported_model_give_the_same(tiny_run, tmp_path):
    _, params, paths = tiny_run
    with ImagePack.open(paths.pack) as pack:
        num_base = len(pack.protocol.sessions[0].classes)
    for session in (0, 1):
        tree, counts = labelled_tree(paths.pack, session, tmp_path / f"tree{session}")
        model = load_session_model(load_config(params), paths.base, paths.pack, paths.data_dir / "sessions", session)
        result = api.evaluate(model, tree)
        stored = _stored(paths, session)
        for key in ("acc", "base_acc", "novel_acc", "per_class_acc"):
            assert result.metrics[key] == stored[key], key
        assert result.unknown == {} and result.num_base == num_base
        exported = tmp_path / f"s{session}.safetensors"
        assert cli("export", str(exported), "--session", str(session), *_source(tiny_run)[:4]).exit_code == 0
        from_file = api.evaluate(api.load(exported), tree)
        assert from_file.metrics == result.metrics and from_file.confusion.equals(result.confusion)
        assert from_file.num_base == model.num_base


def test_bad_labelled_input_is_one_line_and_writes_nothing(tiny_run, tmp_path):
    _, _, paths = tiny_run
    source = ["--session", "1", *_source(tiny_run)]
    tree, _ = labelled_tree(paths.pack, 1, tmp_path / "tree")
    image = next(tree.rglob("*.png"))
    for args in ([str(image)], [str(tree), str(tree)]):
        result = cli("predict", *args, "--labelled", "--out", str(tmp_path / "p.csv"), *source)
        assert result.exit_code == 2 and "--labelled takes one folder" in result.output, result.output
        assert result.output.count("\n") == 1
    strangers = tmp_path / "strangers"
    (strangers / "cat").mkdir(parents=True)
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(strangers / "cat" / "a.png")
    result = cli("predict", str(strangers), "--labelled", "--out", str(tmp_path / "p.csv"), *source)
    assert result.exit_code == 2 and "none of its 1 class folders (cat) is a class the model knows" in result.output
    # a file of the user's where the confusion matrix would go is refused before any work
    (tmp_path / "p.confusion.csv").write_text("my notes\n")
    result = cli("predict", str(tree), "--labelled", "--out", str(tmp_path / "p.csv"), *source)
    assert result.exit_code == 2 and "p.confusion.csv: exists and is not a confusion matrix" in result.output
    assert (tmp_path / "p.confusion.csv").read_text() == "my notes\n"
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.confusion.png").exists()
