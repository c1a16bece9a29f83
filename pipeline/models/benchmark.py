"""`fscil model benchmark`: forward and forward+backward time of one projector branch (median of repeats)."""

from __future__ import annotations

import statistics
import time

import torch

from pipeline.config import preset_model_config


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def benchmark_branch(preset: str, overrides: dict, batch: int, channels: int, hw: int, repeats: int,
                     device: str = "cpu") -> dict:
    from pipeline.models.projector import PROJECTOR_KINDS
    from pipeline.models.ss2d import BranchDims

    cfg, _ = preset_model_config(preset, overrides)
    torch.manual_seed(0)
    branch = PROJECTOR_KINDS[cfg.projector].branch(channels, (hw, hw), BranchDims.from_config(cfg)).to(device)
    f = torch.randn(batch, channels, hw, hw, device=device)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def forward():
        with torch.no_grad():
            branch(f)
        sync()

    def forward_backward():
        branch.zero_grad(set_to_none=True)
        branch(f).square().sum().backward()
        sync()

    return {"preset": preset, "projector": cfg.projector, "batch": batch, "map": f"{channels}x{hw}x{hw}",
            "dim": cfg.dim, "d_state": cfg.d_state, "k_paths": cfg.k_paths, "threads": torch.get_num_threads(),
            "device": device, "repeats": repeats,
            "forward_ms": round(_median_ms(forward, repeats), 2),
            "forward_backward_ms": round(_median_ms(forward_backward, repeats), 2)}
