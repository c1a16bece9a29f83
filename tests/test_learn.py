"""`fscil learn` (pipeline/training/learn.py, pipeline/api.py): a trained model taught the user's own classes from
a class-folder tree runs the pipeline's own incremental session. Oracle: the protocol's session shots exported as
image folders and learned give the `incremental` stage's state byte for byte (g_inc, classifier, memory) and its
predictions; learns chain; every kind of bad input is one line before any work, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline import api
from pipeline.config import load_config
from pipeline.data.pack import ImagePack
from pipeline.training.apply import EXPORT_KIND, load_exported, predict_arrays
from pipeline.training.checkpoint import load_checkpoint, save_checkpoint
from pipeline.training.evaluate import session_metrics
from stages.paths import StagePaths
from tests.pipeline_fixtures import cli, run_pipeline, run_stage, write_params

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """A tiny run without augmented views of the shots (extract.augmented_views 0): its sessions' draws are the
    ones a learned session makes (views are drawn for every session's shots in one stream at extraction)."""
    root = tmp_path_factory.mktemp("learn")
    params = write_params(root / "params.yaml", extract={"augmented_views": 0})
    run_pipeline(params, root / "data", root / "metrics.json")
    return root, params, StagePaths(root / "data")


def class_tree(pack_path: Path, session: int, out: Path) -> Path:
    """The shots of protocol session `session` as a class-folder tree, folders named c<id>-<class> so that their
    sorted order is the protocol's class order, files in the protocol's order."""
    with ImagePack.open(pack_path) as pack:
        ids = np.asarray(pack.protocol.sessions[session].train_ids)
        for k, (i, image) in enumerate(zip(ids, pack.read_images(ids), strict=True)):
            c = int(pack.labels[i])
            folder = out / f"c{c:03d}-{pack.class_names[c]}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{k:04d}.png")
    return out


def _source(run) -> list[str]:
    root, params, paths = run
    return ["--params", str(params), "--data-dir", str(paths.data_dir), "--device", "cpu"]


def _same_state(model_file: Path, state_file: Path) -> None:
    """The learned file's g_inc, classifier and class memory are the session state's, byte for byte."""
    tensors, _ = load_checkpoint(model_file)
    state, _ = load_checkpoint(state_file)
    adapting = {k for k in state if k.startswith("adapting.")}
    assert adapting and len(adapting) == len([k for k in tensors if k.startswith("model.projector.g_inc.")])
    for key in adapting:
        assert torch.equal(tensors["model.projector.g_inc." + key.removeprefix("adapting.")], state[key]), key
    assert torch.equal(tensors["model.classifier.weight"], state["classifier.weight"])
    assert torch.equal(tensors["learn.memory_maps"], state["memory.maps"])
    assert torch.equal(tensors["learn.memory_classes"], state["memory.classes"])


def test_learned_sessions_are_the_pipelines_sessions_and_chain(plain_run, tmp_path):
    root, params, paths = plain_run
    first = tmp_path / "s1.safetensors"
    result = cli("learn", str(class_tree(paths.pack, 1, tmp_path / "one")), "--session", "0", "--out", str(first),
                 *_source(plain_run))
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"{first}: 10 classes known (2 new: c008-") and ", session 1, " in last, last
    _same_state(first, paths.session(1) / "state.safetensors")
    # the model file names the classes by their folders and predicts what the session's evaluation predicted
    learned = load_exported(first)
    with ImagePack.open(paths.pack) as pack:
        ids = pack.protocol.test_ids_seen(1, pack.labels)
        images, labels, names = pack.read_images(ids), pack.labels[ids], pack.class_names
        num_base = len(pack.protocol.sessions[0].classes)
    assert learned.class_names[:num_base] == names[:num_base]
    assert learned.class_names[num_base:] == [f"c{c:03d}-{names[c]}" for c in range(num_base, 10)]
    pred, _ = predict_arrays(learned, images, CPU)
    stored = json.loads((paths.session(1) / "metrics.json").read_text())
    assert session_metrics(pred, labels, num_base, 10)["per_class_acc"] == stored["per_class_acc"]
    # a learn chains on the file it wrote: session 2 of the pipeline again
    second = tmp_path / "s2.safetensors"
    result = cli("learn", str(class_tree(paths.pack, 2, tmp_path / "two")), "--model", str(first), "--out",
                 str(second), "--device", "cpu")
    assert result.exit_code == 0, result.output
    _same_state(second, paths.session(2) / "state.safetensors")
    assert load_exported(second).session == 2 and len(load_exported(second).class_names) == 12


