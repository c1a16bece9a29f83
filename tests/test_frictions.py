"""Small frictions a new user met (issue 79), each with its new behaviour: a model asked of a run not trained yet
names `make repro`; `fscil export` refuses a name that hides its safetensors format; a checksum error names the key
that skips the check; a required key no layer sets says so; `fscil model benchmark` times the run params.yaml
describes."""

from tests.pipeline_fixtures import NUM_SESSIONS, cli
from tests.test_user_paths import _run_source as _source


def test_a_run_not_trained_yet_names_make_repro(tiny_run, tmp_path):
    _, params, _ = tiny_run
    fresh = tmp_path / "data"  # a fresh clone's data folder: nothing trained
    result = cli("export", str(tmp_path / "m.safetensors"), "--session", str(NUM_SESSIONS), "--params", str(params),
                 "--data-dir", str(fresh))
    assert result.exit_code == 2 and not (tmp_path / "m.safetensors").exists()
    assert result.output.strip() == (f"error: {fresh / 'base'}: not found: this run has not been trained yet (`make "
                                     "repro`, or `dvc repro`, trains the base model and every session of params.yaml)")


def test_export_refuses_a_name_that_hides_the_safetensors_format(tiny_run, tmp_path):
    result = cli("export", str(tmp_path / "model.pt"), "--session", "1", *_source(tiny_run))
    assert result.exit_code == 2 and "name it model.safetensors" in result.output
    assert not list(tmp_path.iterdir())  # nothing written
    assert cli("export", str(tmp_path / "model.safetensors"), "--session", "1", *_source(tiny_run)).exit_code == 0


def test_a_checksum_mismatch_names_the_key_that_skips_the_check(tmp_path):
    import pytest

    from pipeline.data.checksums import verify_checksums
    from pipeline.errors import FSCILError

    (tmp_path / "a.bin").write_bytes(b"re-packed")
    with pytest.raises(FSCILError, match=r"checksum mismatch for .*a\.bin: md5 [0-9a-f]{32}, expected 0{32} \(not the "
                                         r"official file; .*set data\.verify_checksums: false to read it unchecked\)$"):
        verify_checksums(tmp_path, {"a.bin": "0" * 32})


def test_a_required_key_no_layer_sets_says_not_set():
    import pytest

    from pipeline.config import build_config
    from pipeline.errors import FSCILError

    with pytest.raises(FSCILError, match=r"^params: data\.root is required for dataset 'omniglot' \(not set: no layer "
                                         r"gives it a value\)$"):
        build_config({"preset": "omniglot"})


def test_model_benchmark_times_the_run_params_yaml_describes(tmp_path):
    import json

    from tests.pipeline_fixtures import TINY_MODEL, write_params

    params = write_params(tmp_path / "params.yaml")
    result = cli("model", "benchmark", "--params", str(params), "--batch", "2", "--repeats", "1")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.splitlines()[0])
    # the tiny run's model section and its backbone's map (its last width; 32-pixel images, stride 16: 2 x 2)
    assert (out["preset"], out["dim"], out["d_state"]) == ("synthetic", TINY_MODEL["dim"], TINY_MODEL["d_state"])
    assert out["map"] == f"{TINY_MODEL['backbone_widths'][-1]}x2x2"
