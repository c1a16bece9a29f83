"""Stage `prepare`: params.yaml `data:` section -> the HDF5 image pack (images, labels, class names, protocol).

Thin by design: build the pack with `pipeline.data.prepare.build_pack`, checking the whole config against the
data's protocol (class count, session count, batch sizes), so a config that cannot run stops here, before training,
with a one-line error, before any image is written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.config import Config, check_against_data
from pipeline.config.data_section import DataConfig
from pipeline.data.prepare import build_pack
from pipeline.errors import FSCILError
from stages.entry import load_config, main, options, show, timed
from stages.paths import StagePaths


def run(data_params: dict[str, Any], out: Path, cfg: Config | None = None) -> dict[str, Any]:
    """Build the image pack described by `data_params` at `out`; returns the summary (counts, content hash,
    seconds). With `cfg` (the whole config) the drawn protocol is checked against it before any image is written."""
    check = None if cfg is None else (lambda protocol: check_against_data(cfg, protocol))
    return build_pack(DataConfig.from_dict(data_params), Path(out), check)


RAW = Path("data/raw")  # where the user's datasets live, tracked by DVC (dvc.yaml: prepare depends on it)
TEMP_COPY = ("", ".dvc", "tmp", "exps", "")  # `dvc exp run --temp` and queued runs work under <project>/.dvc/tmp/exps/


def check_data_paths(cfg: Config, cwd: Path | None = None) -> list[str]:
    """Before reading: a data path missing inside DVC's experiment copy is a one-line error naming `dvc add` (the
    copy holds only what git and DVC track); returns notes for paths outside data/raw/, whose changes DVC does not
    see. Other missing paths are left to the dataset's reader, whose error says what it expected."""
    if cfg.data.generated:
        return []
    cwd = (cwd or Path.cwd()).resolve()
    in_copy = "/".join(TEMP_COPY) in f"{cwd.as_posix()}/"
    notes = []
    for key in ("root", "split_dir"):
        value = getattr(cfg.data, key)
        if not value:
            continue
        path = cwd / value
        if not path.exists() and in_copy:
            raise FSCILError(f"params: data.{key} {value}: not found in this experiment's copy, which holds only "
                             f"what git and DVC track: track it with `dvc add {value}` and commit the .dvc file")
        raw = (cwd / RAW).resolve()
        if path.exists() and raw not in path.resolve().parents:
            notes.append(f"note: data.{key} {value} is outside {RAW}/: DVC does not see it change (README 'Your "
                         "data')")
    return notes


def command(params: Path, data_dir: Path, overrides: list[str], quiet: bool = False) -> None:
    cfg = load_config(params, overrides)
    for note in check_data_paths(cfg):
        print(note, flush=True)
    summary = timed("prepare", run, dataclasses.asdict(cfg.data), StagePaths(data_dir).pack, cfg)
    show(summary, ("dataset", "num_images", "num_classes", "num_sessions", "content_hash", "seconds"))


if __name__ == "__main__":
    main(command, options("prepare", "Convert the configured dataset into the HDF5 image pack data/pack.h5."))
