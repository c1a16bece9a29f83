"""Bad input everywhere: a one-line error naming the culprit, exit code 2, and nothing half-written."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import yaml

from pipeline.config import build_config
from pipeline.errors import FSCILError
from pipeline.models.fscil import build_head
from pipeline.models.projector import Projector
from pipeline.research.selection import with_values
from pipeline.training import incremental_session, session_step
from pipeline.training.base_session import not_learning
from pipeline.training.incremental_session import ROSE_FACTOR, loss_rose
from pipeline.training.sgd import SGD
from tests.headroom import learned
from tests.pipeline_fixtures import TINY_PARAMS, cli, write_params


def _assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("section,values,needles", [
    ("base", {"epochs": "ten"}, ["base.epochs", "integer"]),
    ("incremental", {"lr": -1.0}, ["incremental.lr", "> 0"]),
    ("model", {"dimm": 8}, ["unknown key model.dimm"]),
    ("model", {"k_paths": 3}, ["model.k_paths", "1, 2 or 4"]),
    ("model", {"projector": "rnn"}, ["model.projector", "dual_ssm"]),
    ("incremental", {"suppression": "norm"}, ["incremental.suppression"]),
    ("incremental", {"replay": "all"}, ["incremental.replay", "mean or shots"]),
    ("data", {"dataset": "imagenet"}, ["data.dataset"]),
    ("data", {"novel_shapes": 5}, ["data.novel_shapes", "0..4"]),
    ("data", {"novel_shapes": 1, "ways": 10, "sessions": 2}, ["data.novel_shapes", "at most 18", "needs 20"]),
    ("data", {"dataset": "omniglot", "root": "o.zip", "novel_shapes": 1}, ["data.novel_shapes", "synthetic only"]),
    ("extract", {"dtype": "int8"}, ["extract.dtype"]),
    ("base", {"mix_prob": 2.0}, ["base.mix_prob"]),
    ("base", {"cutmix_alpha": -1.0}, ["base.cutmix_alpha", ">= 0"]),
    ("base", {"dr_scale": 0.0}, ["base.dr_scale", "> 0"]),
    ("base", {"unmixed_epochs": -1}, ["base.unmixed_epochs", ">= 0"]),
    ("base", {"unaugmented_epochs": -2}, ["base.unaugmented_epochs", ">= 0"]),
    ("base", {"epochs": 10, "unaugmented_epochs": 11}, ["base.unaugmented_epochs", "<= base.epochs (10)"]),
    ("base", {"epochs": 10, "unmixed_epochs": 20}, ["base.unmixed_epochs", "<= base.epochs (10)"]),
    ("base", {"backbone_ce": -1.0}, ["base.backbone_ce", ">= 0"]),
    ("base", {"backbone_lr_scale": -0.1}, ["base.backbone_lr_scale", ">= 0"]),
    ("selection", {"base_epochs": [100, 0]}, ["selection.base_epochs", "lists 0", "base.epochs", ">= 1"]),
    ("selection", {"base_cutmix_alpha": [1.0, -0.5]}, ["selection.base_cutmix_alpha", ">= 0"]),
    ("selection", {"base_mix_prob": [0.5, 1.5]}, ["selection.base_mix_prob", "[0, 1]"]),
    ("selection", {"base_unmixed_epochs": [0, -5]}, ["selection.base_unmixed_epochs", "lists -5", ">= 0"]),
    ("selection", {"base_unaugmented_epochs": [-1]}, ["selection.base_unaugmented_epochs", "lists -1", ">= 0"]),
    ("selection", {"base_backbone_ce": [0.0, -0.1]}, ["selection.base_backbone_ce", "lists -0.1", ">= 0"]),
    ("selection", {"lr": [0.1, 0.0]}, ["selection.lr", "lists 0.0", "incremental.lr", "> 0"]),
    ("selection", {"weight_decay": [0.0, -1e-4]},
     ["selection.weight_decay", "lists -0.0001", "incremental.weight_decay", ">= 0"]),
    ("incremental", {"weight_decay": -1e-4}, ["incremental.weight_decay", ">= 0"]),
    ("incremental", {"base_lr_scale": 0.0}, ["incremental.base_lr_scale", "> 0"]),
    ("selection", {"base_lr_scale": [1.0, -0.1]}, ["selection.base_lr_scale", "lists -0.1", "> 0"]),
    ("selection", {"grad_clip_norm": [None, -1.0]}, ["selection.grad_clip_norm", "lists -1.0", "> 0 or null"]),
    ("selection", {"steps": [[100], []]}, ["selection.steps", "lists []", "incremental.steps", ">= 1"]),
    ("selection", {"memory": ["mean", "all"]}, ["selection.memory", "lists 'all'", "extract.memory"]),
    ("selection", {"base_copy": [[1], [-1]]}, ["selection.base_copy", "incremental.base_copy", ">= 0"]),
])
def test_invalid_params(tmp_path, section, values, needles):
    """A run's section stops the stage; the selection section (read by `fscil select` alone) stops the commands that
    read it, `fscil config show` among them."""
    params = write_params(tmp_path / "params.yaml", **{section: values})
    command = ("config", "show") if section == "selection" else ("stage", "prepare")
    result = cli(*command, "--params", str(params), *(() if section == "selection" else ("--data-dir",
                                                                                       str(tmp_path / "data"))))
    _assert_one_line_error(result, *needles)
    assert not (tmp_path / "data").exists()


def test_invalid_top_level_params(tmp_path):
    for extra, needle in (({"sed": 1}, "unknown key sed"), ({"preset": "imagenet"}, "preset 'imagenet'"),
                          ({"seed": -1}, "seed"), ({"device": "tpu"}, "device"),
                          ({"deterministic": "yes"}, "deterministic")):
        params = tmp_path / "params.yaml"
        params.write_text(yaml.safe_dump({**TINY_PARAMS, **extra}))
        _assert_one_line_error(cli("stage", "base", "--params", str(params), "--data-dir", str(tmp_path)), needle)
    params.write_text("base: [unclosed")
    _assert_one_line_error(cli("config", "show", "--params", str(params)), "not valid YAML")
    _assert_one_line_error(cli("config", "show", "--params", str(tmp_path / "none.yaml")), "no such file")


def test_corrupt_and_foreign_feature_stores(tiny_run, tmp_path):
    _, params, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report", "pack.h5"))
    meta = data / "features.zarr" / "zarr.json"
    original = meta.read_text()
    args = ("stage", "incremental", "--session", "1", "--params", str(params), "--data-dir", str(data), "-q")

    meta.write_text("{ not json")
    _assert_one_line_error(cli(*args), "not a readable Zarr store")
    doc = json.loads(original)
    doc["attributes"]["format"] = "somebody-else/1"
    meta.write_text(json.dumps(doc))
    _assert_one_line_error(cli(*args), "not a feature store of this pipeline")
    doc = json.loads(original)
    doc["attributes"]["complete"] = False
    meta.write_text(json.dumps(doc))
    _assert_one_line_error(cli(*args), "incomplete feature store")
    doc = json.loads(original)
    doc["attributes"]["map_shape"] = [16, 3, 3]  # maps do not have the shape the metadata claims
    meta.write_text(json.dumps(doc))
    _assert_one_line_error(cli(*args), "test/maps has maps of shape")
    shutil.rmtree(data / "features.zarr")
    _assert_one_line_error(cli(*args), "feature store not found")
    assert not (data / "sessions" / "session_1").exists()


def test_a_damaged_store_array_is_named_before_any_training(tiny_run, tmp_path, monkeypatch):
    """A corrupted chunk, a chunk gone, or an array rewritten with another shape: a one-line error naming the array
    and the stage to re-run, before the session trains (it used to surface after about a minute of training)."""
    from pipeline.training import incremental_session

    _, params, paths = tiny_run
    args = ("stage", "incremental", "--session", "1", "--params", str(params), "-q")
    trained = []
    monkeypatch.setattr(incremental_session, "fit_session", lambda *a, **k: trained.append(1))

    def fresh(name: str):
        data = tmp_path / name
        shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report", "pack.h5"))
        return data

    data = fresh("flipped")  # one byte of one chunk of the test maps changed
    chunk = sorted((data / "features.zarr" / "test" / "maps" / "c").rglob("*"))[-1]
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    result = cli(*args, "--data-dir", str(data))
    _assert_one_line_error(result, "array test/maps", "fscil stage extract")
    data = fresh("gone")  # a chunk file missing: zarr reads it as fill values
    next(p for p in (data / "features.zarr" / "fewshot" / "maps" / "c").rglob("*") if p.is_file()).unlink()
    _assert_one_line_error(cli(*args, "--data-dir", str(data)), "array fewshot/maps", "sha256 mismatch")
    data = fresh("reshaped")  # an array rewritten with fewer rows
    import zarr

    group = zarr.open_group(str(data / "features.zarr"), mode="r+")
    labels = group["test/labels"][...]
    del group["test/labels"]
    group.create_array("test/labels", shape=(len(labels) - 1,), dtype="int64")[...] = labels[:-1]
    _assert_one_line_error(cli(*args, "--data-dir", str(data)), "array test/labels has shape", "the extraction wrote")
    assert not trained and not (data / "sessions" / "session_1").exists()


def test_non_finite_loss_stops_naming_the_step(tiny_run, tmp_path):
    _, _, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report"))
    params = write_params(tmp_path / "params.yaml", incremental={"lr": 1e30, "lambda1": 1e30})
    result = cli("stage", "incremental", "--session", "1", "--params", str(params), "--data-dir", str(data), "-q")
    _assert_one_line_error(result, "session 1: non-finite loss at step")
    assert not (data / "sessions" / "session_1").exists() and not list((data / "sessions").glob(".*"))
    params = write_params(tmp_path / "params.yaml", base={"lr": 1e30})
    result = cli("stage", "base", "--params", str(params), "--data-dir", str(data), "-q")
    _assert_one_line_error(result, "non-finite loss at epoch", "step")
    # the earlier (complete) base output is still the one in place, untouched
    assert (data / "base" / "model.safetensors").read_bytes() == (paths.base / "model.safetensors").read_bytes()


def test_a_base_training_whose_loss_does_not_fall_is_refused(tiny_run, tmp_path, monkeypatch):
    """A finite but rising base training (here: every update goes uphill, as a far too high lr can) used to be
    written as a model; now it is a one-line error and the earlier base output stays in place."""
    _, params, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report"))
    real_step = SGD.step

    def uphill(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.neg_()
        return real_step(self)

    monkeypatch.setattr(SGD, "step", uphill)
    result = cli("stage", "base", "--params", str(params), "--data-dir", str(data), "-q")
    _assert_one_line_error(result, "base training: the mean loss of the last epoch", "is not below the first epoch's",
                           "nothing written")
    assert (data / "base" / "model.safetensors").read_bytes() == (paths.base / "model.safetensors").read_bytes()
    assert not_learning([1.0, 0.9, 1.0]) and not_learning([1.0, 1.2]) and not_learning([1.0, float("nan")])
    assert not not_learning([1.0, 1.1, 0.99]) and not not_learning([1.0])  # one epoch: nothing to compare


def test_overflowing_features_are_a_non_finite_loss_not_a_silent_flat_one(tiny_run, tmp_path, monkeypatch):
    """Measured in an Omniglot selection (base.dr_scale 30): the projector's features grew until their norm
    overflowed float32; F.normalize then gave 0, so the DR loss sat at exactly 0.5 x scale with no gradient for 185
    epochs and a model at chance (2.5 %) was written as a result. Overflowing features now make a non-finite loss."""
    _, params, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report"))
    def overflowing(real):
        def method(self, *args, **kwargs):  # finite features whose norm overflows float32
            out = real(self, *args, **kwargs)
            return dataclasses.replace(out, mu=out.mu * 1e20)
        return method

    # both paths: the model's features (base training, evaluation) and a session step's objective
    monkeypatch.setattr(Projector, "forward", overflowing(Projector.forward))
    monkeypatch.setattr(Projector, "session_outputs", overflowing(Projector.session_outputs))
    result = cli("stage", "base", "--params", str(params), "--data-dir", str(data), "-q")
    _assert_one_line_error(result, "base training: non-finite loss at epoch 1 step 1", "nothing written")
    assert (data / "base" / "model.safetensors").read_bytes() == (paths.base / "model.safetensors").read_bytes()
    result = cli("stage", "incremental", "--session", "1", "--params", str(params), "--data-dir", str(data), "-q")
    _assert_one_line_error(result, "session 1: non-finite loss at step 1")
    assert not (data / "sessions" / "session_1").exists()


@pytest.mark.parametrize("how", ["fit rose", "weights blew up"])
def test_a_session_that_ends_worse_than_it_began_is_refused_as_diverged(how, tiny_run, tmp_path, monkeypatch):
    """A session whose trained model fits its own training rows far worse than the starting model (measured: an
    Omniglot frozen-branch session collapsed, every test image in one class, with a finite loss), or whose last
    update left the model non-finite after a finite loss, is a diverged session: one-line error, nothing written."""
    _, params, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report"))
    calls, fits = [], []
    real_loss, real_fit = session_step.incremental_loss, incremental_session.fit_loss

    def last_step_blows_up(projector, *args, **kwargs):  # the 4th (last) step's gradient is 1e30 per weight
        cls, supp, sep = real_loss(projector, *args, **kwargs)
        calls.append(1)
        if len(calls) == 4:
            cls = cls + 1e30 * sum(p.sum() for p in projector.parameters() if p.requires_grad)
        return cls, supp, sep

    def worse_after(*args, **kwargs):  # the check's own measure, the second time 1.6x the first
        fits.append(real_fit(*args, **kwargs))
        return fits[0] * (1.0 if len(fits) == 1 else 1.6)

    if how == "fit rose":
        monkeypatch.setattr(incremental_session, "fit_loss", worse_after)
    else:
        monkeypatch.setattr(session_step, "incremental_loss", last_step_blows_up)
    result = cli("stage", "incremental", "--session", "1", "--params", str(params), "--data-dir", str(data), "-q")
    _assert_one_line_error(result, "session 1: the classification loss on the session's training set went from",
                           "nan after" if how == "weights blew up" else "after", "nothing written")
    assert not (data / "sessions" / "session_1").exists()


@torch.no_grad()
def test_fit_loss_is_the_clean_dr_loss_over_the_whole_training_set():
    """Oracle: eq. loss_dr (x dr_scale) averaged over every row, in float64 from the projector's features and the
    ETF columns; the same for any evaluation batch size and with feature mixup on, draws no random numbers, builds no
    autograd graph and leaves the train / eval modes as they were."""
    cfg = build_config(TINY_PARAMS)
    projector, classifier = build_head(cfg.model, 16, (2, 2), 12)
    projector.set_sessions(1)
    for p in projector.g_inc.parameters():  # a g_inc that contributes (a fresh one is zero-gated)
        p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    x = torch.randn(37, 16, 2, 2, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (37,), generator=torch.Generator().manual_seed(2))
    mu = projector(x, mode="incremental").mu.double()
    w = classifier.weight[:, :10].double()
    cos = (mu / mu.norm(dim=1, keepdim=True)) @ w
    expected = (cfg.incremental.dr_scale * 0.5 * (cos[torch.arange(37), y] - 1) ** 2).mean().item()
    projector.train()
    classifier.eval()
    rng = torch.get_rng_state()
    for batch, mixup in ((5, 0.0), (1000, 0.0), (7, 1.0)):
        inc = dataclasses.replace(cfg.incremental, eval_batch_size=batch, mixup_prob=mixup)
        assert incremental_session.fit_loss(projector, classifier, x, y, 10, "etf", inc) == pytest.approx(
            expected, rel=1e-6)
    assert projector.training and not classifier.training and torch.equal(torch.get_rng_state(), rng)
    # a measurement, not a training step: no autograd graph is built (it once lost its no_grad)
    graphs = []
    hook = classifier.register_forward_hook(lambda mod, inp, out: graphs.append(out.requires_grad))
    with torch.enable_grad():  # as in train_session (this test itself runs under no_grad)
        incremental_session.fit_loss(projector, classifier, x, y, 10, "etf", cfg.incremental)
    hook.remove()
    assert graphs == [False]


def test_the_divergence_verdict_follows_the_model_not_the_batch_losses(tiny_run, tmp_path, monkeypatch):
    """Logged batch losses do not decide it: with feature mixup they alternate between clean and mixed batches,
    and a session whose first batch was clean read as a 30x rise under the old first-step rule (memory_k 8:
    0.0105 -> 0.305, a healthy session). A constant added to every later step's loss (no gradient changes) leaves
    the session accepted with exactly the weights of the unpatched run."""
    _, params, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report"))
    calls = []

    def rising(*args, **kwargs):
        cls, supp, sep = real(*args, **kwargs)
        calls.append(1)
        return cls + 100.0 * (len(calls) - 1), supp, sep

    real = session_step.incremental_loss
    monkeypatch.setattr(session_step, "incremental_loss", rising)
    result = cli("stage", "incremental", "--session", "1", "--params", str(params), "--data-dir", str(data), "-q")
    assert result.exit_code == 0, result.output
    assert len(calls) == 4
    state = data / "sessions" / "session_1" / "state.safetensors"
    assert state.read_bytes() == (paths.data_dir / "sessions" / "session_1" / "state.safetensors").read_bytes()
    metrics = json.loads((data / "sessions" / "session_1" / "metrics.json").read_text())
    assert metrics["history"]["loss"][-1] > 300
    # the verdict's own rule on the model's fit (loss_rose); the tiny session barely moves it (4.7738 -> 4.7736), so
    # "it fell" had no headroom (docs/research/test-headroom.md)
    fit = metrics["fit_loss"]
    learned("tiny_run.session1.fit_after_over_before", fit["after"] / fit["before"], "<=", ROSE_FACTOR)


def test_loss_rose_compares_the_fit_after_with_the_fit_before():
    assert not loss_rose(1.84, 0.3)  # a healthy session ends below where it began
    assert not loss_rose(1.0, 1.5) and loss_rose(1.0, 1.5001)
    assert loss_rose(1.0, float("nan")) and loss_rose(1.0, float("inf"))  # a non-finite model never passes


def test_missing_inputs_name_the_stage_to_run(tmp_path):
    params = write_params(tmp_path / "params.yaml")
    _assert_one_line_error(cli("stage", "base", "--params", str(params), "--data-dir", str(tmp_path / "d"), "-q"),
                           "pack.h5")
    _assert_one_line_error(cli("stage", "report", "--data-dir", str(tmp_path / "d")), "metrics.json")


@pytest.mark.parametrize("section,values,needles", [
    ("model", {"dim": 8}, ["model.dim", "14 classes", "ETF"]),  # TINY: 8 base + 3 sessions x 2 ways
    ("base", {"batch_size": 1000}, ["base.batch_size", "96 base training images"]),
    ("incremental", {"steps": [4, 4]}, ["incremental.steps", "one per session (3)"]),
])
def test_config_that_cannot_run_on_the_data_stops_at_prepare(tmp_path, section, values, needles):
    """Combinations known to fail only once the data's class count is known: one line naming the key at prepare,
    no pack left behind; the base stage refuses the same config before training."""
    params = write_params(tmp_path / "params.yaml", **{section: values})
    data = tmp_path / "data"
    _assert_one_line_error(cli("stage", "prepare", "--params", str(params), "--data-dir", str(data)), *needles)
    assert not (data / "pack.h5").exists()
    ok = write_params(tmp_path / "ok.yaml")
    assert cli("stage", "prepare", "--params", str(ok), "--data-dir", str(data)).exit_code == 0
    _assert_one_line_error(cli("stage", "base", "--params", str(params), "--data-dir", str(data), "-q"), *needles)
    assert not (data / "base").exists()


def test_session_list_is_checked(tmp_path):
    from pipeline.config import session_map

    data = tmp_path / "data"
    for sessions, needle in ((session_map(4), "sessions lists 4 incremental sessions but the data's protocol has 3"),
                             ({1: "data/features.zarr"}, "must be quoted"),
                             ({"1": "data/features.zarr", "2": "data/sessions/session_2"}, "sessions['2']"),
                             ({"1": "data/features.zarr", "3": "data/sessions/session_2"}, "sessions['2']")):
        params = write_params(tmp_path / "params.yaml", sessions=sessions)
        _assert_one_line_error(cli("stage", "prepare", "--params", str(params), "--data-dir", str(data)), needle)
        assert not (data / "pack.h5").exists()
    params = write_params(tmp_path / "params.yaml", sessions=session_map(3))
    assert cli("stage", "prepare", "--params", str(params), "--data-dir", str(data)).exit_code == 0
    printed = yaml.safe_load(cli("config", "sessions", "--count", "3").output)
    assert printed == {"sessions": session_map(3)} and list(printed["sessions"]) == ["1", "2", "3"]
    assert printed["sessions"]["2"] == "data/sessions/session_1"


def test_unexpected_error_is_one_line_with_the_trace_in_a_file(tmp_path, monkeypatch, capsys):
    """A bug (not bad input) still prints one line, exit 1, naming the file that holds the traceback;
    --debug raises it instead."""
    import stages.cli
    import stages.entry
    import stages.report

    def boom(*args, **kwargs):
        raise ZeroDivisionError("division by zero in a stage")

    monkeypatch.setattr(stages.report, "run", boom)
    with pytest.raises(SystemExit) as exit_info:
        stages.cli.main(["stage", "report", "--data-dir", str(tmp_path)])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unexpected ZeroDivisionError: division by zero in a stage")
    trace = err[0].split("full trace: ")[1].split(";")[0]
    text = open(trace).read()
    assert "Traceback" in text and "boom" in text
    with pytest.raises(ZeroDivisionError):
        stages.cli.main(["--debug", "stage", "report", "--data-dir", str(tmp_path)])
    stages.entry.DEBUG["on"] = False


def test_a_last_epochs_candidate_is_checked_against_the_runs_epochs() -> None:
    """selection.base_unaugmented_epochs: 300 is a valid candidate of a 400-epoch training (not held to the default
    200); the candidate's config then validates against its own base.epochs, with the one-line message."""
    cfg = build_config({**TINY_PARAMS, "base": {**TINY_PARAMS["base"], "epochs": 400},
                        "selection": {"base_unaugmented_epochs": [0, 300]}})
    assert with_values(cfg, {"base.unaugmented_epochs": 300}).base.unaugmented_epochs == 300
    with pytest.raises(FSCILError, match=r"base.unaugmented_epochs must be <= base.epochs \(200\)"):
        with_values(cfg, {"base.epochs": 200, "base.unaugmented_epochs": 300})
