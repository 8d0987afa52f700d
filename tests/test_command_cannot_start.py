"""A command the system cannot start is refused before anything is claimed
(exit 2, one line), as a missing program is: a #! line naming a missing
interpreter, or a text file with no #! line (exec format error: xargs's
execvp hands it to sh, a spawn does not). Each item was recorded failed
with "cannot start command ...", exit 1, the same way for every item."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE


def _sq(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("#!/nonexistent/python3\nprint(1)\n", "the interpreter its #! line names is missing"),
        ("#!\n", "its #! line is empty"),
        ("#!/bin/sh\r\nexit 0\r\n", "its #! line ends in a carriage return"),  # passed the check
        ("#!/etc/passwd\nx\n", "the interpreter its #! line names is no program: /etc/passwd"),
        ('echo "$1"\n', "it has no #! line (make #!/bin/sh its first line, or run it with sh)"),
    ],
)
def test_a_command_the_system_cannot_start_is_refused_before_any_claim(
    tmp_path: Path, sq_env: dict[str, str], text: str, says: str
) -> None:
    program = tmp_path / "work"
    program.write_text(text)
    program.chmod(0o755)
    assert _sq(sq_env, "enqueue", stdin="a\nb\n").returncode == 0
    for command in ([str(program)], ["work"]):  # by path, and found on PATH
        env = {**sq_env, "PATH": f"{tmp_path}:{sq_env.get('PATH', '')}"}
        done = _sq(env, "run", "--", *command, "{}")
        assert done.returncode == ExitCode.USAGE, done.stderr
        said = f"statequeue: cannot start command '{program}': {says}"
        assert done.stderr.startswith(said), done.stderr
        assert done.stderr.count("\n") == 1 and done.stderr.endswith("; nothing was run\n")
    status = json.loads(_sq(sq_env, "status", "--json").stdout)
    assert status["counts"]["pending"] == 2 and status["counts"]["failed"] == 0


def test_programs_the_system_starts_still_run(tmp_path: Path, sq_env: dict[str, str]) -> None:
    script = tmp_path / "work"
    script.write_text('#!/bin/sh\nprintf %s "$1" >> "$0.out"\n')
    script.chmod(0o755)
    assert _sq(sq_env, "enqueue", stdin="a\n").returncode == 0
    assert _sq(sq_env, "run", "--", str(script), "{}").returncode == 0
    assert _sq(sq_env, "enqueue", stdin="b\n").returncode == 0
    assert _sq(sq_env, "run", "--", "sh", str(script), "{}").returncode == 0  # sh, a binary
    assert (tmp_path / "work.out").read_text() == "ab"
