"""`fscil stage report`: per-session table, metrics.json (DVC metrics) and the pictures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.atomic import claim_file
from pipeline.errors import FSCILError
from pipeline.report import ARRAYS_FILE, write_report
from stages.entry import load_config, main, options, timed
from stages.paths import StagePaths


def _read(path: Path, stage: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FSCILError(f"{path}: not found; run `{stage}` first (or `dvc repro`)") from None
    except json.JSONDecodeError:
        raise FSCILError(f"{path}: not valid JSON") from None


def is_metrics(path: Path) -> bool:
    """A metrics.json this stage wrote (a JSON object with the run's AVG)."""
    try:
        return "avg" in json.loads(Path(path).read_text())
    except (OSError, ValueError, TypeError):
        return False


def run(paths: StagePaths, metrics_path: Path, cfg) -> dict:
    """Collect session 0 (the base stage) and every incremental session of the protocol (all must be done, and made
    by the preset, variant and seed of `cfg`)."""
    base = _read(paths.base / "metrics.json", "fscil stage base")
    results = [base] + [_read(paths.session(s) / "metrics.json", f"fscil stage incremental --session {s}")
                        for s in range(1, int(base["num_sessions"]))]
    for result in results[1:]:
        made = {k: result[k] for k in ("preset", "variant", "seed") if k in result}
        want = {"preset": cfg.preset, "variant": cfg.variant, "seed": cfg.seed}
        if any(made[k] != want[k] for k in made):
            raise FSCILError(f"session {result['session']} was made by {made}, the params name {want}: run the "
                             "sessions again (dvc repro)")
    title = f"Mamba-FSCIL: {cfg.method}, seed {cfg.seed} ({cfg.model.projector} projector)"
    last = paths.session(int(base["num_sessions"]) - 1) / ARRAYS_FILE
    arrays = dict(np.load(last)) if last.is_file() else None
    identity = {"preset": cfg.preset, "variant": cfg.variant, "method": cfg.method, "seed": cfg.seed}
    return write_report(results, metrics_path, paths.report, title, arrays, identity, set_by_you(cfg, "incremental"))


def set_by_you(cfg, section: str) -> list[str]:
    """'key=value' of the keys of `section` that params.yaml or -S set (not a preset, a variant or a default)."""
    from pipeline.config import flatten

    values = flatten({section: getattr(cfg, section).values()}, "config")
    return [f"{key}={value}" for key, value in values.items()
            if not cfg.origins.get(key, "default").startswith(("default", "preset", "variant", "seed ("))]


def command(params: Path, data_dir: Path, overrides: list[str], metrics: Path = Path("metrics.json"),
            quiet: bool = False) -> None:
    cfg = load_config(params, overrides)
    claim_file(metrics, "fscil stage report", "a metrics file", is_metrics)
    summary = timed("report", run, StagePaths(data_dir), metrics, cfg)
    print(f"{summary['method']}, seed {summary['seed']}")
    print(" ".join(f"{k}={v:.2f}" for k, v in summary["sessions"].items()))
    print(f"AVG {summary['avg']:.2f}  PD {summary['pd']:.2f}  final {summary['final']:.2f}", flush=True)
    for line in summary["standing"]:
        print(line, flush=True)


def _options():
    parser = options("report", "Per-session table, plots and metrics.json.")
    parser.add_argument("--metrics", type=Path, default=Path("metrics.json"))
    return parser


if __name__ == "__main__":
    main(command, _options())
