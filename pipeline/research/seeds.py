"""Runs compared over seeds: rows that differ only in `seed` are one setting; each setting's metrics as mean +- SE
over its seeds, and two settings' paired difference over the seeds both ran (`fscil compare`).

A single run is one draw: on the synthetic_quick preset the seed moves AVG by about +-5 points, so 57.26 against
57.46 says nothing until the same seeds ran both ways. The paired difference (setting b minus setting a, seed by
seed) removes what a seed does to both; its SE is the spread of those differences over sqrt(n); a mean within 2 SE
of zero is printed as such, with how many seeds went up and down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

SEED = "seed"


def setting_labels(params: pd.DataFrame) -> pd.Series:
    """Each row's setting: 'key=value, ...' over the params that differ between the rows, seed left out ('all' when
    nothing but the seed differs)."""
    keys = [c for c in params.columns if c != SEED and params[c].nunique(dropna=False) > 1]
    if not keys:
        return pd.Series("all", index=params.index)
    return params[keys].astype(str).apply(lambda row: ", ".join(f"{k}={v}" for k, v in row.items()), axis=1)


def has_repeated_settings(params: pd.DataFrame) -> bool:
    """True when some setting ran with more than one seed (then the rows are grouped, not set side by side)."""
    if SEED not in params.columns:
        return False
    frame = pd.DataFrame({"setting": setting_labels(params), SEED: params[SEED]})
    return bool((frame.groupby("setting")[SEED].nunique() > 1).any())


def mean_se(values: pd.Series) -> tuple[float, float, int]:
    """(mean, standard error, n) of the finite values; SE is NaN below two values."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    se = float(values.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    return mean, se, n


def by_setting(settings: pd.Series, seeds: pd.Series, metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (in first-seen order): its seeds and each metric as 'mean +- SE' over them."""
    rows = []
    for setting in dict.fromkeys(settings):
        mask = settings == setting
        row = {"setting": setting, "seeds": ",".join(str(s) for s in sorted(seeds[mask], key=_seed_key))}
        for metric in metrics.columns:
            mean, se, n = mean_se(metrics.loc[mask, metric])
            row[metric] = format_mean_se(mean, se, n)
        rows.append(row)
    return pd.DataFrame(rows).set_index("setting")


@dataclass(frozen=True)
class Paired:
    """b minus a over the seeds both ran: mean, SE, how many seeds went up / down / stayed."""
    metric: str
    mean: float
    se: float
    seeds: tuple[str, ...]
    up: int
    down: int

    @property
    def within_2se(self) -> bool:
        """No evidence of a difference: |mean| <= 2 SE (always so with fewer than two seeds: SE unknown)."""
        return not (self.se == self.se) or abs(self.mean) <= 2 * self.se

    def line(self) -> str:
        se = f" +- {self.se:.2f}" if self.se == self.se else " (SE needs 2 seeds)"
        verdict = "within 2 SE: no evidence of a difference" if self.within_2se else "beyond 2 SE"
        return (f"{self.metric:<16} {self.mean:+.2f}{se}  up {self.up} / down {self.down} of {len(self.seeds)} "
                f"seeds  {verdict}")


def paired(settings: pd.Series, seeds: pd.Series, metrics: pd.DataFrame, a: str, b: str) -> list[Paired]:
    """Setting b minus setting a, metric by metric, over the seeds both ran (each seed's own pair)."""
    frame = metrics.apply(pd.to_numeric, errors="coerce").assign(_setting=settings.values, _seed=seeds.values)
    left = frame[frame["_setting"] == a].drop_duplicates("_seed").set_index("_seed")
    right = frame[frame["_setting"] == b].drop_duplicates("_seed").set_index("_seed")
    common = sorted(set(left.index) & set(right.index), key=_seed_key)
    out = []
    for metric in metrics.columns:
        diff = (right.loc[common, metric] - left.loc[common, metric]).dropna()
        mean, se, _ = mean_se(diff)
        out.append(Paired(metric, mean, se, tuple(str(s) for s in diff.index), int((diff > 0).sum()),
                          int((diff < 0).sum())))
    return out


def format_mean_se(mean: float, se: float, n: int) -> str:
    if n == 0:
        return "-"
    return f"{mean:.2f} +- {se:.2f}" if n > 1 else f"{mean:.2f} (1 seed)"


def _seed_key(seed) -> tuple:
    text = str(seed)
    return (0, int(text), "") if text.lstrip("-").isdigit() else (1, 0, text)


def standing_word(mean: float, se: float) -> str:
    """A method against its own class means: above / below them beyond 2 SE, level within (or one seed: no SE)."""
    if not se == se or abs(mean) <= 2 * se:
        return "level" if se == se else "one seed"
    return "above" if mean > 0 else "below"


def vs_own_cell(mean: float, se: float, up: int, down: int, pm: str = "±") -> str:
    """'+0.68 ± 0.22 (3 up, 0 down): above' (a study table's and the README's column; `fscil compare` writes +-)."""
    spread = f" {pm} {se:.2f}" if se == se else ""
    return f"{mean:+.2f}{spread} ({up} up, {down} down): {standing_word(mean, se)}"


def paired_stats(differences: pd.Series) -> tuple[float, float, int, int]:
    """(mean, SE, seeds up, seeds down) of per-seed paired differences (a method's AVG minus its own class means);
    mean and SE NaN without values, SE NaN below two."""
    values = pd.to_numeric(differences, errors="coerce").dropna()
    mean, se, _ = mean_se(values)
    return mean, se, int((values > 0).sum()), int((values < 0).sum())


def vs_own_class_means(settings: pd.Series, metrics: pd.DataFrame) -> dict[str, str]:
    """{setting: `vs_own_cell` of its runs' AVG minus the class means of each run's own backbone} (metrics `avg` and
    `class_means_avg`, both in every run's metrics.json), for the settings whose runs have both."""
    if not {"avg", "class_means_avg"} <= set(metrics.columns):
        return {}
    diff = pd.to_numeric(metrics["avg"], errors="coerce") - pd.to_numeric(metrics["class_means_avg"], errors="coerce")
    out = {}
    for setting in dict.fromkeys(settings):
        mean, se, up, down = paired_stats(diff[settings == setting])
        if mean == mean:
            out[setting] = vs_own_cell(mean, se, up, down, "+-")
    return out
