"""Stage `prepare`: params.yaml `data:` section -> the HDF5 image pack (images, labels, class names, protocol).

Thin by design: validate the section, call `pipeline.data.prepare.build_pack`, return its summary.
The pack is written atomically, so a failed run leaves no pack at `out`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.data.config import DataConfig
from pipeline.data.prepare import build_pack


def run(data_params: dict[str, Any], out: Path) -> dict[str, Any]:
    """Build the image pack described by `data_params` at `out`; returns the summary (counts, content hash, seconds)."""
    return build_pack(DataConfig.from_dict(data_params), Path(out))
