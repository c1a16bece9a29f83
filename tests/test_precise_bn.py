"""base.precise_bn: BatchNorm statistics measured exactly on the test-time input after base training."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from pipeline.config import load_config
from pipeline.data.augment import test_transform
from pipeline.data.pack import ImagePack
from pipeline.data.presets import get_preset
from pipeline.models.backbones.resnet18 import ResNet18
from pipeline.models.fscil import build_model
from pipeline.training.base_session import train_base
from pipeline.training.precise_bn import recalibrate_batchnorm
from tests.headroom import TEST_SEED, learned
from tests.pipeline_fixtures import tiny_model_config, write_params


def _slim_backbone() -> nn.Module:
    model = build_model(tiny_model_config(), 10, 32, seed=0)
    return model.backbone


def _shift_statistics(net: nn.Module, x: torch.Tensor) -> None:
    """A few train-mode forwards of other data, so that the stored statistics are not those of `x`."""
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(3.0 * x.flip(0) + 1.0)
    net.eval()


def _normalised_moments(net: nn.Module, layers: list, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the per-channel mean and unbiased variance (float64) of (input - running_mean) / sqrt(running_var +
    eps) over all of `x` in one eval-mode forward: what the layer normalises at test time."""
    out = []

    def hook(mod, inputs):
        v = inputs[0].to(torch.float64).transpose(0, 1).reshape(inputs[0].shape[1], -1)
        z = (v - mod.running_mean.double()[:, None]) / torch.sqrt(mod.running_var.double()[:, None] + mod.eps)
        out.append((z.mean(dim=1), z.var(dim=1), mod.running_var.double()))

    handles = [layer.register_forward_pre_hook(hook) for layer in layers]
    net.eval()
    with torch.no_grad():
        net(x)
    for h in handles:
        h.remove()
    return out


def _assert_standardised(moments, tol=1e-4):
    for mean, var, running_var in moments:
        assert torch.allclose(mean, torch.zeros_like(mean), atol=tol)
        # var of (x - m) / sqrt(v + eps) with v the unbiased variance of x: v / (v + eps)
        assert torch.allclose(var, running_var / (running_var + 1e-5), atol=tol)


def test_recalibrated_layers_standardise_their_test_time_inputs():
    torch.manual_seed(TEST_SEED)
    net = _slim_backbone()
    x = torch.randn(60, 3, 32, 32) * 0.5 + 0.2
    _shift_statistics(net, x)
    layers = net.trained_batchnorms()
    before = _normalised_moments(net, layers, x)
    # the oracle tells the two states apart
    learned("precise_bn.normalised_mean_before", max(m.abs().max().item() for m, _, _ in before), ">", 0.1)
    count = recalibrate_batchnorm(net, layers, lambda: (x[i:i + 7] for i in range(0, len(x), 7)))
    assert count == len(layers) == 16
    # every layer, the later ones measured through the recalibrated earlier ones: zero mean, unit variance
    _assert_standardised(_normalised_moments(net, layers, x))
    assert not net.training


def test_recalibration_does_not_depend_on_the_batch_size_and_keeps_the_mode():
    torch.manual_seed(1)
    x = torch.randn(40, 3, 32, 32)
    stats = []
    for size in (5, 40):
        net = _slim_backbone()
        _shift_statistics(net, x)
        net.train()
        recalibrate_batchnorm(net, net.trained_batchnorms(), lambda s=size: (x[i:i + s] for i in range(0, 40, s)))
        assert net.training  # the caller's mode comes back
        stats.append([(b.running_mean.clone(), b.running_var.clone()) for b in net.trained_batchnorms()])
    for (m1, v1), (m2, v2) in zip(*stats, strict=True):
        assert torch.allclose(m1, m2, rtol=1e-5, atol=1e-6) and torch.allclose(v1, v2, rtol=1e-5, atol=1e-6)
    weights = {k: v for k, v in _slim_backbone().state_dict().items() if "running" not in k and "num_batches" not in k}
    assert weights  # recalibration touches buffers only: a fresh net's weights equal the recalibrated one's
    net = _slim_backbone()
    recalibrate_batchnorm(net, net.trained_batchnorms(), lambda: iter([x]))
    for key, value in weights.items():
        assert torch.equal(net.state_dict()[key], value), key


def test_frozen_batchnorms_keep_their_statistics():
    torch.manual_seed(2)
    net = ResNet18(stem="imagenet", base_width=8)
    net.freeze_for_base_training()  # the pretrained stem and layer1 stay as loaded
    x = torch.randn(12, 3, 64, 64)
    frozen = {n: (m.running_mean.clone(), m.running_var.clone()) for n, m in net.named_modules()
              if isinstance(m, nn.BatchNorm2d) and n.startswith(("bn1", "layer1"))}
    assert frozen
    trained = net.trained_batchnorms()
    assert trained and not any(b is dict(net.named_modules())[n] for n in frozen for b in trained)
    recalibrate_batchnorm(net, trained, lambda: iter([x[:6], x[6:]]))
    for name, (mean, var) in frozen.items():
        module = dict(net.named_modules())[name]
        assert torch.equal(module.running_mean, mean) and torch.equal(module.running_var, var)
    _assert_standardised(_normalised_moments(net, trained, x))


def test_empty_image_set_is_an_error():
    net = _slim_backbone()
    with pytest.raises(ValueError, match="no images"):
        recalibrate_batchnorm(net, net.trained_batchnorms(), lambda: iter([]))


def test_base_stage_with_precise_bn_changes_only_the_backbone_statistics(tiny_run, tmp_path):
    _, _, paths = tiny_run
    cfg = load_config(write_params(tmp_path / "params.yaml", base={"precise_bn": True}))
    result = train_base(cfg, paths.pack, tmp_path / "base", tmp_path / "resume", show_progress=False)
    plain = load_file(str(paths.base / "model.safetensors"))
    precise = load_file(str(tmp_path / "base" / "model.safetensors"))
    assert plain.keys() == precise.keys()
    stats = [k for k in plain if k.startswith("backbone.") and k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 2 * result["precise_bn_layers"] == 32
    for key in plain:
        same = torch.equal(plain[key], precise[key])
        assert same != (key in stats), key  # the weights are the same training's; every statistic moved
    assert json.loads((paths.base / "metrics.json").read_text())["precise_bn_layers"] == 0
    # the stored statistics standardise the test-transformed base training images, layer by layer
    model = build_model(cfg.model, 14, 32, seed=cfg.seed)
    model.load_state_dict(precise)
    with ImagePack.open(paths.pack) as pack:
        ids = np.asarray(pack.protocol.sessions[0].train_ids)
        x = test_transform(torch.from_numpy(pack.read_images(ids)), get_preset(pack.preset, pack.image_size))
        assert pack.protocol.num_classes == 14  # the model above was built for it
    _assert_standardised(_normalised_moments(model.backbone, model.backbone.trained_batchnorms(), x), tol=1e-3)
