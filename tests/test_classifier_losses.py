"""ETF closed-form properties and the losses against hand computations."""

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.data.mixing import feature_mixup, mixup_draws
from pipeline.losses.class_sensitive import separation_loss, suppression_loss
from pipeline.losses.classification import cross_entropy_loss, dot_regression_loss, mixed_loss
from pipeline.losses.registry import SUPPRESSION_TARGETS
from pipeline.models.classifier import ETFClassifier, LinearClassifier, simplex_etf
from pipeline.models.ss2d import BranchAux


@pytest.mark.parametrize("d,k", [(16, 10), (128, 100), (640, 100)])
def test_etf_is_a_simplex(d, k):
    w = simplex_etf(d, k, seed=3).double()
    torch.testing.assert_close(w.norm(dim=0), torch.ones(k, dtype=torch.float64), atol=1e-6, rtol=0)
    cos = w.T @ w
    off = cos[~torch.eye(k, dtype=torch.bool)]
    torch.testing.assert_close(off, torch.full_like(off, -1.0 / (k - 1)), atol=1e-6, rtol=0)
    assert torch.equal(simplex_etf(d, k, seed=3), simplex_etf(d, k, seed=3))
    assert not torch.equal(simplex_etf(d, k, seed=3), simplex_etf(d, k, seed=4))


def test_etf_is_a_fixed_buffer_and_masks_unseen_classes():
    head = ETFClassifier(16, 10)
    assert list(head.parameters()) == [] and "weight" in dict(head.named_buffers())
    mu = torch.randn(4, 16)
    logits = head(mu, num_seen=6)
    assert logits.shape == (4, 6)
    torch.testing.assert_close(logits, F.normalize(mu, dim=1) @ head.weight[:, :6])
    assert LinearClassifier(16, 10)(mu, 3).shape == (4, 3)


