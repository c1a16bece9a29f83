"""One place per key: the table of keys (docs/keys.md), `config show --origin` and the DVC stage params all come
from a key's declaration in its section dataclass."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import yaml

from pipeline import config_layers, config_sections
from pipeline.config import STAGE_KEYS, build_config, run_values
from pipeline.config_docs import field_docs, keys_table
from pipeline.config_selection import SEARCHABLE, SelectionConfig
from pipeline.research.selection import selection_order
from tests.pipeline_fixtures import cli

REPO = Path(__file__).resolve().parents[1]


def test_docs_keys_md_is_the_generated_table():
    assert (REPO / "docs" / "keys.md").read_text() == keys_table(), "run `fscil config keys --out docs/keys.md`"


def test_every_key_has_a_description():
    rows = [line for line in keys_table().splitlines() if line.startswith("| `")]
    assert rows and [row.split("|")[1] for row in rows if row.rstrip().endswith("|  |")] == []


def test_a_key_declared_once_reaches_config_show_the_stage_params_and_the_table(monkeypatch):
    """A new incremental key, declared only as a field with its docstring: `config show --origin` lists it with its
    origin, run.yaml (what dvc.yaml's stage params read) carries it under the section the incremental stage lists,
    and the table of keys describes it."""

    @dataclasses.dataclass
    class WithNewKey(config_sections.IncrementalConfig):
        section: typing.ClassVar[str] = "incremental"
        label_smoothing: float = 0.0
        """Label smoothing of the session loss (a key made up for this test)."""

    types = {**config_sections.RUN_SECTION_TYPES, "incremental": WithNewKey}
    monkeypatch.setattr(config_sections, "RUN_SECTION_TYPES", types)
    monkeypatch.setattr(config_layers, "SECTION_TYPES", {**types, "selection": SelectionConfig})
    monkeypatch.setattr("pipeline.config.SECTION_TYPES", {**types, "selection": SelectionConfig}, raising=False)
    monkeypatch.setattr("pipeline.config_docs.RUN_SECTION_TYPES", types)
    cfg = build_config({"incremental": {"label_smoothing": 0.1}})
    assert cfg.incremental.label_smoothing == 0.1 and cfg.origins["incremental.label_smoothing"] == "params.yaml"
    assert run_values(cfg)["incremental"]["label_smoothing"] == 0.1
    assert "incremental" in STAGE_KEYS["incremental"]  # dvc.yaml's incremental stage lists the whole section
    row = next(line for line in keys_table().splitlines() if "`incremental.label_smoothing`" in line)
    assert "| `0.0` | incremental | - | Label smoothing of the session loss" in row
    assert field_docs(WithNewKey)["label_smoothing"].startswith("Label smoothing")


def test_config_show_origin_names_a_default_key(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"preset": "synthetic"}))
    result = cli("config", "show", "--params", str(params), "--origin")
    assert result.exit_code == 0 and any(line.startswith("incremental.warmup_ratio: 0.1") and "# default" in line
                                         for line in result.output.splitlines())


def test_searchable_keys_are_the_keys_select_runs():
    """SEARCHABLE (the table's `fscil select` column) against the order `fscil select` runs, every list filled
    with the key's default (a valid candidate)."""
    defaults = build_config({})
    filled = {}
    for name, key in SEARCHABLE.items():
        section, field = key.split(".")
        filled[name] = [getattr(getattr(defaults, section), field)]
    order = selection_order(dataclasses.replace(SelectionConfig(), **filled))
    assert {key for _, key, _, _ in order} == set(SEARCHABLE.values())
