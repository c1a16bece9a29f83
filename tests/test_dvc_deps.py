"""dvc.yaml tells the truth: every stage depends on exactly the code its command imports (stages/dvc_deps.py: the
import graph read with `ast`, lazy imports inside functions included) and on the resolved config values it reads;
dvc.yaml is what that generator writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.config import STAGE_KEYS
from stages.dvc_deps import COMMAND, LAUNCHERS, REPO, generate, import_closure, module_file, stage_code


def expanded_stages(dvc: dict) -> dict[str, dict]:
    """dvc.yaml's stages with foreach stages taken once (their deps do not depend on the item but for ${item})."""
    return {name: stage["do"] if "foreach" in stage else stage for name, stage in dvc["stages"].items()}


STAGES = expanded_stages(yaml.safe_load((REPO / "dvc.yaml").read_text()))


def test_dvc_yaml_is_what_the_generator_writes():
    text = (REPO / "dvc.yaml").read_text()
    assert generate(text) == text, f"dvc.yaml's code deps or params are stale: run `{COMMAND}`"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_a_stage_runs_its_own_module_and_none_of_the_tools(name):
    """A stage imports what it runs: not the CLI (help texts, other commands), not research code, not the key docs,
    not the GPU kernels a CPU run never runs; its code deps are exactly its closure."""
    code = stage_code(name)
    assert f"stages/{name}.py" in code and set(LAUNCHERS) <= set(code)
    banned = [c for c in code if c.startswith(("stages/cli", "pipeline/research/")) or c in (  # key docs: research
        "pipeline/doctor.py", "pipeline/ops/selective_scan_triton.py", "stages/dvc_deps.py")]
    assert not banned, banned
    deps = [d for d in STAGES[name]["deps"] if d.endswith(".py") or d in LAUNCHERS]
    assert deps == code


def test_closure_sees_lazy_imports():
    """The oracle itself: the incremental stage's import of the session code inside a function is followed, the
    base training is not in it, and the backbone is in both."""
    incremental = import_closure({module_file("stages.incremental")})
    assert REPO / "pipeline" / "training" / "incremental_session.py" in incremental
    assert REPO / "pipeline" / "training" / "base_session.py" not in incremental
    assert REPO / "pipeline" / "models" / "backbones" / "resnet12.py" in incremental
    assert "pipeline/training/session_step.py" not in stage_code("base")


def test_the_generator_rewrites_stale_deps(tmp_path):
    text = (REPO / "dvc.yaml").read_text()
    stale = text.replace("      - pipeline/training/base_session.py\n", "", 1).replace(
        "      - stages/config.py\n", "      - stages/config.py\n      - stages/cli.py\n", 1)
    assert stale != text and generate(stale) == text


@pytest.mark.parametrize("name", sorted(STAGE_KEYS))
def test_each_stage_depends_on_the_resolved_values_it_reads(name):
    """Preset and variant files are read through `fscil stage config`, which writes every resolved value to
    data/config/run.yaml and each stage's STAGE_KEYS to data/config/<stage>.yaml: each stage depends on its own file
    (device and deterministic in it where a stage computes) and declares no params, so `dvc exp show` lists each of
    params.yaml's keys once; the config stage depends on the presets and the variants, with params.yaml as params."""
    deps = STAGES[name]["deps"]
    assert deps[0] == f"data/config/{name}.yaml" and "params" not in STAGES[name]
    config = STAGES["config"]
    assert {"pipeline/presets", "pipeline/variants"} <= set(config["deps"])
    assert config["params"] == [{"params.yaml": None}]
    assert [next(iter(o)) for o in config["outs"]] == ["data/config/run.yaml"] + [
        f"data/config/{stage}.yaml" for stage in STAGE_KEYS]
    for key in ("device", "deterministic"):
        assert (key in STAGE_KEYS[name]) == (name in ("base", "extract", "incremental"))


def test_a_stage_file_holds_exactly_the_keys_its_stage_reads():
    """stage_values on a resolved config: the stage's sections whole, a dotted key with its section around it."""
    from pipeline.config import build_config, run_values, stage_values

    values = run_values(build_config({"preset": "synthetic_quick"}), "cpu")
    report = stage_values(values, "report")
    assert report == {"preset": values["preset"], "variant": values["variant"], "method": values["method"],
                      "seed": values["seed"], "model": {"projector": values["model"]["projector"]}}
    assert stage_values(values, "incremental")["incremental"] == values["incremental"]
    assert set(stage_values(values, "prepare")) == {"seed", "data", "sessions"}


def test_the_config_stage_depends_on_config_code_only():
    """The config stage checks names against the registries: it depends on their files, not on their entries."""
    deps = STAGES["config"]["deps"]
    assert not [d for d in deps if d.startswith(("pipeline/models", "pipeline/losses", "pipeline/store",
                                                 "pipeline/training", "pipeline/research"))
                and not d.endswith("/registry.py")]
    assert "pipeline/models/registry.py" in deps and "pipeline/models/ss2d.py" not in deps


def test_a_stage_that_looks_names_up_depends_on_the_entries_it_can_reach():
    """A registry's entries are deps of the stages whose code (outside pipeline/config) imports that registry by
    name: the sessions depend on every loss form, base training on none of them, the pack on every reader."""
    assert "pipeline/losses/class_sensitive.py" in stage_code("incremental")
    assert "pipeline/losses/class_sensitive.py" not in stage_code("base")
    assert {"pipeline/data/cifar100.py", "pipeline/data/omniglot.py"} <= set(stage_code("prepare"))
    assert "pipeline/data/cifar100.py" not in stage_code("base")
    assert "pipeline/models/mamba1d.py" in stage_code("base")
    assert Path(REPO / "stages" / "run").is_file()
