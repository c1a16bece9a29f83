"""The Python entry point of a trained model: load a model file, teach it classes from a class-folder tree, predict
images, measure it on a labelled tree, save it (what `fscil learn` and `fscil predict --model` run):

    from pipeline import api
    model = api.load("model.safetensors")          # `fscil export` / `fscil learn` writes one
    model = api.learn(model, "my_classes/")         # one folder per class, a few images each
    rows = api.predict(model, ["a.png", "photos/"])  # per image: path, class_id, class, its score
    result = api.evaluate(model, "labelled/")       # folders named by class: accuracy, confusion matrix
    print(result.metrics["acc"], result.metrics["novel_acc"]); result.confusion.to_csv("confusion.csv")
    api.save(model, "extended.safetensors")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from pipeline.training.apply import TrainedModel, export_model, image_files, load_exported, predict_files
from pipeline.training.labelled import FolderEvaluation, evaluate_folder
from pipeline.training.learn import learn_classes


def load(path: str | Path) -> TrainedModel:
    """A model file written by `fscil export` or `fscil learn` (`save`)."""
    return load_exported(Path(path))


def learn(model: TrainedModel, folder: str | Path, device: str | torch.device = "cpu",
          log: Callable[[str], None] = print) -> TrainedModel:
    """`model` after one more incremental session on the class folders under `folder` (a new model; `model` is left
    as it was). Runs at the run's own `threads`, as its stages did."""
    if model.learn is not None:
        torch.set_num_threads(model.learn.config().threads)
    return learn_classes(model, Path(folder), device, log)


def predict(model: TrainedModel, images: Iterable[str | Path], device: str | torch.device = "cpu") -> list[dict]:
    """One row per image file (folders searched): path, class_id, class, the head's score, skipped (why not)."""
    return predict_files(model, image_files([Path(p) for p in images]), torch.device(device))


def evaluate(model: TrainedModel, folder: str | Path, device: str | torch.device = "cpu") -> FolderEvaluation:
    """The model on a class-folder tree whose folder names are classes it knows: per-image rows, accuracy on all /
    base / novel classes (`metrics`), the confusion matrix (`confusion`), folders it does not know (`unknown`)."""
    return evaluate_folder(model, Path(folder), torch.device(device))


def save(model: TrainedModel, path: str | Path) -> None:
    """One self-contained model file (`fscil predict --model`, `load`)."""
    from pipeline.code_version import code_version

    export_model(model, Path(path), code_version())
