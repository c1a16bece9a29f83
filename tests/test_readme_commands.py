"""The README's fast commands run as written: every `fscil ...` line of its bash blocks whose subcommand is quick
(help, list, config, model summary) is run through the installed console script from the repository root."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FSCIL = Path(sys.executable).with_name("fscil")
FAST = (("--help",), ("list",), ("config", "show"), ("config", "sessions"), ("model", "summary"))


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("fscil ")]


FAST_COMMANDS = [c for c in readme_commands() if tuple(shlex.split(c)[1:3])[: 2] in FAST
                 or tuple(shlex.split(c)[1:2]) in FAST]


def test_the_readme_has_fast_commands_to_check():
    assert len(FAST_COMMANDS) >= 5, FAST_COMMANDS


@pytest.mark.skipif(not FSCIL.exists(), reason="the fscil console script is not installed here")
@pytest.mark.parametrize("command", FAST_COMMANDS)
def test_a_readme_command_runs_as_written(command):
    result = subprocess.run([str(FSCIL), *shlex.split(command)[1:]], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
