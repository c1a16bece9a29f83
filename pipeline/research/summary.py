"""`fscil model summary`: parameter counts per component for a preset's model section with overrides."""

from __future__ import annotations

import dataclasses

from pipeline.config import preset_model_config
from pipeline.errors import FSCILError

# total classes of each benchmark (the synthetic default's comes from its data section)
DATASET_CLASSES = {"cifar100": 100, "mini_imagenet": 100, "cub200": 200}


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def summarise_model(preset: str, overrides: dict, num_classes: int | None = None, input_size: int | None = None
                    ) -> dict:
    from pipeline.data.presets import get_preset
    from pipeline.models.fscil import build_model

    model_cfg, merged = preset_model_config(preset, overrides)
    dataset = merged["data"].get("dataset", "synthetic")
    if num_classes is None:
        num_classes = DATASET_CLASSES.get(dataset, 100)
    input_size = input_size or get_preset(dataset, merged["data"].get("image_size")).input_size
    if num_classes < 2:
        raise FSCILError(f"--num-classes must be >= 2, got {num_classes}")
    model = build_model(model_cfg, num_classes, input_size)
    p = model.projector
    dual = p.g_inc is not None
    components = {
        "backbone": {"parameters": _count(model.backbone), "trains_in": "base"},
        "p_iden": {"parameters": _count(p.p_iden), "trains_in": "base"},
        "g_base": {"parameters": _count(p.g_base), "trains_in": "base" if dual else "base + incremental"},
        "g_inc": {"parameters": _count(p.g_inc), "trains_in": "incremental" if dual else "-"},
        "classifier": {"parameters": _count(model.classifier),
                       "trains_in": "fixed (ETF buffer)" if model_cfg.classifier == "etf" else "all sessions"},
    }
    c = model.backbone.out_channels
    h, w = model.backbone.feature_hw(input_size)
    return {"preset": preset, "model": dataclasses.asdict(model_cfg), "num_classes": num_classes,
            "input_size": input_size, "feature_map": f"{c}x{h}x{w}", "components": components,
            "total_parameters": sum(r["parameters"] for r in components.values())}
