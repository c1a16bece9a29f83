"""`fscil select` for a named ablation row: the keys the row fixes are held, its projector is its own, and the
choice comes out nested under `variant_params.<row>`."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

import pipeline.research.selection as selection
from pipeline.config import build_config
from pipeline.errors import FSCILError
from pipeline.research.selection_config import SelectionConfig
from tests.selection_fixtures import TINY_SELECTION


def _without_loss_weights(params: dict) -> dict:
    """The tiny params without their own lambda1-3 (the rows fix them: a params value would be refused)."""
    return {**params, "incremental": {k: v for k, v in params["incremental"].items() if not k.startswith("lambda")}}


def test_a_variants_selection_holds_its_own_keys_and_writes_variant_params(real_pack, tmp_path, monkeypatch):
    """`fscil select` with `variant: dual_ssm`: the keys the row fixes (lambda1-3) are not selected (every candidate
    runs with the row's values), nor the suppression target its loss weights switch off, and selected.yaml nests the
    choice under variant_params.dual_ssm, so merged into params.yaml it changes that row alone."""
    params, paths = real_pack
    values = _without_loss_weights(yaml.safe_load(params.read_text()))
    cfg = build_config({**values, "variant": "dual_ssm"})
    seen: list = []

    def run(cand, *args):
        inc = cand.incremental
        seen.append((inc.lr, inc.freeze_base, inc.lambda1, inc.lambda2, inc.lambda3, inc.suppression))
        return {"avg": 60.0 + 5.0 * (inc.lr == 0.05), "final": 1.0, "pd": 1.0, "base": 1.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(**{**TINY_SELECTION, "lr": [0.1, 0.05], "lambda1": [1.0, 10.0],
                              "suppression": ["z", "mu_inc"]})
    lines: list[str] = []
    result = selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work", log=lines.append)
    # with the row's lambda1 = lambda2 = 0 the suppression loss is off, so its target is not selected either
    assert set(result["chosen"]) == {"incremental.lr", "model.k_paths", "incremental.inc_init",
                                     "incremental.freeze_base"}
    assert any(line.startswith("incremental.suppression not selected") for line in lines)
    assert result["chosen"]["incremental.lr"] == 0.05
    # the row's own values throughout, the suppression target at its configured value
    assert {s[2:] for s in seen} == {(0.0, 0.0, 0.0, cfg.incremental.suppression)}
    fragment = yaml.safe_load((tmp_path / "out" / "selected.yaml").read_text())
    assert list(fragment) == ["variant_params"] and fragment["variant_params"]["dual_ssm"]["incremental"][
        "lr"] == 0.05
    merged = {**values, **fragment}
    assert build_config({**merged, "variant": "dual_ssm"}).incremental.lr == 0.05
    assert build_config({**merged, "variant": "mlp_baseline"}).incremental.lr == cfg.incremental.lr != 0.05


def test_a_single_branch_rows_selection_runs_its_projector_and_refuses_what_it_lacks(real_pack, tmp_path,
                                                                                      monkeypatch):
    """`variant: single_ssm` selects its own session settings (here grad_clip_norm) on its own projector, nested
    under variant_params.single_ssm; a candidate its projector cannot take (g_inc started from g_base: it has no
    g_inc) is refused in one line before any pseudo pack is written."""
    params, paths = real_pack
    values = _without_loss_weights(yaml.safe_load(params.read_text()))
    cfg = build_config({**values, "variant": "single_ssm"})
    seen: list = []

    def run(cand, *args):
        seen.append((cand.model.projector, cand.incremental.grad_clip_norm))
        return {"avg": 60.0 + 2.0 * (cand.incremental.grad_clip_norm == 1.0), "final": 1.0, "pd": 1.0, "base": 1.0,
                "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(**{**TINY_SELECTION, "freeze_base": [False], "grad_clip_norm": [None, 1.0]})
    result = selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    assert {projector for projector, _ in seen} == {"single_ssm"} and {clip for _, clip in seen} == {None, 1.0}
    assert result["chosen"]["incremental.grad_clip_norm"] == 1.0
    fragment = yaml.safe_load((tmp_path / "out" / "selected.yaml").read_text())
    assert fragment["variant_params"]["single_ssm"]["incremental"]["grad_clip_norm"] == 1.0
    with pytest.raises(FSCILError, match=r"candidate incremental.inc_init='base'.*single_ssm") as err:
        selection.select(cfg, paths.pack, tmp_path / "out2", dataclasses.replace(sets, inc_init=["random", "base"]),
                         work_dir=tmp_path / "work2")
    assert "\n" not in str(err.value) and not (tmp_path / "work2").exists()
