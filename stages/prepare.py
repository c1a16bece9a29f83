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
from stages.entry import load_config, main, options, show, timed
from stages.paths import StagePaths


def run(data_params: dict[str, Any], out: Path, cfg: Config | None = None) -> dict[str, Any]:
    """Build the image pack described by `data_params` at `out`; returns the summary (counts, content hash,
    seconds). With `cfg` (the whole config) the drawn protocol is checked against it before any image is written."""
    check = None if cfg is None else (lambda protocol: check_against_data(cfg, protocol))
    return build_pack(DataConfig.from_dict(data_params), Path(out), check)


def command(params: Path, data_dir: Path, overrides: list[str], quiet: bool = False) -> None:
    cfg = load_config(params, overrides)
    summary = timed("prepare", run, dataclasses.asdict(cfg.data), StagePaths(data_dir).pack, cfg)
    show(summary, ("dataset", "num_images", "num_classes", "num_sessions", "content_hash", "seconds"))


if __name__ == "__main__":
    main(command, options("prepare", "Convert the configured dataset into the HDF5 image pack data/pack.h5."))
