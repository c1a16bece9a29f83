"""Cross scan orders against hand-written index lists, and cross merge as its adjoint."""

from __future__ import annotations

import pytest
import torch

from pipeline.ops.cross_scan import cross_merge, cross_scan

# a 2 x 3 map whose values are the row-major token ids:
#   0 1 2
#   3 4 5
ROW_MAJOR = [0, 1, 2, 3, 4, 5]
COLUMN_MAJOR = [0, 3, 1, 4, 2, 5]
PATHS = [ROW_MAJOR, ROW_MAJOR[::-1], COLUMN_MAJOR, COLUMN_MAJOR[::-1]]


def token_id_map(n=2, d=3):
    """(n, d, 2, 3) map with value token_id + 100 * channel + 1000 * sample."""
    ids = torch.arange(6, dtype=torch.float64).view(1, 1, 2, 3)
    return ids + 100 * torch.arange(d).view(1, d, 1, 1) + 1000 * torch.arange(n).view(n, 1, 1, 1)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_cross_scan_orders(k):
    x = token_id_map()
    ys = cross_scan(x, k)
    assert ys.shape == (2, k, 3, 6)
    offsets = 100 * torch.arange(3).view(1, 3, 1) + 1000 * torch.arange(2).view(2, 1, 1)
    for path in range(k):
        expected = torch.tensor(PATHS[path], dtype=torch.float64) + offsets
        torch.testing.assert_close(ys[:, path], expected, atol=0, rtol=0)


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("hw", [(2, 3), (4, 4), (1, 5)])
def test_merge_of_scan_is_k_times_row_major(k, hw):
    h, w = hw
    x = torch.randn(3, 5, h, w)
    merged = cross_merge(cross_scan(x, k), h, w)
    torch.testing.assert_close(merged, k * x.flatten(2), atol=0, rtol=0)


def test_merge_maps_each_path_back_to_row_major():
    # path p carries the value 10**p at its position i, tagged by the row-major token it came from
    y = torch.zeros(1, 4, 1, 6, dtype=torch.float64)
    for p, order in enumerate(PATHS):
        for i, token in enumerate(order):
            y[0, p, 0, i] = 10**p * (token + 1)
    merged = cross_merge(y, 2, 3)
    expected = torch.tensor([1111.0 * (token + 1) for token in ROW_MAJOR], dtype=torch.float64).view(1, 1, 6)
    torch.testing.assert_close(merged, expected, atol=0, rtol=0)


def test_merge_single_path_at_column_major_positions():
    # only path 2: position i holds column-major token COLUMN_MAJOR[i]
    y = torch.zeros(1, 4, 1, 6)
    y[0, 2, 0] = torch.tensor([10.0, 13.0, 11.0, 14.0, 12.0, 15.0])
    torch.testing.assert_close(cross_merge(y, 2, 3), torch.tensor([[[10.0, 11.0, 12.0, 13.0, 14.0, 15.0]]]))


def test_gradients_flow_through_scan_and_merge():
    x = torch.randn(2, 3, 2, 3, requires_grad=True)
    weights = torch.randn(2, 4, 3, 6)
    (cross_merge(cross_scan(x, 4) * weights, 2, 3) ** 2).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("k", [0, 3, 8])
def test_bad_k_raises(k):
    with pytest.raises(ValueError):
        cross_scan(torch.zeros(1, 2, 2, 3), k)
    with pytest.raises(ValueError):
        cross_merge(torch.zeros(1, k, 2, 6), 2, 3)


def test_merge_rejects_wrong_length():
    with pytest.raises(ValueError):
        cross_merge(torch.zeros(1, 4, 2, 6), 2, 4)