def test_etf_logits_are_cosines_and_an_overflowing_feature_is_nan_not_zero():
    head = ETFClassifier(16, 6, seed=1)
    mu = torch.randn(8, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 5
    reference = F.normalize(mu, dim=1) @ head.weight.double()  # float64 cosines
    assert torch.allclose(head(mu.float()).double(), reference, atol=1e-6)
    assert torch.equal(head(mu.float()), F.normalize(mu.float(), dim=-1) @ head.weight)  # bitwise F.normalize
    big = mu.float().clone()
    big[2] *= 1e20  # finite entries, a norm that overflows float32: F.normalize would give cosine 0 everywhere
    logits = head(big)
    assert torch.isnan(logits[2]).all() and torch.equal(logits[[0, 1, 3]], head(mu.float())[[0, 1, 3]])
    assert torch.isfinite(head(torch.zeros(1, 16))).all()  # a zero feature keeps F.normalize's 0


def test_etf_needs_enough_dimensions():
    with pytest.raises(ValueError):
        simplex_etf(8, 10)


def test_dr_loss_zero_at_prototype_and_hand_value():
    head = ETFClassifier(16, 10)
    y = torch.tensor([2, 7])
    mu = head.weight[:, y].T * torch.tensor([[3.0], [0.5]])  # any positive scale of the prototype
    assert dot_regression_loss(head(mu), y).item() == pytest.approx(0.0, abs=1e-12)
    # a feature orthogonal to its prototype: cos = 0 -> 0.5 (0 - 1)^2 = 0.5; the opposite one: 0.5 * 4 = 2
    logits = torch.tensor([[0.0, 0.3], [-1.0, 0.2]])
    assert dot_regression_loss(logits, torch.tensor([0, 0])).item() == pytest.approx((0.5 + 2.0) / 2)
    assert dot_regression_loss(logits, torch.tensor([0, 0]), scale=10).item() == pytest.approx(12.5)


def test_mixed_loss_counts_each_term_once():
    logits = torch.tensor([[0.5, -0.2], [0.1, 0.9]])
    ya, yb = torch.tensor([0, 1]), torch.tensor([1, 0])
    lam = torch.tensor([0.7, 0.4])
    per_a = 0.5 * (torch.tensor([0.5, 0.9]) - 1) ** 2
    per_b = 0.5 * (torch.tensor([-0.2, 0.1]) - 1) ** 2
    expected = ((lam * per_a + (1 - lam) * per_b).sum() / 2).item()
    assert mixed_loss(dot_regression_loss, logits, ya, yb, lam).item() == pytest.approx(expected)
    # the same target twice is the plain loss
    assert mixed_loss(dot_regression_loss, logits, ya, ya, lam).item() == pytest.approx(
        dot_regression_loss(logits, ya).item())
    ce = mixed_loss(cross_entropy_loss, logits, ya, yb, lam).item()
    manual = (lam * F.cross_entropy(logits, ya, reduction="none")
              + (1 - lam) * F.cross_entropy(logits, yb, reduction="none")).mean().item()
    assert ce == pytest.approx(manual)


def test_suppression_loss_hand_computation():
    # N=3, L=2, D'=2; sample 0 is base, samples 1 and 2 are novel
    z = torch.tensor([[[1.0, 2.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])
    is_base = torch.tensor([True, False, False])
    base_term = (1 + 4 + 0 + 1) / (1 * 2 * 2)  # 1.5
    novel_term = (4 + 4) / (2 * 2 * 2)  # 1.0
    got = suppression_loss(z, is_base, lambda1=100.0, lambda2=0.5)
    assert got.item() == pytest.approx(100 * base_term - 0.5 * novel_term)
    assert suppression_loss(z, torch.tensor([False] * 3), 1.0, 0.0).item() == 0.0
    aux = BranchAux(z=z)
    torch.testing.assert_close(SUPPRESSION_TARGETS["silu_z"](aux, None), F.silu(z))


def test_separation_loss_hand_computation_and_orthogonal_zero():
    is_base = torch.tensor([True, False])
    # N=2, K=1, L=2, D_P=2
    b = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]], [[[1.0, 1.0], [1.0, 1.0]]]])
    c = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]], [[[-1.0, 1.0], [-1.0, 1.0]]]])  # means (.5,.5) and (-1,1)
    d = torch.tensor([[[[0.0, 2.0], [0.0, 2.0]]], [[[3.0, 0.0], [3.0, 0.0]]]])
    expected = 1 / math.sqrt(2) + 0.0 + 0.0
    got = separation_loss(BranchAux(z=b, B=b, C=c, delta=d), is_base)
    assert got.item() == pytest.approx(expected, abs=1e-6)
    # all three orthogonal -> 0; no novel group -> 0
    assert separation_loss(BranchAux(z=c, C=c, delta=d), is_base).item() == pytest.approx(0.0, abs=1e-7)
    assert separation_loss(BranchAux(z=b, B=b), torch.tensor([True, True])).item() == 0.0
    # |cos| penalises anti-correlation too
    assert separation_loss(BranchAux(z=b, B=torch.stack([b[0], -b[0]])), is_base).item() == pytest.approx(1.0)


def test_feature_mixup_fixed_ratio_and_probability():
    mu = torch.arange(12.0).view(4, 3)
    y = torch.tensor([0, 1, 2, 3])
    mixed, ya, yb, lam = feature_mixup(mu, y, 0.5, mixup_draws(4, 1.0, torch.Generator().manual_seed(0)))
    perm = [int((yb == v).nonzero()) for v in range(4)]
    assert torch.equal(ya, y) and torch.allclose(lam, torch.full((4,), 0.5))
    torch.testing.assert_close(mixed, 0.5 * mu + 0.5 * mu[yb])
    assert sorted(perm) == [0, 1, 2, 3]
    assert mixup_draws(4, 0.0, torch.Generator().manual_seed(0)) is None
    same, ya, yb, lam = feature_mixup(mu, y, 0.5, None)
    assert same is mu and torch.equal(yb, y) and torch.equal(lam, torch.ones(4))


def test_dr_scale_weights_the_dr_loss_only():
    # the authors' x10 belongs to the ETF head's DR loss; scaling cross-entropy by it made base training diverge
    from pipeline.models.registry import HEADS

    assert HEADS["etf"].loss_scale(10.0) == 10.0 and HEADS["linear"].loss_scale(10.0) == 1.0
