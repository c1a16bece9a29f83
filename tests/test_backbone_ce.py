"""base.backbone_ce (ours): an auxiliary cross-entropy head on the backbone's pooled map during base training only."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from pipeline.config import load_config
from pipeline.config.sections import BaseConfig
from pipeline.models.fscil import build_model
from pipeline.models.registry import HEADS
from pipeline.research.selection import with_values
from pipeline.training.base_model import config_digest
from pipeline.training.base_resume import AUX_PREFIX, RESUME_FILE
from pipeline.training.base_session import _BaseNet, backbone_ce_head, base_loss, train_base
from pipeline.training.checkpoint import load_checkpoint
from tests.headroom import learned
from tests.pipeline_fixtures import tiny_model_config, write_params


def _tiny_model():
    return build_model(tiny_model_config(), 10, 32, seed=0)


def test_loss_is_the_dr_loss_plus_the_weighted_cross_entropy_of_the_mixed_targets():
    gen = torch.Generator().manual_seed(0)
    cos = torch.rand(6, 5, generator=gen, dtype=torch.float64) * 2 - 1
    aux = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    y_a, y_b = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 1, 0, 2, 4, 3])
    lam = torch.tensor([1.0, 0.3, 0.5, 0.9, 0.0, 0.7], dtype=torch.float64)
    cfg = BaseConfig(dr_scale=10.0, backbone_ce=0.4)
    # by hand: eq. loss_dr x 10 per target, lam-weighted, mean over the batch; CE likewise, x 0.4
    dr = [10 * (lam[i] * 0.5 * (cos[i, y_a[i]] - 1) ** 2 + (1 - lam[i]) * 0.5 * (cos[i, y_b[i]] - 1) ** 2)
          for i in range(6)]
    logp = torch.log_softmax(aux, dim=1)
    ce = [-(lam[i] * logp[i, y_a[i]] + (1 - lam[i]) * logp[i, y_b[i]]) for i in range(6)]
    expect = sum(dr) / 6 + 0.4 * sum(ce) / 6
    mixed = True  # a mixed batch (the paper's form weighs by lam alone either way)
    got = base_loss(HEADS["etf"], cfg, cos, aux, y_a, y_b, lam, mixed)
    assert torch.allclose(got, expect, rtol=1e-12, atol=0)
    # off: the DR loss alone, as before the option existed
    plain = base_loss(HEADS["etf"], BaseConfig(dr_scale=10.0), cos, None, y_a, y_b, lam, mixed)
    assert torch.allclose(plain, sum(dr) / 6, rtol=1e-12, atol=0)


def test_the_auxiliary_loss_reaches_the_backbone_and_its_head_only():
    model = _tiny_model()
    model.projector.g_inc.requires_grad_(False)
    assert backbone_ce_head(model, 10, 0.0) is None
    head = backbone_ce_head(model, 10, 1.0)
    assert head.in_features == model.backbone.out_channels and head.out_features == 10
    assert not head.weight.any() and not head.bias.any()  # zero start: deterministic, consumes no random numbers
    net = _BaseNet(model, 10, head)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 3, 5, 9])
    # the zero head's first gradient reaches only itself; once it is non-zero, the backbone too
    _, aux = net(x)
    F.cross_entropy(aux, y).backward()
    assert head.weight.grad.abs().sum() > 0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    with torch.no_grad():
        head.weight.normal_()
    model.zero_grad(set_to_none=True)
    _, aux = net(x)
    F.cross_entropy(aux, y).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.backbone.named_parameters()
               if p.requires_grad and n.endswith("weight"))
    # nothing of the projector or the ETF classifier: the auxiliary head reads the backbone map before them
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("backbone."))


def test_the_option_at_zero_keeps_every_digest(tmp_path):
    """An added field: at 0 it leaves the base model's digest as it was, so stored base models stay valid."""
    cfg = load_config(write_params(tmp_path / "params.yaml"))
    assert config_digest(with_values(cfg, {"base.backbone_ce": 0.0})) == config_digest(cfg)
    assert config_digest(with_values(cfg, {"base.backbone_ce": 1.0})) != config_digest(cfg)


def test_base_stage_trains_the_backbone_differently_and_saves_no_auxiliary_head(tiny_run, tmp_path):
    _, _, paths = tiny_run
    cfg = load_config(write_params(tmp_path / "params.yaml", base={"backbone_ce": 1.0}))
    ckpt_dir, out = tmp_path / "resume", tmp_path / "base"
    # interrupted after one epoch, then resumed: the auxiliary head and its momentum come back from the checkpoint
    assert train_base(cfg, paths.pack, out, ckpt_dir, stop_after_epoch=1, show_progress=False) == {}
    tensors, _ = load_checkpoint(ckpt_dir / RESUME_FILE)
    assert {k for k in tensors if k.startswith(AUX_PREFIX)} == {AUX_PREFIX + "weight", AUX_PREFIX + "bias"}
    assert "optim." + AUX_PREFIX + "weight" in tensors and tensors[AUX_PREFIX + "weight"].any()
    result = train_base(cfg, paths.pack, out, ckpt_dir, show_progress=False)
    straight = train_base(cfg, paths.pack, tmp_path / "straight", tmp_path / "resume2", show_progress=False)
    assert result["train_loss"] == straight["train_loss"]
    with_ce = load_file(str(out / "model.safetensors"))
    again = load_file(str(tmp_path / "straight" / "model.safetensors"))
    assert all(torch.equal(with_ce[k], again[k]) for k in with_ce)
    plain = load_file(str(paths.base / "model.safetensors"))
    assert with_ce.keys() == plain.keys()  # the saved base model has no auxiliary head: later stages read it as ever
    moved = [k for k in plain if not torch.equal(plain[k], with_ce[k])]
    assert any(k.startswith("backbone.") for k in moved)
    # the logged loss is the sum: above the plain run's DR loss in the first epoch
    reference = json.loads((paths.base / "metrics.json").read_text())
    learned("backbone_ce.first_epoch_loss_over_plain", result["train_loss"][0] - reference["train_loss"][0], ">", 0)
