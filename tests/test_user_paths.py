"""A path the user names is never deleted or replaced unless it holds what the command writes (pipeline/atomic.py
`claim_file`, `claim_folder`): every command that takes a path, on a folder of the user's, the working folder, a
repository's root and a file of another kind: one line, exit 2, and every file of the user's still there."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from pipeline.atomic import OWNER_FILE, claim_file, claim_folder, mark_folder
from pipeline.errors import FSCILError
from tests.pipeline_fixtures import NUM_SESSIONS, cli


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def users(tmp_path) -> Path:
    """A folder of the user's: files and a subfolder, none written by fscil."""
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "keep.txt").write_text("my notes")
    (folder / "sub" / "data.bin").write_bytes(b"\x00\x01")
    return folder


def _refused(result, users: Path, before: dict[str, str], needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert needle in result.output and result.output.count("\n") == 1, result.output
    assert _tree(users) == before


def _run_source(tiny_run) -> list[str]:
    _, params, paths = tiny_run
    return ["--params", str(params), "--data-dir", str(paths.data_dir)]


def test_export_and_predict_refuse_a_folder_and_a_file_of_another_kind(tiny_run, users, tmp_path):
    before = _tree(users)
    source = _run_source(tiny_run)
    _refused(cli("export", str(users), "--session", str(NUM_SESSIONS), *source), users, before, "is a folder")
    _refused(cli("export", str(users / "keep.txt"), "--session", "1", *source), users, before,
             "is not a model file written by `fscil export`")
    image = tmp_path / "imgs"
    image.mkdir()
    from PIL import Image

    Image.new("RGB", (32, 32)).save(image / "a.png")
    for out, needle in ((users, "is a folder"), (users / "keep.txt", "is not a CSV file written by `fscil predict`")):
        _refused(cli("predict", str(image), "--session", "1", "--out", str(out), *source, "--device", "cpu"), users,
                 before, needle)
    # what the command wrote itself is replaced
    model, csv = tmp_path / "m.safetensors", tmp_path / "p.csv"
    for _ in range(2):
        assert cli("export", str(model), "--session", "1", *source).exit_code == 0
        assert cli("predict", str(image), "--model", str(model), "--out", str(csv), "--device", "cpu").exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert oct(model.stat().st_mode & 0o777) == oct(0o666 & ~umask)  # the user's umask, not a private file


def test_export_to_the_working_folder_of_a_repository_deletes_nothing(tiny_run, tmp_path, monkeypatch):
    """`fscil export --session N .` at a repository's root (a copy with a .git, tracked files and a dvc.yaml)."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "dvc.yaml").write_text("stages: {}\n")
    (repo / "src" / "code.py").write_text("print('mine')\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    before = _tree(repo)
    monkeypatch.chdir(repo)
    for target in (".", str(repo)):
        result = cli("export", target, "--session", str(NUM_SESSIONS), *_run_source(tiny_run))
        assert result.exit_code == 2 and "never writes over it" in result.output, result.output
    assert _tree(repo) == before and (repo / ".git" / "HEAD").is_file()
    monkeypatch.chdir(repo / "src")  # a folder above the working one
    assert "a folder above the working one" in cli("export", "..", "--session", "1", *_run_source(tiny_run)).output
    assert _tree(repo) == before


def test_output_folders_are_replaced_only_when_the_command_wrote_them(users, tmp_path):
    before = _tree(users)
    for args in (["select", "--out", str(users)], ["study", "--in-process", "--out", str(users)],
                 ["speed", "--out", str(users)], ["model", "cost", "--out", str(users)]):
        _refused(cli(*args), users, before, "did not write")
    # the scratch and work folders next to an output folder, and speed's pack cache
    work = tmp_path / "runs.work"
    work.mkdir()
    (work / "mine.txt").write_text("x")
    for args in (["speed", "--out", str(tmp_path / "runs")], ["study", "--in-process", "--out", str(tmp_path / "runs")],
                 ["speed", "--out", str(tmp_path / "new"), "--pack-cache", str(users)]):
        result = cli(*args)
        assert result.exit_code == 2 and "did not write" in result.output, result.output
    assert (work / "mine.txt").read_text() == "x" and _tree(users) == before


def test_files_of_config_keys_doctor_and_report_are_checked_too(users, tmp_path):
    before = _tree(users)
    notes = users / "keep.txt"
    _refused(cli("config", "keys", "--out", str(notes)), users, before, "is not a key table")
    _refused(cli("doctor", "--write", "--reference", str(notes)), users, before, "is not a digest reference")
    _refused(cli("stage", "report", "--metrics", str(notes)), users, before, "is not a metrics file")
    keys = tmp_path / "keys.md"
    for _ in range(2):  # its own file: replaced
        assert cli("config", "keys", "--out", str(keys)).exit_code == 0


def test_claims_directly(users, tmp_path):
    with pytest.raises(FSCILError, match="did not write"):
        claim_folder(users, "fscil study")
    assert claim_folder(tmp_path / "new", "fscil study") == tmp_path / "new"
    empty = tmp_path / "empty"
    empty.mkdir()
    claim_folder(empty, "fscil study")
    mark_folder(users, "fscil study")  # the user says it is the study's (OWNER_FILE): then it may be replaced
    assert (users / OWNER_FILE).read_text() == "fscil study\n" and claim_folder(users, "fscil study") == users
    with pytest.raises(FSCILError, match="`fscil select` did not write"):
        claim_folder(users, "fscil select")
    with pytest.raises(FSCILError, match="is a file"):
        claim_folder(users / "keep.txt", "fscil study")
    assert claim_file(users / "keep.txt", "x", "a text", lambda p: p.read_text() == "my notes") == users / "keep.txt"


def test_the_home_folder_is_never_an_output_and_the_error_says_which_folder(tmp_path, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    with pytest.raises(FSCILError, match=r"home: is the home folder; `fscil study` never writes over it"):
        claim_folder(home, "fscil study")
    with pytest.raises(FSCILError, match=r"is a folder above the working one"):
        claim_folder(tmp_path, "fscil study")
