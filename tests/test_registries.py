"""Every registry (pipeline/registry.py) is walked: each entry resolves, says what it is, and keeps the invariants of
its kind, so a new entry is tested without being named here. And what adding one costs: a throwaway selective-SSM
branch and a throwaway suppression form, each a class or function plus one `register` line, are accepted by the
config, listed by the key docs and `fscil list`, exercised by these invariants and by a training step."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch

from pipeline.config import build_config
from pipeline.config.sections import BaseConfig, IncrementalConfig, ModelConfig
from pipeline.data.presets import PRESETS
from pipeline.errors import FSCILError
from pipeline.losses.class_sensitive import suppression_loss
from pipeline.losses.registry import SUPPRESSION_FORMS
from pipeline.models.backbones import Backbone
from pipeline.models.projector import Projector
from pipeline.models.registry import SSM_BRANCHES
from pipeline.models.ss2d import BranchAux, BranchDims, SS2DBranch
from pipeline.registry import Registry, all_registries
from pipeline.store.memory import ClassMemory
from tests.pipeline_fixtures import cli

REGISTRIES = all_registries()
ENTRIES = [(registry, name) for registry, entries in REGISTRIES.items() for name in entries]
C, HW = 8, (2, 2)


def _dims(**widths) -> BranchDims:
    return BranchDims.from_config(ModelConfig(**{"dim": 16, "d_state": 4, "dt_rank": 3, "k_paths": 4, **widths}))


# ---- the invariants of each kind: (entry name, the object) -> asserts ----
def branch(name: str, cls) -> None:
    """Shapes, finite, every parameter trains; a zero gate gives mu = 0 (g_inc's start)."""
    torch.manual_seed(0)
    b = cls(C, HW, _dims())
    mu, aux = b(torch.randn(3, C, *HW), return_aux=True)
    assert mu.shape == (3, 16) and torch.isfinite(mu).all() and aux.z.shape == (3, 4, 16)
    mu.pow(2).sum().backward()
    assert not [n for n, p in b.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    shut = cls(C, HW, _dims(), zero_init_gate=True)
    assert torch.equal(shut(torch.randn(3, C, *HW)), torch.zeros(3, 16))


def backbone(name: str, fn) -> None:
    params = inspect.signature(fn).parameters
    assert {"pretrained", "pretrained_sha256"} <= set(params)  # what build_backbone hands every backbone
    net = fn()
    assert isinstance(net, Backbone) and net.out_channels > 0


def projector(name: str, kind) -> None:
    p = Projector(name, C, HW, _dims())
    f = torch.randn(3, C, *HW)
    base, inc = p(f, mode="base"), p(f, mode="incremental")
    assert base.mu.shape == inc.mu.shape == (3, 16)
    if kind.dual:  # g_inc starts shut: session 1 starts from the base model's features
        assert torch.allclose(base.mu, inc.mu) and p.g_inc is not None
    else:
        assert p.g_inc is None


def head(name: str, h) -> None:
    clf = h.classifier(16, 5)
    logits = clf(torch.randn(4, 16, requires_grad=True), 3)
    assert logits.shape == (4, 3) and torch.isfinite(logits).all()
    loss = h.loss(logits, torch.tensor([0, 1, 2, 0]))
    assert loss.shape == () and loss >= 0
    assert h.confidence(logits).shape == (4, 3) and h.score in ("cosine", "probability")


def suppression_target(name: str, fn) -> None:
    z = torch.randn(2, 3, 4)
    out = fn(BranchAux(z=z, mu_newest=z[:, 0], z_channel_flip=2 * z), z[:, 0])
    assert torch.is_tensor(out) and torch.isfinite(out).all()


def suppression_form(name: str, fn) -> None:
    """(G, M, E) rows and a (G, M) mask -> (G,) >= 0: 0 for Z = 0, larger for a larger Z, differentiable."""
    z = torch.randn(2, 4, 6, requires_grad=True)
    mask = torch.tensor([[1.0, 1, 0, 0], [0, 1, 1, 1]])
    value = fn(z, mask)
    assert value.shape == (2,) and (value >= 0).all() and torch.equal(fn(0 * z, mask), torch.zeros(2))
    assert (fn(3 * z, mask) > value).all()
    value.sum().backward()
    assert torch.isfinite(z.grad).all() and z.grad[0, 2:].abs().sum() == 0  # masked rows get nothing


def separation_form(name: str, fn) -> None:
    """(G, 2, D) means -> (G,): 0 for orthogonal base and novel means, more for parallel ones, in [0, 1]."""
    orthogonal, parallel = torch.eye(2)[None], torch.ones(1, 2, 2)
    assert fn(orthogonal).abs().max() < 1e-6 and (fn(parallel) > 0.1).all() and (fn(parallel) <= 1).all()


def separation_delta(name: str, key) -> None:
    _, aux = SS2DBranch(C, HW, _dims())(torch.randn(2, C, *HW), return_aux=True)
    assert getattr(aux, key).shape[:3] == aux.B.shape[:3]


def separation_paths(name: str, paths) -> None:
    assert torch.zeros(2, 4, 3)[:, paths].shape[1] >= 1


def base_mix_loss(name: str, fn) -> None:
    """An unmixed batch (lam = 1, y_b = y_a, mixed 0) is the head's loss on its targets; a mixed one is finite."""
    from pipeline.losses.classification import dot_regression_loss

    cos = torch.rand(4, 3) * 2 - 1
    y = torch.tensor([0, 1, 2, 0])
    plain = fn(dot_regression_loss, cos, y, y, torch.ones(4), torch.zeros(()))
    assert torch.allclose(plain, dot_regression_loss(cos, y))
    assert torch.isfinite(fn(dot_regression_loss, cos, y, y.flip(0), torch.full((4,), 0.3), torch.ones(())))


def dr_weighting(name: str, fn) -> None:
    labels = torch.tensor([0, 0, 0, 1, 2, 2])
    weights = fn(labels, 4)
    assert weights is None or (weights.shape == (6,) and (weights > 0).all()
                               and torch.isclose(weights.sum(), torch.tensor(6.0)))


def session_schedule(name: str, fn) -> None:
    inc = IncrementalConfig()
    assert all(0 <= fn(inc, s, 50) <= 1 for s in range(50))


def base_schedule(name: str, fn) -> None:
    base = BaseConfig(epochs=10, warmup_steps=5)
    assert all(0 <= fn(base, s, 100, s // 10) <= 1 for s in range(100))


def memory_rule(name: str, fn) -> None:
    maps = np.random.default_rng(0).standard_normal((9, 2, 1, 1)).astype(np.float32)
    labels = np.array([3, 3, 3, 5, 5, 7, 7, 7, 7])
    rows = fn(labels, 2, torch.Generator().manual_seed(0))  # None: the class means
    assert rows is None or (set(labels[rows].tolist()) == {3, 5, 7} and len(set(rows.tolist())) == len(rows))
    kept, classes = ClassMemory.select(maps, labels, name, 2, torch.Generator().manual_seed(0))
    assert kept.shape[1:] == maps.shape[1:] and len(kept) == len(classes)
    assert set(classes.tolist()) == {3, 5, 7}


def dataset(name: str, kind) -> None:
    assert kind.preset in PRESETS and len(kind.protocol) == 4 and callable(kind.builder())


INVARIANTS: dict[str, Callable] = {
    "pipeline.models.registry.BACKBONES": backbone,
    "pipeline.models.registry.SSM_BRANCHES": branch,
    "pipeline.models.registry.MIXERS": branch,
    "pipeline.models.registry.PROJECTOR_KINDS": projector,
    "pipeline.models.registry.HEADS": head,
    "pipeline.losses.registry.SUPPRESSION_TARGETS": suppression_target,
    "pipeline.losses.registry.SUPPRESSION_FORMS": suppression_form,
    "pipeline.losses.registry.SEPARATION_FORMS": separation_form,
    "pipeline.losses.registry.SEPARATION_DELTAS": separation_delta,
    "pipeline.losses.registry.SEPARATION_PATHS": separation_paths,
    "pipeline.losses.registry.DR_WEIGHTINGS": dr_weighting,
    "pipeline.losses.registry.BASE_MIX_LOSSES": base_mix_loss,
    "pipeline.training.registry.SCHEDULES": session_schedule,
    "pipeline.training.registry.BASE_SCHEDULES": base_schedule,
    "pipeline.store.registry.MEMORY_RULES": memory_rule,
    "pipeline.data.registry.DATASETS": dataset,
}


def test_every_registry_has_its_invariants():
    assert set(INVARIANTS) == set(REGISTRIES), "a new registry needs its invariant in tests/test_registries.py"


@pytest.mark.parametrize(("registry", "name"), ENTRIES, ids=[f"{r.rsplit('.', 1)[1]}:{n}" for r, n in ENTRIES])
def test_every_entry_resolves_says_what_it_is_and_keeps_its_kinds_invariants(registry, name):
    entries: Registry = REGISTRIES[registry]
    assert entries.describe(name).strip()
    INVARIANTS[registry](name, entries[name])


# ---- what adding one costs: a class or a function, and one registry line ----
class ToyBranch(SS2DBranch):
    """A throwaway selective-SSM branch: SS2D with its scan output halved."""

    def mix(self, x, hw):
        y, aux = super().mix(x, hw)
        return 0.5 * y, aux


def toy_abs_mean(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A throwaway suppression form: the group's mean |Z|."""
    return (z.abs().mean(dim=-1) * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)


@pytest.fixture
def throwaways():
    SSM_BRANCHES.register("toy", "tests.test_registries:ToyBranch", "a throwaway branch (a test)")
    SUPPRESSION_FORMS.register("toy_abs_mean", "tests.test_registries:toy_abs_mean", "a throwaway form (a test)")
    yield
    SSM_BRANCHES.unregister("toy")
    SUPPRESSION_FORMS.unregister("toy_abs_mean")


def test_a_new_branch_and_a_new_loss_form_are_one_function_and_one_line_each(throwaways):
    from pipeline.research.keys import keys_table

    cfg = build_config({"preset": "synthetic_quick", "variant": "mamba_fscil", "model": {"ssm_branch": "toy"},
                        "incremental": {"suppression_form": "toy_abs_mean"}})
    branch("toy", SSM_BRANCHES["toy"])
    suppression_form("toy_abs_mean", SUPPRESSION_FORMS["toy_abs_mean"])
    projector_ = Projector.from_config(cfg.model, C, HW)
    assert type(projector_.g_inc) is ToyBranch and type(projector_.g_base) is ToyBranch
    z, is_base = torch.randn(4, 3, 5), torch.tensor([True, True, False, False])
    by_hand = 2.0 * z[:2].abs().mean() - 0.5 * z[2:].abs().mean()
    assert torch.isclose(suppression_loss(z, is_base, 2.0, 0.5, form="toy_abs_mean"), by_hand)
    # a session's objective with both, and its gradient reaching g_inc (the toy branch) alone
    from pipeline.models.fscil import build_head
    from pipeline.training.session_step import incremental_loss

    cfg_inc = cfg.incremental
    proj, clf = build_head(cfg.model, C, HW, 6)
    proj.freeze_base()
    x, y = torch.randn(8, C, *HW), torch.tensor([0, 1, 2, 3, 4, 5, 0, 1])
    with torch.no_grad():
        proj.g_inc.in_proj.weight.normal_(0, 0.1)  # open the gate: Z != 0
    terms = incremental_loss(proj, clf, x, y, y < 4, 6, cfg.model.classifier, cfg_inc, None)
    assert all(torch.isfinite(t) for t in terms) and terms[1] != 0
    sum(terms).backward()
    assert all(p.grad is None for p in proj.g_base.parameters()) and proj.g_inc.in_proj.weight.grad.abs().sum() > 0
    table = keys_table()
    assert "ss2d, mamba_1d, toy" in table and "squared_mean, norm_per_element, toy_abs_mean" in table
    listed = cli("list")
    assert re.search(r"^selective-SSM branches \(pipeline/models/registry.py SSM_BRANCHES\):\n(  .*\n)*"
                     r"  toy +a throwaway branch \(a test\)$", listed.output, re.M), listed.output
    with pytest.raises(FSCILError, match="must be one of ss2d, mamba_1d, toy"):
        build_config({"model": {"ssm_branch": "toy2"}})


def _string_constants(path) -> list[str]:
    """The string literals of a module, its docstrings left out."""
    import ast

    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.parametrize("name, home", [("mamba_1d", "pipeline/models/registry.py"),
                                        ("z_channel_flip", "pipeline/losses/registry.py"),
                                        ("class_folder", "pipeline/data/presets.py")])
def test_a_kind_the_code_asks_for_by_name_is_spelled_once(name, home):
    """A registered name that library code tests against (`ssm_branch == MAMBA_1D`) is one named constant beside its
    registry: renaming the kind is one edit, and no file can compare against a stale spelling."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [p for folder in ("pipeline", "stages") for p in (root / folder).rglob("*.py")]
    spelled = sorted(str(p.relative_to(root)) for p in files if name in _string_constants(p))
    assert spelled == [home]
