"""What the class-sensitive losses do to the features, per session (paper Fig. selective_scan and its appendix).

Computed by each incremental stage on the test maps of the classes seen so far, for analysis only: nothing reads
them to choose anything. Base = classes of session 0, novel = the later ones seen so far.

- `alignment`: mean cosine of base test features mu to their class prototype (the ETF column, or the linear
  head's weight row);
- `base_novel_similarity`: mean cosine between a base class's mean feature and a novel class's mean feature, over
  all (base, novel) pairs;
- `z_energy_base` / `z_energy_novel`: mean ||Z||^2 / (L D_inner) of the adapting branch (g_inc; g_base for single_ssm)
  on base / novel test inputs, the quantity eq. loss_supp acts on;
- `B_cosine`, `C_cosine`, `delta_cosine`: cos(P_bar_base, P_bar_novel) of the generated parameters averaged over
  each group, K and L (eq. parameter_base_novel without the absolute value), where the branch has them.
The per-sample ||Z|| (its root mean square over L and D') and the final features go to `diagnostics.npz` for the
report's histograms and t-SNE, with the activation maps of B (paper Fig. vis_cam): for a few base and novel test
images, ||B_t|| per token of g_base and of g_inc, mapped back from each scan path to its spatial position and
averaged over the K paths, (n, 2, H, W).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.atomic import atomic_output
from pipeline.ops.cross_scan import cross_merge
from pipeline.report import ARRAYS_FILE
from pipeline.store.feature_store import FeatureStore

SHOWN_PER_GROUP = 4  # base and novel test images in the B activation maps

PARAMS = ("B", "C", "delta")


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return round(float(F.cosine_similarity(a.double(), b.double(), dim=0)), 6)


def _class_means(features: torch.Tensor, labels: torch.Tensor, classes: np.ndarray) -> torch.Tensor:
    return torch.stack([features[labels == c].mean(dim=0) for c in classes])


def _shown(labels: np.ndarray, num_base: int, num_seen: int) -> np.ndarray:
    """Rows of the first test image of the first base classes and of the newest novel classes."""
    firsts = {int(c): int(np.flatnonzero(labels == c)[0]) for c in np.unique(labels)}
    base = [firsts[c] for c in sorted(firsts) if c < num_base][:SHOWN_PER_GROUP]
    novel = [firsts[c] for c in sorted(firsts, reverse=True) if c >= num_base][:SHOWN_PER_GROUP]
    return np.array(base + novel[::-1], dtype=np.int64)


def b_activation_maps(branch, f: torch.Tensor) -> torch.Tensor | None:
    """||B_t|| per token of a branch, back at each token's spatial position and averaged over the K scan paths:
    (n, H, W); None for a branch that generates no B."""
    _, aux = branch(f, return_aux=True)
    if aux.B is None:
        return None
    n, k, length, _ = aux.B.shape
    h, w = f.shape[2:]
    norms = aux.B.norm(dim=-1).unsqueeze(2)  # (n, K, 1, L) in each path's scan order
    return (cross_merge(norms, h, w) / k).view(n, h, w)


@torch.no_grad()
def session_diagnostics(projector, classifier, store: FeatureStore, num_seen: int, num_base: int, device,
                        batch_size: int, out_dir: Path | None = None) -> tuple[dict, np.ndarray, np.ndarray]:
    """(the diagnostics above, predicted classes, labels) of the test maps of the classes seen so far, from one pass
    of the projector (logits masked to the seen classes: the session's accuracy comes from the same pass); with
    out_dir, also writes out_dir/diagnostics.npz (labels, features mu, per-sample z_rms, B maps)."""
    projector.eval()
    classifier.eval()
    maps, labels_np = store.test_set(max_label=num_seen)
    feats, preds, z_energy, sums = [], [], [], {key: [] for key in PARAMS}
    for i in range(0, len(labels_np), batch_size):
        out = projector.session_outputs(torch.from_numpy(maps[i:i + batch_size]).to(device))
        preds.append(classifier(out.mu, num_seen).argmax(dim=1).cpu())
        feats.append(out.mu.double().cpu())
        z_energy.append(out.aux.z.double().pow(2).flatten(1).mean(dim=1).cpu())
        for key in PARAMS:
            if (generated := getattr(out.aux, key)) is not None:  # (n, K, L, D_P) -> per-sample mean over K and L
                sums[key].append(generated.double().mean(dim=(1, 2)).cpu())
    mu, energy = torch.cat(feats), torch.cat(z_energy)
    labels = torch.from_numpy(labels_np)
    is_base = labels < num_base
    protos = classifier.prototypes(num_seen).double().cpu()
    result = {"alignment": round(float(F.cosine_similarity(mu[is_base], protos[labels[is_base]], dim=1).mean()), 6)}
    novel = np.arange(num_base, num_seen)
    if len(novel):
        base_means = F.normalize(_class_means(mu, labels, np.arange(num_base)), dim=1)
        novel_means = F.normalize(_class_means(mu, labels, novel), dim=1)
        result["base_novel_similarity"] = round(float((base_means @ novel_means.T).mean()), 6)
        result["z_energy_base"] = round(float(energy[is_base].mean()), 8)
        result["z_energy_novel"] = round(float(energy[~is_base].mean()), 8)
        for key, parts in sums.items():
            if parts:
                per_sample = torch.cat(parts)
                result[f"{key}_cosine"] = _cos(per_sample[is_base].mean(0), per_sample[~is_base].mean(0))
    if out_dir is not None:
        arrays = {"labels": labels_np, "features": mu.float().numpy(), "z_rms": energy.sqrt().float().numpy(),
                  "num_base": np.int64(num_base)}
        shown = _shown(labels_np, num_base, num_seen)
        f = torch.from_numpy(maps[shown]).to(device)
        branches = [projector.g_base, projector.adapting_branch if projector.g_inc is None else projector.g_inc]
        b_maps = [b_activation_maps(branch, f) for branch in branches]
        if all(m is not None for m in b_maps):
            arrays.update(b_maps=torch.stack(b_maps, dim=1).float().cpu().numpy(), b_labels=labels_np[shown],
                          b_inputs=np.abs(maps[shown]).mean(axis=1),
                          b_adapting=np.str_("g_inc" if projector.g_inc is not None else "g_base (adapting)"))
        with atomic_output(Path(out_dir) / ARRAYS_FILE) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
    pred = torch.cat(preds).numpy() if preds else np.zeros(0, dtype=np.int64)
    return result, pred, labels_np
