"""Backbones: shape/finite/gradient invariants on small configs, reference shapes, init, freezing, weight loading."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from pipeline.errors import FSCILError
from pipeline.file_digest import file_digest
from pipeline.models.backbones import Backbone, build_backbone, load_pretrained, resnet12, resnet18, vit_b16
from tests.headroom import TEST_SEED, learned

# (registry name, constructor kwargs, input side): small enough for 2 CPU cores
SMALL = {
    "resnet12": ("resnet12", {"widths": (8, 16, 24, 32)}, 32),
    "resnet18_cifar": ("resnet18", {"stem": "cifar", "base_width": 8}, 32),
    "resnet18_imagenet": ("resnet18", {"stem": "imagenet", "base_width": 8}, 64),
    "vit_tiny": ("vit_b16", {"timm_name": "vit_tiny_patch16_224", "img_size": 32}, 32),
    # timm's Swin defaults to stochastic depth 0.1, which can drop a whole residual branch of a batch of 2
    "swin_tiny": ("swin_t", {"timm_name": "swin_tiny_patch4_window7_224", "img_size": 64, "drop_path_rate": 0.0}, 64),
}
# what stays trainable after freeze_for_base_training (None: everything)
TRAINABLE_AFTER_FREEZE = {
    "resnet12": None,
    "resnet18_cifar": None,
    "resnet18_imagenet": ("layer2.", "layer3.", "layer4."),
    "vit_tiny": ("model.blocks.11.", "model.norm."),
    "swin_tiny": ("model.layers.3.blocks.1.", "model.norm."),
}


def build_small(key: str) -> tuple[Backbone, int]:
    torch.manual_seed(0)
    name, kwargs, size = SMALL[key]
    return build_backbone(name, **kwargs), size


def images(n: int, size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("key", SMALL)
def test_output_is_the_map_feature_hw_predicts(key: str) -> None:
    model, size = build_small(key)
    out = model(images(2, size))
    assert out.shape == (2, model.out_channels, *model.feature_hw(size))
    assert torch.isfinite(out).all()
    assert out.std() > 0


@pytest.mark.parametrize("freeze", [False, True], ids=["all", "frozen"])
@pytest.mark.parametrize("key", SMALL)
def test_gradients_reach_trainable_parameters_only(key: str, freeze: bool) -> None:
    model, size = build_small(key)
    if freeze:
        model.freeze_for_base_training()
    out = model(images(2, size))
    # a random projection: a plain sum would be blind to everything before a final LayerNorm
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * weights).sum().backward()
    expected = TRAINABLE_AFTER_FREEZE[key]
    for name, param in model.named_parameters():
        trainable = not freeze or expected is None or name.startswith(expected)
        assert param.requires_grad == trainable, name
        if trainable:
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert param.grad is None, name
    if freeze and expected is not None:
        assert any(not p.requires_grad for p in model.parameters())
        assert any(p.requires_grad for p in model.parameters())


def test_frozen_batchnorm_keeps_its_statistics_in_train_mode() -> None:
    model, size = build_small("resnet18_imagenet")
    model.freeze_for_base_training()
    model.train()
    assert not model.bn1.training and not model.layer1.training
    assert model.layer2.training and model.layer4[1].bn2.training
    before_stem = model.bn1.running_mean.clone()
    before_layer2 = model.layer2[0].bn1.running_mean.clone()
    model(images(2, size))
    assert torch.equal(model.bn1.running_mean, before_stem)
    assert not torch.equal(model.layer2[0].bn1.running_mean, before_layer2)


@pytest.mark.parametrize("size, hw", [(32, (2, 2)), (84, (5, 5))])
def test_resnet12_reference_shapes(size: int, hw: tuple[int, int]) -> None:
    model = resnet12().eval()
    assert model.out_channels == 640 and model.feature_hw(size) == hw
    with torch.no_grad():
        assert model(images(1, size)).shape == (1, 640, *hw)


@pytest.mark.parametrize("stem, size, hw", [("imagenet", 224, (7, 7)), ("cifar", 32, (4, 4))])
def test_resnet18_reference_shapes(stem: str, size: int, hw: tuple[int, int]) -> None:
    model = resnet18(stem=stem).eval()
    assert model.out_channels == 512 and model.feature_hw(size) == hw
    with torch.no_grad():
        assert model(images(1, size)).shape == (1, 512, *hw)


def test_transformer_reference_shapes() -> None:
    # ViT-B/16 at 224 gives the paper's 14 x 14 x 768 token map; Swin-T at the reference's 384 gives 12 x 12 x 768
    vit = build_backbone("vit_b16").eval()
    swin = build_backbone("swin_t").eval()
    assert (vit.out_channels, vit.feature_hw(224)) == (768, (14, 14))
    assert (swin.out_channels, swin.feature_hw(384)) == (768, (12, 12))
    with torch.no_grad():
        assert swin(images(1, 384)).shape == (1, 768, 12, 12)
        assert vit(images(1, 224)).shape == (1, 768, 14, 14)


def test_resnet12_init() -> None:
    torch.manual_seed(TEST_SEED)
    model = resnet12()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0)
        elif isinstance(module, nn.Conv2d) and module.weight.numel() > 100_000:
            # kaiming normal, fan_out, leaky_relu with a = 0: std = sqrt(2 / (C_out * k * k))
            out_channels, _, kh, kw = module.weight.shape
            expected = math.sqrt(2.0 / (out_channels * kh * kw))
            n = module.weight.numel()
            learned(f"resnet12_init[{n}].conv_std_relative_error", abs(module.weight.std().item() / expected - 1),
                    "<=", 0.03)
            learned(f"resnet12_init[{n}].conv_mean_over_std", module.weight.mean().abs().item() / expected, "<", 0.05)


def test_resnet18_names_match_torchvision() -> None:
    import torchvision

    ours = resnet18().state_dict()
    theirs = torchvision.models.resnet18(weights=None).state_dict()
    assert set(theirs) - set(ours) == {"fc.weight", "fc.bias"}
    assert set(ours) <= set(theirs)
    assert all(ours[k].shape == theirs[k].shape for k in ours)


def trained_state(model: nn.Module, size: int) -> dict[str, torch.Tensor]:
    """A state dict whose BatchNorm statistics differ from the init (one train-mode pass)."""
    model.train()
    with torch.no_grad():
        model(images(4, size, seed=3))
    return {k: v.contiguous() for k, v in model.state_dict().items()}


def test_safetensors_round_trip_with_sha256(tmp_path: Path) -> None:
    widths = (8, 16, 24, 32)
    torch.manual_seed(0)
    source = resnet12(widths)
    path = tmp_path / "resnet12.safetensors"
    save_file(trained_state(source, 32), str(path))
    torch.manual_seed(1)
    loaded = resnet12(widths, pretrained=str(path), pretrained_sha256=file_digest(path).upper())
    x = images(2, 32)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x), source.eval()(x))
    with pytest.raises(FSCILError, match=re.escape(path.name) + ".*sha256 mismatch"):
        resnet12(widths, pretrained=str(path), pretrained_sha256="0" * 64)


def test_timm_round_trip_through_the_wrapper(tmp_path: Path) -> None:
    kwargs = {"timm_name": "vit_tiny_patch16_224", "img_size": 32}
    torch.manual_seed(0)
    source = vit_b16(**kwargs).eval()
    path = tmp_path / "vit.safetensors"
    save_file(source.state_dict(), str(path))  # keys "model.blocks...": the wrapper prefix is stripped on load
    torch.manual_seed(1)
    loaded = vit_b16(pretrained=str(path), **kwargs).eval()
    x = images(2, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.safetensors"
    with pytest.raises(FSCILError, match="not found.*absent.safetensors"):
        resnet12(pretrained=str(path))
    with pytest.raises(FSCILError, match="pretrained_sha256"):
        resnet12(pretrained_sha256="ab" * 32)


def test_shape_mismatch_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "narrow.safetensors"
    save_file(resnet12((8, 16, 24, 32)).state_dict(), str(path))
    with pytest.raises(FSCILError, match=r"narrow\.safetensors.*'layer4\.conv1\.weight'") as err:
        resnet12((8, 16, 24, 48), pretrained=str(path))
    assert "\n" not in str(err.value)


def test_missing_and_unexpected_keys(tmp_path: Path) -> None:
    model = resnet12((8, 16, 24, 32))
    state = model.state_dict()
    path = tmp_path / "partial.safetensors"
    save_file({k: v for k, v in state.items() if not k.startswith("layer4.")}, str(path))
    with pytest.raises(FSCILError, match="missing key 'layer4.conv1.weight'"):
        load_pretrained(model, path)
    load_pretrained(model, path, strict=False)
    extra = tmp_path / "extra.safetensors"
    save_file({**state, "projector.weight": torch.zeros(3)}, str(extra))
    with pytest.raises(FSCILError, match="unexpected key 'projector.weight'"):
        load_pretrained(model, extra)


def test_torchvision_checkpoint_with_fc_and_module_prefix(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = resnet18(base_width=8)
    state = trained_state(source, 64)
    # a DDP-saved classifier in the old torchvision format: "module." keys, an fc head, no num_batches_tracked
    checkpoint = {f"module.{k}": v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    checkpoint["module.fc.weight"] = torch.randn(10, 64)
    checkpoint["module.fc.bias"] = torch.randn(10)
    path = tmp_path / "resnet18-imagenet.pth"
    torch.save(checkpoint, path)
    torch.manual_seed(1)
    loaded = resnet18(base_width=8, pretrained=str(path))
    x = images(2, 64)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x), source.eval()(x))


def test_mmcls_style_checkpoint_keeps_the_backbone(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = resnet12((8, 16, 24, 32))
    state = {f"backbone.{k}": v for k, v in trained_state(source, 32).items()}
    state["neck.proj.weight"] = torch.zeros(4, 4)
    state["head.etf"] = torch.zeros(4, 4)
    path = tmp_path / "base_session.pth"
    torch.save({"meta": {"epoch": 200}, "state_dict": state}, path)
    loaded = resnet12((8, 16, 24, 32), pretrained=str(path))
    x = images(2, 32)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x), source.eval()(x))


class Payload:
    """Not a tensor: weights_only loading must refuse to unpickle it."""


def test_pickled_objects_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "code.pt"
    torch.save({"weight": torch.zeros(1), "payload": Payload()}, path)
    with pytest.raises(FSCILError, match="code.pt: cannot read weights"):
        load_pretrained(resnet12((8, 16, 24, 32)), path)
    bad_suffix = tmp_path / "weights.npz"
    bad_suffix.write_bytes(b"")
    with pytest.raises(FSCILError, match="unsupported weights format"):
        load_pretrained(resnet12((8, 16, 24, 32)), bad_suffix)


def test_bad_arguments_raise_fscil_error() -> None:
    with pytest.raises(FSCILError, match="unknown backbone 'resnet50'.*resnet12, resnet18, vit_b16, swin_t"):
        build_backbone("resnet50")
    with pytest.raises(FSCILError, match="unknown argument 'depth'"):
        build_backbone("resnet12", depth=12)
    with pytest.raises(FSCILError, match="stem"):
        build_backbone("resnet18", stem="tiny")
    with pytest.raises(FSCILError, match="widths"):
        build_backbone("resnet12", widths=(8, 16))
    with pytest.raises(FSCILError, match="SwinTransformer, expected a VisionTransformer"):
        build_backbone("vit_b16", timm_name="swin_tiny_patch4_window7_224")
    with pytest.raises(FSCILError, match="cannot build timm model 'no_such_model'"):
        build_backbone("swin_t", timm_name="no_such_model")
    vit, _ = build_small("vit_tiny")
    with pytest.raises(FSCILError, match="input size 64 differs from the img_size 32"):
        vit.feature_hw(64)
    with pytest.raises(FSCILError, match="too small"):
        resnet12((8, 16, 24, 32)).feature_hw(8)


def test_every_registered_backbone_has_its_config_arguments():
    """The config -> constructor table covers exactly the registry, so a new backbone cannot be half-registered."""
    from pipeline.models.backbones import BACKBONES
    from pipeline.models.fscil import BACKBONE_ARGS

    assert set(BACKBONE_ARGS) == set(BACKBONES)
