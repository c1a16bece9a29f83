"""A trained model measured on the user's own labelled images (`fscil predict --labelled`, `api.evaluate`): a
class-folder tree whose folder names are classes the model knows (their path under the tree, as the pack names a
class-folder dataset's classes; the names `fscil learn` gave). Accuracy on all, base and novel classes is the
sessions' own evaluation (`session_metrics`) applied to these images; the confusion matrix counts true class x
predicted class; folders the model does not know are listed and not scored."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pipeline.atomic import atomic_output
from pipeline.data.class_folder import read_class_folder
from pipeline.errors import FSCILError
from pipeline.training.apply import TrainedModel, predict_files
from pipeline.training.evaluate import session_metrics

LABEL_COLUMNS = ("label", "correct")  # added after `fscil predict`'s own columns
CONFUSION_CORNER = "true \\ predicted"  # the confusion CSV's first header cell


@dataclass
class FolderEvaluation:
    rows: list[dict]
    """Per image: `fscil predict`'s columns, then its folder's class (`label`) and whether the prediction is it
    (`correct`: empty for an unknown class or a skipped file)."""
    metrics: dict
    """`session_metrics` over the scored images (known class, readable): acc, base_acc, novel_acc (None where the
    tree holds no such class), per_class_acc (over the model's classes, None for those absent), num_test,
    num_correct, num_base_images, num_novel_images."""
    confusion: pd.DataFrame
    """Counts, one row per known class of the tree and one column per class of the model, both in class-id order."""
    unknown: dict[str, int]
    """{folder class the model does not know: its images}, not scored."""
    num_base: int | None
    """The model's base classes (its first num_base class ids), None where the model file does not say."""

    def summary(self) -> list[str]:
        """What `fscil predict --labelled` prints."""
        m = self.metrics
        known = len(self.confusion.index)
        lines = [f"accuracy {m['acc']:.2f} % ({m['num_correct']} of {m['num_test']} images, {known} "
                 f"classes known to the model)"]
        if self.num_base is not None:
            parts = [f"{name} {m[key]:.2f} % ({m[count]} images)" for name, key, count in
                     (("base", "base_acc", "num_base_images"), ("novel", "novel_acc", "num_novel_images"))
                     if m[key] is not None]
            lines.append("; ".join(parts) + f" (base: the model's first {self.num_base} classes)")
        if self.unknown:
            lines.append(f"not known to the model, not scored: {', '.join(self.unknown)} "
                         f"({sum(self.unknown.values())} images)")
        return lines


def evaluate_folder(trained: TrainedModel, root: Path, device: torch.device) -> FolderEvaluation:
    """Predict every image of the class-folder tree `root` and score those of the classes the model knows; a tree
    with none of them (or none readable) is a one-line error."""
    source = read_class_folder(Path(root))
    ids = {name: i for i, name in enumerate(trained.class_names)}
    known = [name for name in source.class_names if name in ids]
    if not known:
        shown = ", ".join(source.class_names[:3]) + (", ..." if len(source.class_names) > 3 else "")
        raise FSCILError(f"{root}: none of its {len(source.class_names)} class folders ({shown}) is a class the model "
                         f"knows (its {trained.num_seen} classes: {', '.join(trained.class_names[:3])}, ...)")
    files = list(source.paths)
    labels = [source.class_names[c] for c in source.labels]
    rows = predict_files(trained, files, device)
    unknown: dict[str, int] = {}
    for row, label in zip(rows, labels, strict=True):
        row["label"] = label
        row["correct"] = "" if label not in ids or row["skipped"] else row["class"] == label
        if label not in ids:
            unknown[label] = unknown.get(label, 0) + 1
    scored = [row for row in rows if row["correct"] != ""]
    if not scored:
        raise FSCILError(f"{root}: none of the images of the classes the model knows could be read")
    truth = np.array([ids[row["label"]] for row in scored])
    pred = np.array([int(row["class_id"]) for row in scored])
    num_base = trained.num_base
    metrics = session_metrics(pred, truth, trained.num_seen if num_base is None else num_base, trained.num_seen)
    if num_base is None:  # the split is unknown: all classes count as one group
        metrics.update(base_acc=None, novel_acc=None)
    split = truth < (trained.num_seen if num_base is None else num_base)
    metrics.update(num_correct=int((pred == truth).sum()), num_base_images=int(split.sum()),
                   num_novel_images=int((~split).sum()))
    present = np.unique(truth).tolist()  # the known classes with a scored image, in class-id order
    counts = np.zeros((len(present), trained.num_seen), dtype=np.int64)
    row_of = {c: k for k, c in enumerate(present)}
    np.add.at(counts, (np.array([row_of[t] for t in truth]), pred), 1)
    confusion = pd.DataFrame(counts, index=[trained.class_names[c] for c in present], columns=trained.class_names)
    confusion.index.name = CONFUSION_CORNER
    return FolderEvaluation(rows, metrics, confusion, unknown, num_base)


def confusion_paths(out: Path) -> tuple[Path, Path]:
    """Where the confusion matrix goes beside the per-image CSV `out`: <stem>.confusion.csv and .png."""
    return out.with_name(f"{out.stem}.confusion.csv"), out.with_name(f"{out.stem}.confusion.png")


def is_confusion_csv(path: Path) -> bool:
    try:
        with open(path, errors="replace") as fh:
            return fh.readline().startswith(CONFUSION_CORNER + ",")
    except OSError:
        return False


def write_confusion(evaluation: FolderEvaluation, csv_path: Path, png_path: Path, title: str) -> None:
    """The confusion matrix as CSV (counts) and as a picture (each true class's row as shares of its images)."""
    with atomic_output(csv_path) as tmp:
        evaluation.confusion.to_csv(tmp)
    plot_confusion(evaluation.confusion, evaluation.num_base, png_path, title)


def plot_confusion(confusion: pd.DataFrame, num_base: int | None, path: Path, title: str) -> None:
    from pipeline.plots import figure, wrapped

    counts = confusion.to_numpy().astype(float)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    rows, cols = shares.shape
    named = max(rows, cols) <= 40  # class names as tick labels while they stay legible
    width = min(12.0, 4.0 + 0.18 * cols) if named else 7.0
    height = min(10.0, 3.0 + 0.18 * rows) if named else 6.0
    with figure(path, size=(width, height)) as (fig, axes):
        ax = axes[0, 0]
        image = ax.imshow(shares, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        fig.colorbar(image, ax=ax, label="share of the true class's images")
        if named:
            ax.set_xticks(range(cols), [str(c)[:24] for c in confusion.columns], rotation=90, fontsize=6)
            ax.set_yticks(range(rows), [str(c)[:24] for c in confusion.index], fontsize=6)
        if num_base is not None and 0 < num_base < cols:  # base | novel classes of the model
            ax.axvline(num_base - 0.5, color="white", linewidth=0.8)
        ax.set_xlabel("predicted class" + ("" if named else " id") + " (the model's class order)")
        ax.set_ylabel("true class (folder)" if named else "true class (row: the CSV's order)")
        ax.set_title(wrapped(title), fontsize=10)
