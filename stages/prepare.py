"""Stage `prepare`: params.yaml `data:` section -> the HDF5 image pack (images, labels, class names, protocol).

Thin by design: build the pack with `pipeline.data.prepare.build_pack`, then check the whole config against the
data's protocol (class count, session count, batch sizes), so a config that cannot run stops here, before training,
with a one-line error and no pack left behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import Config, check_against_data
from pipeline.config_sections import DataConfig
from pipeline.data.pack import ImagePack
from pipeline.data.prepare import build_pack
from pipeline.errors import FSCILError


def run(data_params: dict[str, Any], out: Path, cfg: Config | None = None) -> dict[str, Any]:
    """Build the image pack described by `data_params` at `out`; returns the summary (counts, content hash,
    seconds). With `cfg` (the whole config) it is checked against the pack's protocol, and no pack stays when
    it cannot run."""
    out = Path(out)
    summary = build_pack(DataConfig.from_dict(data_params), out)
    if cfg is None:
        return summary
    try:
        with ImagePack.open(out) as pack:
            check_against_data(cfg, pack.protocol)
    except FSCILError:
        out.unlink(missing_ok=True)
        raise
    return summary
