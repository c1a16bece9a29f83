"""Numbers as DVC writes them: params.yaml is read as YAML 1.2 (as DVC reads and writes it) and `-S` with the grammar
`dvc exp run -S` uses (hydra's override parser), so a value means the same in `fscil` as in DVC. Under the old
reading (YAML 1.1) `1e-05`, which DVC writes for `-S lambda2=1e-5`, was a string and every stage refused the run."""

from __future__ import annotations

import pytest
import yaml

from pipeline.config import dump_yaml, load_config, load_yaml_text, read_yaml, resolve_params
from pipeline.errors import FSCILError
from tests.pipeline_fixtures import cli, write_params


def test_dvcs_own_params_writer_then_the_stages_config_reads_the_numbers(tmp_path):
    """DVC's writer (what `dvc exp run -S` calls on params.yaml), then the config every stage loads."""
    from dvc.utils.hydra import apply_overrides

    params = write_params(tmp_path / "params.yaml")
    apply_overrides(params, ["+base.weight_decay=5e-4", "incremental.lambda2=1e-5", "+incremental.lr=1.0e-05"])
    text = params.read_text()
    assert "lambda2: 1e-05" in text and "weight_decay: 0.0005" in text  # YAML 1.2 as DVC writes it
    assert yaml.safe_load(text)["incremental"]["lambda2"] == "1e-05"  # the defect: YAML 1.1 reads a string
    cfg = load_config(params)
    assert (cfg.base.weight_decay, cfg.incremental.lambda2, cfg.incremental.lr) == (0.0005, 1e-05, 1e-05)
    assert cfg.origins["incremental.lambda2"] == str(params)


@pytest.mark.parametrize(("text", "value"), [("1e-5", 1e-05), ("5e-4", 0.0005), ("1.0e-05", 1e-05), ("2E-3", 0.002),
                                             ("0.00001", 1e-05), ("7", 7), ("null", None), ("[5, 6]", [5, 6])])
def test_a_value_means_the_same_in_the_params_file_and_in_s(tmp_path, text, value):
    params = write_params(tmp_path / "params.yaml")
    assert load_yaml_text(f"x: {text}\n") == {"x": value}
    key = "incremental.steps" if isinstance(value, list) else "incremental.lambda2"
    if value is None:
        key = "variant"
    assert resolve_params(read_yaml(params), [f"{key}={text}"])[0][key] == value
    if key != "variant":  # and the whole config validates it
        assert load_config(params, [f"{key}={text}"]).origins[key] == "-S"


def test_plus_tilde_and_lists_as_dvc_reads_them(tmp_path):
    params = write_params(tmp_path / "params.yaml")
    base = load_config(params)
    cfg = load_config(params, ["+model.dim=24", "++incremental.lr=0.3", "incremental.steps=[2,3]", "~base.lr"])
    assert (cfg.model.dim, cfg.incremental.lr, cfg.incremental.steps) == (24, 0.3, [2, 3])
    # ~key takes the params file's value out: the preset's value runs, and says where it came from
    assert base.origins["base.lr"] == str(params) and cfg.origins["base.lr"] == "preset synthetic"
    with pytest.raises(FSCILError, match=r"^-S ~base\.momentum: .* does not set base\.momentum"):
        load_config(params, ["~base.momentum"])
    # a quoted number is a string, as hydra reads it: refused where a number is needed, naming the key and -S
    with pytest.raises(FSCILError, match=r"incremental\.lambda2 must be a number, got '5e-4' \(set by -S\)"):
        load_config(params, ["incremental.lambda2='5e-4'"])
    with pytest.raises(FSCILError, match=r"^-S incremental\.lambda2=1,2: a sweep of several values"):
        load_config(params, ["incremental.lambda2=1,2"])
    with pytest.raises(FSCILError, match=r"^-S x=a=b: expected section\.key=value"):
        load_config(params, ["x=a=b"])


def test_a_non_number_in_the_params_file_is_one_line_naming_the_key_and_the_file(tmp_path):
    params = write_params(tmp_path / "params.yaml", incremental={"lambda2": "yes"})
    assert "lambda2: 'yes'" in params.read_text()  # PyYAML quoted it; unquoted, YAML 1.2 reads a string too
    params.write_text(params.read_text().replace("lambda2: 'yes'", "lambda2: yes"))
    with pytest.raises(FSCILError, match=rf"incremental\.lambda2 must be a number, got 'yes' \(set by {params}\)"):
        load_config(params)
    params.write_text(params.read_text().replace("lambda2: yes", "lambda2: 1\n  lambda2: 2"))
    with pytest.raises(FSCILError, match=r"not valid YAML \(line \d+: found duplicate key"):
        load_config(params)


def test_config_show_prints_what_dvc_would_write_and_reads_back(tmp_path):
    params = write_params(tmp_path / "params.yaml")
    result = cli("config", "show", "incremental.lambda2", "--params", str(params), "-S", "incremental.lambda2=1e-5")
    assert result.exit_code == 0 and result.output.strip() == "incremental.lambda2: 1e-05", result.output
    result = cli("config", "show", "--params", str(params), "-S", "incremental.lambda2=1e-5")
    assert result.exit_code == 0 and "  lambda2: 1e-05\n" in result.output, result.output
    shown = load_yaml_text(result.output)
    assert shown["incremental"]["lambda2"] == 1e-05 and load_yaml_text(dump_yaml(shown)) == shown
    result = cli("config", "show", "--params", str(params), "-S", "incremental.lambda2=abc")
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "incremental.lambda2 must be a number, got 'abc' (set by -S)" in result.output
