"""Small frictions a new user met (issue 79), each with its new behaviour: a model asked of a session the run has not
trained names `make repro`; `fscil export` refuses a name that hides its safetensors format."""

from tests.pipeline_fixtures import NUM_SESSIONS, cli


def _source(tiny_run) -> list[str]:
    _, params, paths = tiny_run
    return ["--params", str(params), "--data-dir", str(paths.data_dir)]


def test_a_session_not_trained_yet_names_make_repro(tiny_run, tmp_path):
    _, _, paths = tiny_run
    result = cli("export", str(tmp_path / "m.safetensors"), "--session", str(NUM_SESSIONS + 1), *_source(tiny_run))
    assert result.exit_code == 2 and not (tmp_path / "m.safetensors").exists()
    assert result.output.strip() == (f"error: {paths.session(NUM_SESSIONS + 1)}: not found: this run has not trained "
                                     f"session {NUM_SESSIONS + 1} yet (`make repro`, or `dvc repro`, trains every "
                                     "session of params.yaml)")


def test_export_refuses_a_name_that_hides_the_safetensors_format(tiny_run, tmp_path):
    result = cli("export", str(tmp_path / "model.pt"), "--session", "1", *_source(tiny_run))
    assert result.exit_code == 2 and "name it model.safetensors" in result.output
    assert not list(tmp_path.iterdir())  # nothing written
    assert cli("export", str(tmp_path / "model.safetensors"), "--session", "1", *_source(tiny_run)).exit_code == 0
