"""The report's pictures (matplotlib, PNG, written atomically): accuracy per session, the class-sensitive
diagnostics per session, ||Z_inc|| histograms and a t-SNE of the final features (base vs novel)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.atomic import atomic_output

PROTOTYPE = "prototype (backbone NCM)"  # the class-mean baseline's name in every table and plot

BASE_COLOUR, NOVEL_COLOUR = "tab:blue", "tab:orange"


@contextmanager
def figure(path: Path, nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (6, 4)) -> Iterator:
    """Yields (fig, axes) of a fresh figure; on exit lays it out and saves it to `path` as PNG, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=False)
    try:
        yield fig, axes
        top = 1 - 0.45 / fig.get_size_inches()[1] if fig.get_suptitle() else 1  # room for a two-line suptitle
        fig.tight_layout(rect=(0, 0, 1, top))
        with atomic_output(Path(path)) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
    finally:
        plt.close(fig)


def wrapped(title: str, width: int = 60) -> str:
    """A title's lines wrapped at `width` characters each (a run's long title on two lines, not cut at the edge)."""
    return "\n".join(textwrap.fill(line, width) for line in title.split("\n"))


def plot_empty(path: Path, title: str, why: str) -> None:
    """A picture that says why there is nothing to plot, so that every declared plot exists for every run (`dvc plots
    diff` across variants compares the same files)."""
    with figure(path, size=(6, 2)) as (fig, axes):
        ax = axes[0, 0]
        ax.axis("off")
        ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True)
        fig.suptitle(wrapped(title))


def _sessions_axis(ax, sessions, ylabel: str, title: str) -> None:
    ax.set_xlabel("session")
    ax.set_ylabel(ylabel)
    ax.set_title(wrapped(title), fontsize=10)
    ax.set_xticks(list(sessions))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def plot_accuracy(table: pd.DataFrame, path: Path, title: str, prototype_column: str | None = None) -> None:
    """Accuracy on all seen / base / novel classes per session, and the prototype baseline (dashed) when given."""
    with figure(path) as (_, axes):
        ax = axes[0, 0]
        for column, label in (("acc", "all seen classes"), ("base_acc", "base classes"),
                              ("novel_acc", "novel classes")):
            ax.plot(table["session"], table[column], marker="o", label=label)
        if prototype_column and table[prototype_column].notna().any():
            ax.plot(table["session"], table[prototype_column], linestyle="--", marker="x", color="gray",
                    label=PROTOTYPE)
        _sessions_axis(ax, table["session"], "accuracy (%)", title)


def plot_diagnostics(table: pd.DataFrame, path: Path, title: str) -> None:
    """Four panels per session: base / novel accuracy; feature-prototype alignment and base-novel similarity;
    mean ||Z||^2 on base vs novel inputs (log scale); cosine of B, C, Delta between base and novel inputs."""
    s = table["session"]
    with figure(path, 2, 2, (10, 7)) as (fig, axes):
        ax = axes[0, 0]
        ax.plot(s, table["base_acc"], marker="o", color=BASE_COLOUR, label="base classes")
        ax.plot(s, table["novel_acc"], marker="o", color=NOVEL_COLOUR, label="novel classes")
        _sessions_axis(ax, s, "accuracy (%)", "accuracy")
        ax = axes[0, 1]
        ax.plot(s, table["diag_alignment"], marker="o", label="base features vs their prototypes")
        ax.plot(s, table["diag_base_novel_similarity"], marker="s", label="base vs novel class means")
        _sessions_axis(ax, s, "mean cosine", "feature alignment and similarity")
        ax = axes[1, 0]
        ax.plot(s, table["diag_z_energy_base"], marker="o", color=BASE_COLOUR, label="base inputs")
        ax.plot(s, table["diag_z_energy_novel"], marker="o", color=NOVEL_COLOUR, label="novel inputs")
        if (table[["diag_z_energy_base", "diag_z_energy_novel"]] > 0).any().any():
            ax.set_yscale("log")
        _sessions_axis(ax, s, "mean ||Z||² / (L D_inner)", "gate activation of the adapting branch")
        ax = axes[1, 1]
        for key, label in (("B", "B"), ("C", "C"), ("delta", "Δ")):
            column = f"diag_{key}_cosine"
            if column in table and table[column].notna().any():
                ax.plot(s, table[column], marker="o", label=label)
        if not ax.get_legend_handles_labels()[0]:
            ax.text(0.5, 0.5, "this projector generates no B, C, Δ", ha="center", va="center",
                    transform=ax.transAxes)
        _sessions_axis(ax, s, "cos(base mean, novel mean)", "generated SSM parameters, base vs novel")
        fig.suptitle(wrapped(title))


