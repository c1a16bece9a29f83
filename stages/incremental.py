"""`fscil stage incremental --session N`: train g_inc for session N on cached features (needs session N-1)."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config, check_sessions_match
from pipeline.store.feature_store import FeatureStore
from pipeline.training.curves import session_curve_files
from pipeline.training.incremental_session import session_stage
from stages.entry import load_config, main, options, say, show, timed
from stages.paths import StagePaths


def run(cfg: Config, paths: StagePaths, session: int, show_progress: bool = True) -> dict:
    check_sessions_match(cfg, int(FeatureStore.open(paths.features).attrs["num_sessions"]) - 1)
    prev = paths.session(session - 1) if session > 1 else None
    return session_stage(cfg, session, paths.features, paths.base, prev, paths.session(session),
                         show_progress=show_progress, curves=session_curve_files(paths.session_curves, session))


def command(session: int, params: Path, data_dir: Path, overrides: list[str], quiet: bool = False) -> None:
    cfg = load_config(params, overrides)
    result = timed(f"incremental session {session}", run, cfg, StagePaths(data_dir), session,
                   show_progress=not quiet)
    proto = result.get("prototype", {}).get("backbone", {}).get("acc")
    say(f"session {session}: accuracy {result['acc']:.2f} on {result.get('num_seen_classes', '?')} classes "
        f"(base {result['base_acc']:.2f}, novel {result['novel_acc']:.2f})"
        + (f"; backbone class means {proto:.2f}" if proto is not None else ""))
    show(result, ("session", "acc", "base_acc", "novel_acc", "seconds"))


def _options():
    parser = options("incremental", "Train g_inc for one session on cached features (session N needs N - 1).")
    parser.add_argument("-s", "--session", type=int, required=True)
    return parser


if __name__ == "__main__":
    main(command, _options())
