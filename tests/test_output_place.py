"""`export -o`, `report -o` and `import` named a folder, or a file in a
missing folder: they answered three ways (exit 6, "stopped without
acknowledging", for `export -o /tmp`; exit 6 for `report -o` into a missing
folder where `export -o` exits 7). Now alike: a folder is bad input (exit 2),
a missing folder is not found (exit 7); one line, nothing written, the queue
unchanged."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE

Env = dict[str, str]


def _sq(env: Env, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, timeout=60, check=False
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("command", [["export", "-o"], ["report", "-o"], ["-q", "copy", "import"]])
def test_a_folder_is_bad_input_and_a_missing_folder_is_not_found(
    sq_env: Env, sq_home: Path, tmp_path: Path, command: list[str]
) -> None:
    assert _sq(sq_env, "enqueue", "a", "b").returncode == 0
    outside = tmp_path / "out"
    outside.mkdir()
    before = _files(sq_home)
    cases = [(str(outside), ExitCode.USAGE, f"{outside} is a folder")]
    if command[-1] != "import":  # a missing FILE to read is exit 7 already
        missing = outside / "no" / "x.out"
        cases.append((str(missing), ExitCode.NOT_FOUND, f"no such folder: {missing.parent}"))
    for target, code, says in cases:
        done = _sq(sq_env, *command, target)
        assert done.returncode == code, (target, done.stderr)
        line = done.stderr.decode()
        assert line.count("\n") == 1 and "Traceback" not in line, line
        assert line.startswith("statequeue: ") and says in line, line
        assert done.stdout == b""
    assert list(outside.iterdir()) == []  # no temporary file left behind
    assert _files(sq_home) == before


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize("command", [["export", "-o"], ["report", "-o"]])
def test_a_file_in_a_folder_that_takes_no_new_file_is_bad_input(
    sq_env: Env, sq_home: Path, command: list[str]
) -> None:
    """`export -o /proc/version` said "no such folder: /proc" (exit 7): /proc
    is there, it only creates no file. One line naming the reason, exit 2."""
    assert _sq(sq_env, "enqueue", "a").returncode == 0
    before = _files(sq_home)
    done = _sq(sq_env, *command, "/proc/version")
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.decode() == (
        "statequeue: cannot write /proc/version: no new file can be created in /proc\n"
    )
    assert done.stdout == b""
    assert _files(sq_home) == before
