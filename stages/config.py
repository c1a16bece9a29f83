"""`fscil stage config`: params.yaml resolved over its preset and variant, every value that runs written to
data/config/run.yaml (device as resolved on this machine): the stages list the keys they read there as DVC params."""

from __future__ import annotations

from pathlib import Path

from stages.entry import load_config, main, options
from stages.paths import StagePaths


def command(params: Path, data_dir: Path, overrides: list[str], quiet: bool = False) -> None:
    import yaml

    from pipeline.atomic import atomic_write_text
    from pipeline.config import run_values
    from pipeline.device import resolved_device_name

    cfg = load_config(params, overrides)
    path = StagePaths(data_dir).run_config
    device = resolved_device_name(cfg.device)
    atomic_write_text(path, yaml.safe_dump(run_values(cfg, device), sort_keys=False))
    print(f"config: {cfg.method}, seed {cfg.seed}, device {device} -> {path}", flush=True)


if __name__ == "__main__":
    main(command, options("config", __doc__))
