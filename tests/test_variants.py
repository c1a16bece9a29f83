"""Named ablation variants (pipeline/variants/): each paper row sets its projector *and* the losses it uses."""

from __future__ import annotations

import pytest

from pipeline.config import available_presets, available_variants, build_config
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
    if losses_on:  # the preset's (selected) weights are kept
        base = build_config(_params(preset, None))
        assert lambdas == (base.incremental.lambda1, base.incremental.lambda2, base.incremental.lambda3)
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
