"""Named ablation variants (pipeline/variants/): each paper row sets its projector *and* the losses it uses."""

from __future__ import annotations

import pytest

from pipeline.config import PRESET_DIR, available_presets, available_variants, build_config, read_yaml
from pipeline.errors import FSCILError

ROWS = {  # paper table "ablation": (projector, class-sensitive losses on?)
    "mlp_baseline": ("mlp", False),
    "single_ssm": ("single_ssm", False),
    "dual_ssm": ("dual_ssm", False),
    "dual_ssm_frozen": ("dual_ssm", False),
    "mamba_fscil": ("dual_ssm", True),
}
CPU_PRESETS = ("synthetic", "omniglot")


def _params(preset: str, variant: str, **incremental) -> dict:
    data = {"root": "/nonexistent"} if preset != "synthetic" else {}
    if preset in ("cifar100", "mini_imagenet", "cub200"):
        data["split_dir"] = "/nonexistent"
    return {"preset": preset, "variant": variant, "data": data, "incremental": incremental}


@pytest.mark.parametrize("preset", available_presets())
@pytest.mark.parametrize("variant", sorted(ROWS))
def test_ablation_rows_set_projector_and_losses(preset, variant):
    cfg = build_config(_params(preset, variant))
    projector, losses_on = ROWS[variant]
    assert cfg.model.projector == projector and cfg.variant == variant
    lambdas = (cfg.incremental.lambda1, cfg.incremental.lambda2, cfg.incremental.lambda3)
    if losses_on:  # the preset's (selected) weights are kept: its top-level values (every preset sets them)
        top = read_yaml(PRESET_DIR / f"{preset}.yaml")["incremental"]
        assert lambdas == (top["lambda1"], top["lambda2"], top["lambda3"])
        assert cfg.incremental.lambda1 > 0
    else:
        assert lambdas == (0.0, 0.0, 0.0)


def test_supp_only_and_linear_rows():
    supp = build_config(_params("synthetic", "dual_ssm_supp"))
    full = build_config(_params("synthetic", "mamba_fscil"))
    assert supp.incremental.lambda3 == 0 and supp.incremental.lambda1 == full.incremental.lambda1
    lin = build_config(_params("synthetic", "linear_ce"))
    assert lin.model.classifier == "linear" and full.model.classifier == "etf"
    assert set(available_variants()) >= set(ROWS) | {"dual_ssm_supp", "linear_ce"}


def test_a_variant_wins_on_the_keys_it_sets_and_unknown_variant_is_an_error():
    cfg = build_config(_params("synthetic", "mamba_fscil", lambda1=3.0))
    assert cfg.incremental.lambda1 == 3.0  # mamba_fscil leaves the weights to the preset / params
    row3 = build_config(_params("synthetic", "dual_ssm", lambda1=3.0, lambda3=0.5, lr=0.05))
    assert (row3.incremental.lambda1, row3.incremental.lambda3) == (0.0, 0.0)  # the row has no such losses
    assert row3.incremental.lr == 0.05  # keys it does not set still come from params
    with pytest.raises(FSCILError, match="variant 'nope' does not exist"):
        build_config(_params("synthetic", "nope"))


def test_single_branch_with_class_sensitive_losses_is_a_config_error():
    # it would suppress Z of g_base, the branch that carries the base classes
    with pytest.raises(FSCILError, match="incremental.lambda1 must be 0 with model.projector single_ssm"):
        build_config({"preset": "synthetic", "model": {"projector": "single_ssm"}})


@pytest.mark.parametrize("preset", available_presets())
def test_the_frozen_dual_row_differs_from_dual_only_in_freezing(preset):
    """dual_ssm follows the preset's selected freeze_base; dual_ssm_frozen is the paper's frozen design. Everything
    else, the base model's sections included (so a study shares one base model between them), is the same."""
    dual, frozen = (build_config(_params(preset, v)) for v in ("dual_ssm", "dual_ssm_frozen"))
    assert frozen.incremental.freeze_base is True
    assert dual.incremental.freeze_base == build_config(_params(preset, None)).incremental.freeze_base
    a, b = dual.to_dict(), frozen.to_dict()
    assert {k for k in a if a[k] != b[k]} <= {"variant", "incremental"}
    assert {k for k in a["incremental"] if a["incremental"][k] != b["incremental"][k]} <= {"freeze_base"}


