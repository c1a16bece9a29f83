"""One place per key: the table of keys (docs/keys.md), `config show --origin` and the DVC stage params all come
from a key's declaration in its section dataclass."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

import pipeline.config.sections as config_sections
from pipeline.config import STAGE_KEYS, build_config, run_values
from pipeline.errors import FSCILError
from pipeline.research.keys import field_docs, keys_table
from pipeline.research.selection import selection_order
from pipeline.research.selection_config import SEARCH, SEARCHABLE, SelectionConfig
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

    monkeypatch.setitem(config_sections.RUN_SECTION_TYPES, "incremental", WithNewKey)  # what every layer reads
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


def test_each_searched_key_gets_a_typed_candidate_list_checked_by_its_section():
    """SEARCH alone makes selection.<name>: a list of the run key's type, the paper's candidates as default, every
    candidate checked by the rule of the key's own section (the message names both keys), and the table's row."""
    hints = typing.get_type_hints(SelectionConfig)
    defaults = SelectionConfig()
    table = keys_table()
    for s in SEARCH:
        section, key = s.key.split(".")
        assert hints[s.name] == list[typing.get_type_hints(config_sections.RUN_SECTION_TYPES[section])[key]]
        assert getattr(defaults, s.name) == list(s.paper or [])
        assert f"`selection.{s.name}` ({s.stage}" in next(line for line in table.splitlines()
                                                          if line.startswith(f"| `{s.key}` |"))
    for name, bad, needles in (("k_paths", 3, ("model.k_paths", "1, 2 or 4")),
                               ("inc_init", "x", ("incremental.inc_init",)),
                               ("base_mix_prob", 1.5, ("base.mix_prob",)),
                               ("memory_k", 0, ("extract.memory_k",))):
        with pytest.raises(FSCILError) as err:
            SelectionConfig(**{name: [bad]})
        assert str(err.value).startswith(f"params: selection.{name} lists {bad!r}: ")
        assert all(needle in str(err.value) for needle in needles), str(err.value)
    with pytest.raises(FSCILError, match="selection.lambda1 must list at least one candidate"):
        SelectionConfig(lambda1=[])
    with pytest.raises(FSCILError, match="selection.replay lists a candidate twice"):
        SelectionConfig(replay=["mean", "mean"])
