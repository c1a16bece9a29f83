"""The assembled network: freezing after the base session reaches the backbone's BatchNorm statistics too."""

import torch

from pipeline.models.fscil import build_model
from tests.pipeline_fixtures import tiny_model_config


def test_freeze_base_stops_gradients_and_batchnorm_updates():
    cfg = tiny_model_config()
    model = build_model(cfg, num_classes=12, input_size=32, seed=0)
    model.freeze_base()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.projector.g_inc.in_proj.weight.normal_()  # open the gate so g_inc's x path gets gradient too
    logits = model(torch.randn(6, 3, 32, 32), num_seen=10, mode="incremental")
    assert logits.shape == (6, 10)
    logits.sum().backward()
    for name, p in model.named_parameters():
        trains = name.startswith("projector.g_inc.")
        assert p.requires_grad == trains, name
        assert (p.grad is not None and p.grad.abs().sum() > 0) == trains, name
    after = model.state_dict()
    for key in before:
        if key.startswith("backbone.") or key.startswith("projector.g_base.") or key.startswith("projector.p_iden"):
            assert torch.equal(before[key], after[key]), key  # running_mean / running_var / num_batches_tracked too
    assert not model.backbone.training and not model.projector.g_base.training and model.projector.g_inc.training


def test_build_model_is_seeded():
    cfg = tiny_model_config()
    a, b = build_model(cfg, 12, 32, seed=3).state_dict(), build_model(cfg, 12, 32, seed=3).state_dict()
    c = build_model(cfg, 12, 32, seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["projector.g_base.in_proj.weight"], c["projector.g_base.in_proj.weight"])
    assert torch.equal(a["classifier.weight"], c["classifier.weight"])  # the ETF has its own seed