def plot_z_histogram(arrays: dict, path: Path, title: str) -> None:
    """Histogram of the per-sample RMS of Z (the adapting branch's gate stream) on base vs novel test inputs."""
    is_base = arrays["labels"] < int(arrays["num_base"])
    z = arrays["z_rms"]
    with figure(path) as (_, axes):
        ax = axes[0, 0]
        bins = np.histogram_bin_edges(z, bins=40)
        ax.hist(z[is_base], bins=bins, alpha=0.6, density=True, color=BASE_COLOUR, label=f"base ({is_base.sum()})")
        ax.hist(z[~is_base], bins=bins, alpha=0.6, density=True, color=NOVEL_COLOUR,
                label=f"novel ({(~is_base).sum()})")
        ax.set_xlabel("||Z|| / sqrt(L D_inner) per test image")
        ax.set_ylabel("density")
        ax.set_title(wrapped(title), fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)


def tsne_embedding(features: np.ndarray, seed: int = 0, max_points: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    """(rows used, 2-D t-SNE of them): at most `max_points` rows, drawn without replacement from `seed`."""
    from sklearn.manifold import TSNE

    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(features), size=min(max_points, len(features)), replace=False))
    perplexity = float(min(30, max(2, (len(rows) - 1) // 3)))
    embedded = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(
        features[rows].astype(np.float64))
    return rows, embedded


def plot_tsne(arrays: dict, path: Path, title: str, seed: int = 0) -> None:
    """t-SNE of the final session's test features mu, coloured base vs novel."""
    rows, xy = tsne_embedding(arrays["features"], seed)
    is_base = arrays["labels"][rows] < int(arrays["num_base"])
    with figure(path, size=(6, 6)) as (_, axes):
        ax = axes[0, 0]
        ax.scatter(xy[is_base, 0], xy[is_base, 1], s=5, alpha=0.6, color=BASE_COLOUR, label="base classes")
        ax.scatter(xy[~is_base, 0], xy[~is_base, 1], s=5, alpha=0.8, color=NOVEL_COLOUR, label="novel classes")
        ax.set_xlabel("t-SNE 1")
        ax.set_ylabel("t-SNE 2")
        ax.set_title(wrapped(title), fontsize=10)
        ax.legend(fontsize=8, markerscale=3)


def plot_b_maps(arrays: dict, path: Path, title: str) -> None:
    """Activation maps of the generated B (paper Fig. vis_cam): one row per shown test image (base, then novel),
    columns: the backbone map's mean |activation|, ||B_t|| of g_base, ||B_t|| of g_inc, each panel on its own colour
    scale (its colour bar beside it: g_inc's norms are far smaller than g_base's, one scale would leave them dark)."""
    b_maps, labels, inputs = arrays["b_maps"], arrays["b_labels"], arrays["b_inputs"]
    num_base = int(arrays["num_base"])
    rows = len(labels)
    with figure(path, rows, 3, (7.5, 1.5 * rows + 0.8)) as (fig, axes):
        for i in range(rows):
            group = "base" if labels[i] < num_base else "novel"
            panels = ((inputs[i], "backbone map |f|"), (b_maps[i, 0], "||B|| of g_base"),
                      (b_maps[i, 1], f"||B|| of {arrays.get('b_adapting', 'g_inc')}"))
            for j, (image, name) in enumerate(panels):
                ax = axes[i, j]
                shown = ax.imshow(image, cmap="viridis", vmin=0)
                fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
                ax.set_xticks([])
                ax.set_yticks([])
                if i == 0:
                    ax.set_title(name, fontsize=9)
            axes[i, 0].set_ylabel(f"{group} class {int(labels[i])}", fontsize=9)
        fig.suptitle(wrapped(title), fontsize=10)
