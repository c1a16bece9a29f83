"""`fscil stage incremental --session N`: train g_inc for session N on cached features (needs session N-1)."""

from __future__ import annotations

from pipeline.config import Config, check_sessions_match
from pipeline.store.feature_store import FeatureStore
from pipeline.training.incremental_session import session_stage
from stages.paths import StagePaths


def run(cfg: Config, paths: StagePaths, session: int, show_progress: bool = True) -> dict:
    check_sessions_match(cfg, int(FeatureStore.open(paths.features).attrs["num_sessions"]) - 1)
    prev = paths.session(session - 1) if session > 1 else None
    return session_stage(cfg, session, paths.features, paths.base, prev, paths.session(session),
                         show_progress=show_progress, curve=paths.session_curve(session))
