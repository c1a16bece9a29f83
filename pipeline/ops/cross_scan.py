"""Cross scan: unfold a 2-D feature map into K 1-D token sequences for the SS2D branch, and back.

Scan paths, in the paper's order (section 4.2.1), for an H x W map with L = H * W tokens:
    0: row-major, top-left to bottom-right      token i = (i // W, i % W)
    1: path 0 reversed
    2: column-major (transpose, then flatten)   token i = (i % H, i // H)
    3: path 2 reversed
K = 1 uses path 0, K = 2 paths 0 and 1, K = 4 all four.
"""

from __future__ import annotations

import torch
from torch import Tensor

SCAN_COUNTS = (1, 2, 4)


def _check_k(k: int) -> None:
    if k not in SCAN_COUNTS:
        raise ValueError(f"number of scan paths must be one of {SCAN_COUNTS}, got {k}")


def cross_scan(x: Tensor, k: int) -> Tensor:
    """Unfold a map into k scan paths.

    x: (N, D, H, W) -> (N, K, D, L) with L = H * W.
    """
    _check_k(k)
    row = x.flatten(2)  # (N, D, L)
    paths = [row]
    if k >= 2:
        paths.append(row.flip(-1))
    if k == 4:
        col = x.transpose(2, 3).flatten(2)
        paths += [col, col.flip(-1)]
    return torch.stack(paths, dim=1)


def cross_merge(y: Tensor, h: int, w: int) -> Tensor:
    """Map every scan path back to row-major token order and sum over paths.

    y: (N, K, D, L) with L = h * w -> (N, D, L).
    """
    n, k, d, length = y.shape
    _check_k(k)
    if length != h * w:
        raise ValueError(f"sequence length {length} does not match an {h} x {w} map")
    out = y[:, 0]
    if k >= 2:
        out = out + y[:, 1].flip(-1)
    if k == 4:
        # both column-major paths in column-major order, then transposed back to row-major
        col = y[:, 2] + y[:, 3].flip(-1)
        out = out + col.view(n, d, w, h).transpose(2, 3).reshape(n, d, length)
    return out
