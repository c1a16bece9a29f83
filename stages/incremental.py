"""`fscil stage incremental --session N`: train g_inc for session N on cached features (needs session N-1)."""

from __future__ import annotations

from pipeline.atomic import atomic_output
from pipeline.config import Config, check_sessions_match
from pipeline.store.feature_store import FeatureStore
from pipeline.training.incremental_session import train_session
from stages.paths import StagePaths


def run(cfg: Config, paths: StagePaths, session: int, show_progress: bool = True) -> dict:
    check_sessions_match(cfg, int(FeatureStore.open(paths.features).attrs["num_sessions"]) - 1)
    prev = paths.session(session - 1) if session > 1 else None
    with atomic_output(paths.session(session), directory=True) as tmp:
        return train_session(cfg, session, paths.features, paths.base, prev, tmp, show_progress=show_progress)
