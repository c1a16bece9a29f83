"""`fscil stage config`: params.yaml resolved over its preset and variant, every value that runs written to
data/config/run.yaml (device as resolved on this machine), and for each stage the values it reads to
data/config/<stage>.yaml, the file its dvc.yaml entry depends on (pipeline.config.STAGE_KEYS)."""

from __future__ import annotations

from pathlib import Path

from stages.entry import load_config, main, options
from stages.paths import StagePaths


def command(params: Path, data_dir: Path, overrides: list[str], quiet: bool = False) -> None:
    import yaml

    from pipeline.atomic import atomic_write_text
    from pipeline.config import STAGE_KEYS, run_values, stage_values
    from pipeline.device import resolved_device_name

    cfg = load_config(params, overrides)
    paths = StagePaths(data_dir)
    device = resolved_device_name(cfg.device)
    values = run_values(cfg, device)
    atomic_write_text(paths.run_config, yaml.safe_dump(values, sort_keys=False))
    for stage in STAGE_KEYS:
        atomic_write_text(paths.stage_config(stage), yaml.safe_dump(stage_values(values, stage), sort_keys=False))
    print(f"config: {cfg.method}, seed {cfg.seed}, device {device} -> {paths.run_config} and the stages' files",
          flush=True)


if __name__ == "__main__":
    main(command, options("config", __doc__))
