"""Frozen work done once: with p_iden and g_base frozen, a session computes their output for its stored maps once
(Projector.frozen_outputs) and every step and the fit-loss passes reuse it; the session's results are those of
recomputing them every step."""

from __future__ import annotations

import torch

from pipeline.config import load_config
from pipeline.models.projector import Projector
from pipeline.training.checkpoint import load_checkpoint
from pipeline.training.incremental_session import STATE_FILE, train_session
from tests.pipeline_fixtures import TINY_MODEL, write_params

CHANNELS = TINY_MODEL["backbone_widths"][-1]


def test_frozen_outputs_are_the_parts_they_replace(tiny_run):
    projector = Projector.from_config(load_config(tiny_run[1]).model, CHANNELS, (2, 2))
    f = torch.randn(10, CHANNELS, 2, 2)
    assert projector.frozen_outputs(f, 4) is None  # p_iden / g_base train: nothing to keep
    projector.freeze_base()
    mu_iden, mu_base = projector.frozen_outputs(f, 4)  # in batches of 4: 4 + 4 + 2 rows
    with torch.no_grad():
        out = projector(f, mode="incremental")
        cached = projector(f, mode="incremental", frozen=(mu_iden, mu_base))
    for got, want in ((mu_iden, out.mu_iden), (mu_base, out.mu_base), (cached.mu, out.mu)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_a_session_runs_the_frozen_parts_once_with_the_same_results(tiny_run, tmp_path, monkeypatch):
    _, _, paths = tiny_run
    params = write_params(tmp_path / "p.yaml", incremental={"steps": [12], "batch_size": 8, "freeze_base": True})
    cfg = load_config(params)
    branch = type(Projector.from_config(cfg.model, CHANNELS, (2, 2)).g_base)
    forward, calls = branch.forward, []

    def counted(self, *args, **kwargs):
        calls.append(self)
        return forward(self, *args, **kwargs)

    def session(name: str):
        calls.clear()
        result = train_session(cfg, 1, paths.features, paths.base, None, tmp_path / name, show_progress=False,
                               progress_lines=False)
        return result, load_checkpoint(tmp_path / name / STATE_FILE)[0], len(calls)

    monkeypatch.setattr(branch, "forward", counted)
    once, once_state, once_calls = session("once")
    monkeypatch.setattr(Projector, "frozen_outputs", lambda self, f, batch_size: None)
    every, every_state, every_calls = session("every")
    # without the cache g_base runs in each of the 12 steps and in the two fit-loss passes (one batch each); with it,
    # once for the session's maps (one batch); the evaluation passes are the same in both
    assert every_calls - once_calls == 12 + 2 - 1
    for a, b in zip(once["history"]["loss"], every["history"]["loss"], strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b))
    assert once["acc"] == every["acc"] and once["base_acc"] == every["base_acc"]
    assert once_state.keys() == every_state.keys()
    for key, value in once_state.items():
        torch.testing.assert_close(value, every_state[key], rtol=1e-5, atol=1e-6)