def test_variant_params_apply_to_their_variant_only_params_over_preset_variant_keys_last(tmp_path, monkeypatch):
    """`variant_params` (values `fscil select` chose for one variant): the preset's entry, then params.yaml's, over
    the preset for that variant alone; the variant's own keys still win (a row is what its name says)."""
    import yaml

    import pipeline.config as config

    preset = yaml.safe_load((config.PRESET_DIR / "synthetic.yaml").read_text())
    preset["variant_params"] = {"linear_ce": {"incremental": {"lr": 0.01, "grad_clip_norm": 2.0}},
                                "dual_ssm_frozen": {"incremental": {"lr": 0.03, "lambda1": 5.0}}}
    (tmp_path / "tuned.yaml").write_text(yaml.safe_dump(preset))
    monkeypatch.setattr(config, "PRESET_DIR", tmp_path)
    lin = build_config(_params("tuned", "linear_ce"))
    assert (lin.incremental.lr, lin.incremental.grad_clip_norm, lin.model.classifier) == (0.01, 2.0, "linear")
    plain = build_config(_params("tuned", "dual_ssm"))
    assert (plain.incremental.lr, plain.incremental.grad_clip_norm) == (preset["incremental"]["lr"], None)
    frozen = build_config(_params("tuned", "dual_ssm_frozen"))
    assert frozen.incremental.lr == 0.03 and frozen.incremental.lambda1 == 0.0  # the row has no suppression
    # params.yaml's entry over the preset's, key by key; a plain params.yaml key does not beat a variant's value
    params = {**_params("tuned", "linear_ce", lr=0.5), "variant_params": {"linear_ce": {"incremental": {"lr": 0.02}}}}
    lin = build_config(params)
    assert (lin.incremental.lr, lin.incremental.grad_clip_norm) == (0.02, 2.0)
    assert build_config({**params, "variant": None}).incremental.lr == 0.5


@pytest.mark.parametrize("values,needle", [
    ({"linear": {}}, "names variant 'linear', which does not exist"),
    ({"linear_ce": {"incr": {"lr": 0.1}}}, "variant_params.linear_ce.incr is not a params section"),
    ({"linear_ce": {"incremental": {"lrr": 0.1}}}, "variant_params.linear_ce: unknown key incremental.lrr"),
    ({"linear_ce": {"incremental": {"lr": 0}}}, "variant_params.linear_ce: incremental.lr must be > 0"),
    ({"linear_ce": 3}, "variant_params.linear_ce must map params sections"),
    ([1], "variant_params must be a mapping"),
])
def test_bad_variant_params_name_the_key(values, needle):
    with pytest.raises(FSCILError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        build_config({**_params("synthetic", None), "variant_params": values})
    with pytest.raises(FSCILError, match="must be > 0"):  # the same when that variant is built
        build_config({**_params("synthetic", "linear_ce"), "variant_params": {"linear_ce": {"incremental": {"lr": 0}}}})


def test_a_preset_runs_the_variant_it_names_when_params_name_none():
    """omniglot's selection chose row 3 (dual_ssm, the loss switched off): with no variant in params its stages run
    that row with the values selected for it, so `dvc repro` gives the selected method; a variant in params wins."""
    plain, dual = (build_config(_params("omniglot", v)) for v in (None, "dual_ssm"))
    assert plain.variant == "dual_ssm" and plain.to_dict() == dual.to_dict()
    assert plain.model.out_norm and plain.incremental.inc_init == "base" and plain.incremental.vertex_match
    assert (plain.incremental.lambda1, plain.incremental.lambda3) == (0.0, 0.0)
    full = build_config(_params("omniglot", "mamba_fscil"))
    assert full.variant == "mamba_fscil" and full.incremental.lambda1 == 30.0
    assert build_config(_params("synthetic", None)).variant is None  # the default runs its top-level values
