"""`fscil speed`: every stage of a run timed once, on a scratch folder that is removed after."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.pipeline_fixtures import NUM_SESSIONS, TINY_MODEL, cli, write_params


def test_speed_times_every_stage_and_keeps_nothing_but_the_table(tmp_path):
    params = write_params(tmp_path / "params.yaml")
    out = tmp_path / "speed"
    result = cli("speed", "--params", str(params), "--out", str(out))
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "speed.csv")
    sessions = [f"session {s}" for s in range(1, NUM_SESSIONS + 1)]
    assert list(table.stage) == ["prepare", "base", "extract", *sessions, "report", "sessions (all)", "total"]
    stages = table.iloc[:-2]
    assert (stages.seconds > 0).all()
    assert table.set_index("stage").seconds["total"] == pytest.approx(stages.seconds.sum(), abs=0.02)
    assert table.set_index("stage").seconds["sessions (all)"] == pytest.approx(
        stages[stages.stage.isin(sessions)].seconds.sum(), abs=0.02)
    base = table.set_index("stage").loc["base"]
    assert base.epochs == 3 and base.images_per_second > 0 and 0 <= base.acc <= 100
    assert table.peak_gpu_mib.isna().all()  # a CPU run: no GPU memory to report
    text = (out / "speed.md").read_text()
    assert text.startswith("`fscil speed`: preset synthetic") and "on CPU (" in text and "| session 3 " in text
    assert not (tmp_path / "speed.work").exists()


def test_base_epochs_times_the_first_epochs_and_estimates_the_whole_run(tmp_path):
    params = write_params(tmp_path / "params.yaml")
    out = tmp_path / "speed"
    result = cli("speed", "--params", str(params), "--out", str(out), "--base-epochs", "1")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "speed.csv").set_index("stage")
    assert table.index[-1] == "total, 3 base epochs (estimated)" and table.epochs.iloc[-1] == 3
    assert table.loc["base", "epochs"] == 1
    # the two epochs not run, at the pace measured: 96 images an epoch (8 classes x 12) at the base row's images/s
    rest = table.seconds.iloc[-1] - table.loc["total", "seconds"]
    assert rest == pytest.approx(2 * 96 / table.loc["base", "images_per_second"], rel=0.01, abs=0.02)
    assert cli("speed", "--params", str(params), "--out", str(out), "--base-epochs", "0").exit_code == 2


def test_a_paper_preset_runs_at_its_shape_without_its_dataset(tmp_path):
    """The CIFAR-100 preset with one data key changed (its sizes cut for a CPU, D' 128 >= its 100 classes):
    60 base classes + 8 sessions of 5-way 5-shot, as the preset says; the kept work folder holds its pack, and a pack
    cache builds it once for two runs."""
    model = [f"model.{k}={v}" for k, v in TINY_MODEL.items() if k not in ("backbone_widths", "dim")]
    sets = ["+data.source=synthetic", "data.train_per_class=9", "data.test_per_class=2",
            "data.novel_pool_per_class=5", "model.backbone_widths=[8,8,16,16]", "model.dim=128", *model,
            "base.epochs=1", "base.repeat=1", "base.checkpoint_every=1", "base.batch_size=256", "incremental.steps=[1]",
            "threads=2", "device=cpu"]
    params = tmp_path / "params.yaml"
    params.write_text("preset: cifar100\nvariant: mamba_fscil\n")
    args = ["speed", "--params", str(params), "--out", str(tmp_path / "speed"), "--keep"]
    for value in sets:
        args += ["-S", value]
    result = cli(*args)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "speed" / "speed.csv")
    assert list(table.stage)[3:11] == [f"session {s}" for s in range(1, 9)]
    from pipeline.data.pack import ImagePack

    (path,) = (tmp_path / "speed.work").glob("*.h5")
    with ImagePack.open(path) as pack:
        assert (pack.preset, pack.image_size, pack.protocol.num_classes) == ("cifar100", 32, 100)
    # a second run on the same data with a pack cache: the pack is built once, then reused
    again = [a for a in args if a != "--keep"] + ["--pack-cache", str(tmp_path / "packs")]
    for run in range(2):
        assert cli(*again).exit_code == 0
        assert pd.read_csv(tmp_path / "speed" / "speed.csv").set_index("stage").loc["prepare", "cached"] == bool(run)
    assert len(list((tmp_path / "packs").glob("*.h5"))) == 1
