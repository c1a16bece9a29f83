"""Named variants (pipeline/variants/): the paper's method, our additions, and each paper table's rows."""

from __future__ import annotations

import re

import pytest

from pipeline.config import (
    VARIANT_DIR,
    available_presets,
    available_variants,
    build_config,
    read_preset,
    variant_keys,
)
from pipeline.errors import FSCILError

ROWS = {  # paper table "ablation", one numbering: row -> (variant, projector, class-sensitive losses on?)
    1: ("mlp_baseline", "mlp", False),
    2: ("single_ssm", "single_ssm", False),
    3: ("dual_ssm", "dual_ssm", False),
    4: ("mamba_fscil", "dual_ssm", True),
}
# what the paper's method is (sections 3-4): frozen base parts in the sessions, suppression on Z, class-mean memory
PAPER_METHOD = {"model.projector": "dual_ssm", "model.classifier": "etf", "model.out_norm": False,
                "extract.memory": "mean", "incremental.freeze_base": True, "incremental.suppression": "z",
                "incremental.replay": "mean", "incremental.inc_init": "random", "incremental.vertex_match": False}
# where the authors' code computes otherwise, the paper presets set its form instead (tests/test_authors_forms.py)
AUTHORS_FORMS = {"cifar100": {"incremental.suppression"}, "mini_imagenet": {"incremental.suppression"},
                 "cub200": {"model.out_norm", "incremental.freeze_base"}}


def _params(preset: str, variant: str | None, **incremental) -> dict:
    data = {"root": "/nonexistent"} if preset != "synthetic" else {}
    if preset in ("cifar100", "mini_imagenet", "cub200"):
        data["split_dir"] = "/nonexistent"
    return {"preset": preset, "variant": variant, "data": data, **({"incremental": incremental} if incremental else {})}


def _get(cfg, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


@pytest.mark.parametrize("preset", available_presets())
@pytest.mark.parametrize("row", sorted(ROWS))
def test_ablation_rows_set_projector_and_losses_and_say_their_row(preset, row):
    variant, projector, losses_on = ROWS[row]
    cfg = build_config(_params(preset, variant))
    assert cfg.model.projector == projector and cfg.variant == variant
    lambdas = (cfg.incremental.lambda1, cfg.incremental.lambda2, cfg.incremental.lambda3)
    if losses_on:  # the preset's weights, both losses on
        top = read_preset(preset)["incremental"]
        assert lambdas == (top["lambda1"], top["lambda2"], top["lambda3"])
        assert cfg.incremental.lambda1 > 0 and cfg.incremental.lambda3 > 0
    else:
        assert lambdas == (0.0, 0.0, 0.0)
    first = (VARIANT_DIR / f"{variant}.yaml").read_text().splitlines()[0]
    assert re.search(rf"\brow {row}\b", first), first  # the file's own row number is the paper's


@pytest.mark.parametrize("preset", available_presets())
def test_mamba_fscil_is_the_papers_method_on_every_preset(preset):
    cfg = build_config(_params(preset, "mamba_fscil"))
    for key, value in PAPER_METHOD.items():
        if key in AUTHORS_FORMS.get(preset, ()):
            assert _get(cfg, key) != value and cfg.origins[key] == f"preset {preset}", key
            continue
        assert _get(cfg, key) == value, key
        assert cfg.origins[key] in ("variant mamba_fscil", f"preset {preset}", "default"), key
    assert cfg.incremental.lambda1 > 0 and cfg.incremental.lambda3 > 0
    # every preset's own values are the paper's method too: the variant changes nothing there
    plain = build_config(_params(preset, None))
    assert {k: v for k, v in plain.to_dict().items() if k != "variant"} == \
        {k: v for k, v in cfg.to_dict().items() if k != "variant"}


@pytest.mark.parametrize("preset", available_presets())
def test_mamba_fscil_plus_differs_from_the_paper_by_the_additions_its_files_list(preset):
    paper = build_config(_params(preset, "mamba_fscil")).to_dict()
    plus_cfg = build_config(_params(preset, "mamba_fscil_plus"))
    plus = plus_cfg.to_dict()
    listed = variant_keys("mamba_fscil_plus") | {
        f"{s}.{k}" for s, v in (read_preset(preset).get("variant_params") or {}).get(
            "mamba_fscil_plus", {}).items() for k in v}
    differ = {f"{s}.{k}" for s in paper if isinstance(paper[s], dict) for k in paper[s] if paper[s][k] != plus[s][k]}
    additions = {"incremental.freeze_base", "incremental.replay"} - AUTHORS_FORMS.get(preset, set())
    assert differ <= listed and additions <= differ  # CUB's base parts train in the authors' code too
    assert plus_cfg.incremental.freeze_base is False and plus_cfg.incremental.replay == "shots"


@pytest.mark.parametrize("target", ["z", "silu_z", "mu_inc"])
def test_suppression_rows_run_as_the_papers_table(target):
    """tab. supp_comparison: lambda2 = lambda3 = 0, lambda1 from the preset, the target named by the row."""
    cfg = build_config(_params("synthetic", f"supp_{target}"))
    assert cfg.incremental.suppression == target
    assert (cfg.incremental.lambda2, cfg.incremental.lambda3) == (0.0, 0.0) and cfg.incremental.lambda1 > 0
    assert cfg.incremental.freeze_base is True


def test_linear_row_and_the_variant_list():
    lin = build_config(_params("synthetic", "linear_ce"))
    assert lin.model.classifier == "linear" and lin.incremental.lambda3 > 0
    names = set(available_variants())
    assert {r[0] for r in ROWS.values()} | {"mamba_fscil_plus", "linear_ce", "supp_z"} <= names
    assert not names & {"dual_ssm_frozen", "dual_ssm_supp"}  # rows the paper's tables do not have
    with pytest.raises(FSCILError, match="variant 'nope' does not exist"):
        build_config(_params("synthetic", "nope"))


def test_single_branch_with_class_sensitive_losses_is_a_config_error():
    # it would suppress Z of g_base, the branch that carries the base classes
    with pytest.raises(FSCILError, match="incremental.lambda1 must be 0 with model.projector single_ssm"):
        build_config({"preset": "synthetic", "model": {"projector": "single_ssm"}})


@pytest.mark.parametrize("values,needle", [
    ({"linear": {}}, "names variant 'linear', which does not exist"),
    ({"linear_ce": {"incr": {"lr": 0.1}}}, "variant_params.linear_ce: unknown key incr"),
    ({"linear_ce": {"incremental": {"lrr": 0.1}}}, "variant_params.linear_ce: unknown key incremental.lrr"),
    ({"linear_ce": {"incremental": {"lr": 0}}}, "variant_params.linear_ce: incremental.lr must be > 0"),
    ({"linear_ce": 3}, "variant_params.linear_ce must map params sections"),
    ([1], "variant_params must be a mapping"),
])
def test_bad_variant_params_name_the_key(values, needle):
    with pytest.raises(FSCILError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        build_config({**_params("synthetic", None), "variant_params": values})