def test_the_python_entry_point_is_what_the_cli_runs(plain_run, tmp_path):
    root, params, paths = plain_run
    exported = tmp_path / "base.safetensors"
    assert cli("export", str(exported), "--session", "0", *_source(plain_run)[:4]).exit_code == 0
    tree = class_tree(paths.pack, 1, tmp_path / "one")
    model = api.learn(api.load(exported), tree, log=lambda line: None)
    api.save(model, tmp_path / "api.safetensors")
    result = cli("learn", str(tree), "--model", str(exported), "--out", str(tmp_path / "cli.safetensors"),
                 "--device", "cpu")
    assert result.exit_code == 0, result.output
    mine, _ = load_checkpoint(tmp_path / "api.safetensors")
    theirs, _ = load_checkpoint(tmp_path / "cli.safetensors")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    _same_state(tmp_path / "api.safetensors", paths.session(1) / "state.safetensors")
    rows = api.predict(model, [tree])
    assert len(rows) == 4 and {r["class"] for r in rows} <= set(model.class_names)


def test_bad_input_is_one_line_before_any_work_and_nothing_is_written(plain_run, tmp_path):
    root, params, paths = plain_run
    source = ["--session", "0", *_source(plain_run)]
    out = tmp_path / "out.safetensors"

    def refused(folder, needle, *args):
        result = cli("learn", str(folder), "--out", str(out), *(args or source))
        assert result.exit_code == 2 and needle in result.output, result.output
        assert result.output.count("\n") == 1 and not out.exists(), result.output

    good = class_tree(paths.pack, 1, tmp_path / "good")
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.png").write_bytes(next(next(good.iterdir()).iterdir()).read_bytes())
    refused(flat, "no class folders")
    refused(tmp_path / "missing", "not a folder")
    empty = class_tree(paths.pack, 1, tmp_path / "empty")
    (empty / "no-images").mkdir()
    (empty / "no-images" / "notes.txt").write_text("not an image")
    refused(empty, "class 'no-images' has no image files")
    broken = class_tree(paths.pack, 1, tmp_path / "broken")
    (broken / "unreadable").mkdir()
    (broken / "unreadable" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    refused(broken, "class 'unreadable' has no readable image")
    with ImagePack.open(paths.pack) as pack:
        known = pack.class_names[0]
    clash = class_tree(paths.pack, 1, tmp_path / "clash")
    (clash / known).mkdir()
    Image.new("RGB", (32, 32)).save(clash / known / "a.png")
    refused(clash, f"the model already knows class {known!r}")
    # the output: a folder, a file of another kind, the input model itself
    out.mkdir()
    result = cli("learn", str(good), "--out", str(out), *source)
    assert result.exit_code == 2 and "is a folder" in result.output and not any(out.iterdir())
    out.rmdir()
    out.write_text("my notes")
    result = cli("learn", str(good), "--out", str(out), *source)
    assert result.exit_code == 2 and "nothing was replaced" in result.output and out.read_text() == "my notes"
    out.unlink()
    model = tmp_path / "model.safetensors"
    assert cli("export", str(model), *source[:6]).exit_code == 0
    before = model.read_bytes()
    result = cli("learn", str(good), "--model", str(model), "--out", str(model))
    assert result.exit_code == 2 and "is the input model" in result.output and model.read_bytes() == before
    refused(good, "not both", "--model", str(model), *source)
    refused(good, "give --session N", "--device", "cpu")


def test_images_of_any_mode_and_size_are_converted_and_a_corrupt_one_is_skipped(plain_run, tmp_path):
    root, params, paths = plain_run
    tree = class_tree(paths.pack, 1, tmp_path / "tree")
    folder = next(tree.iterdir())
    Image.new("L", (50, 40), 128).save(folder / "grey.png")
    Image.new("RGBA", (20, 70), (10, 200, 30, 128)).save(folder / "alpha.png")
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    out = tmp_path / "m.safetensors"
    result = cli("learn", str(tree), "--session", "0", "--out", str(out), *_source(plain_run))
    assert result.exit_code == 0, result.output
    assert result.output.count("skipped ") == 1 and "corrupt.jpg" in result.output
    assert "6 images of 2 new classes" in result.output  # 2 x 2 shots, the grey and the RGBA image


def test_an_export_without_the_class_memory_is_refused_with_how_to_export_again(plain_run, tmp_path):
    root, params, paths = plain_run
    new = tmp_path / "new.safetensors"
    assert cli("export", str(new), "--session", "0", *_source(plain_run)[:4]).exit_code == 0
    tensors, meta = load_checkpoint(new)
    assert meta["kind"] == EXPORT_KIND and "run" in meta and "learn.memory_maps" in tensors
    old = tmp_path / "old.safetensors"  # what `fscil export` wrote before `fscil learn`
    save_checkpoint(old, {k: v for k, v in tensors.items() if not k.startswith("learn.")},
                    {k: v for k, v in meta.items() if k != "run"})
    assert load_exported(old).learn is None
    out = tmp_path / "out.safetensors"
    result = cli("learn", str(class_tree(paths.pack, 1, tmp_path / "t")), "--model", str(old), "--out", str(out))
    assert result.exit_code == 2 and "export it again with `fscil export --session N`" in result.output
    assert result.output.count("\n") == 1 and not out.exists()


def test_a_full_etf_head_is_refused_naming_its_capacity_and_the_key_that_gives_room(tiny_run, tmp_path):
    root, params, paths = tiny_run
    out = tmp_path / "x.safetensors"
    tree = class_tree(paths.pack, 1, tmp_path / "t")
    for folder in tree.iterdir():
        folder.rename(folder.with_name("mine-" + folder.name))
    source = ["--params", str(params), "--data-dir", str(paths.data_dir), "--device", "cpu"]
    result = cli("learn", str(tree), "--session", "3", "--out", str(out), *source)
    assert result.exit_code == 2 and result.output.count("\n") == 1 and not out.exists(), result.output
    assert "knows 14 classes and its ETF head has room for 14" in result.output
    assert "model.num_classes" in result.output


def test_model_num_classes_gives_room_and_a_linear_head_grows_by_rows(tmp_path):
    """model.num_classes 16 over a 14-class protocol: two free vertices after the last session; a linear head has no
    fixed room: its rows grow. The key is checked against the data and the ETF's dimension."""
    for name, model in (("etf", {"num_classes": 16}), ("linear", {"classifier": "linear"})):
        params = write_params(tmp_path / f"{name}.yaml", model=model, extract={"augmented_views": 0})
        data = tmp_path / name
        for stage in ("prepare", "base", "extract"):
            run_stage(stage, params, data)
        tree = class_tree(StagePaths(data).pack, 1, tmp_path / f"{name}-tree")
        extra = tmp_path / f"{name}-extra"
        for k, folder in enumerate([*sorted(tree.iterdir())] * (4 if name == "linear" else 1)):
            target = extra / f"more-{k}-{folder.name}"
            target.mkdir(parents=True)
            for image in folder.iterdir():
                (target / image.name).write_bytes(image.read_bytes())
        out = tmp_path / f"{name}.safetensors"
        source = ["--params", str(params), "--data-dir", str(data), "--device", "cpu"]
        result = cli("learn", str(extra), "--session", "0", "--out", str(out), *source)
        assert result.exit_code == 0, result.output
        learned = load_exported(out)
        new = 2 if name == "etf" else 8
        assert learned.num_seen == 8 + new and learned.meta["num_classes"] == 16
        assert learned.model.classifier(torch.zeros(1, 16)).shape == (1, 16)
    cfg = load_config(tmp_path / "etf.yaml")
    assert cfg.model.num_classes == 16 and "num_classes" in cfg.to_dict()["model"]
    assert "num_classes" not in load_config(write_params(tmp_path / "p.yaml")).to_dict()["model"]  # at its default
    for value, needle in ((10, "model.num_classes must be >= the 14 classes of the data"),
                          (17, "model.dim must be >= the 17 classes the head has room for")):
        params = write_params(tmp_path / f"bad{value}.yaml", model={"num_classes": value})
        result = cli("stage", "prepare", "--params", str(params), "--data-dir", str(tmp_path / f"bad{value}"))
        assert result.exit_code == 2 and needle in result.output, result.output
