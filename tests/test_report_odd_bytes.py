"""A real `find | enqueue` queue meets bytes that are not UTF-8: in file names
(items) and in the command's own arguments (`run -- ./convert {} /mnt/caf\\xe9`).
`run` records such a runner and `report` shows such items as every terminal
view does (``\\xe9``): before, each stopped with a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import STATEQUEUE

Env = dict[str, str]

# exits 1 for the item named bad*; its `arg\xfe` (not UTF-8) is the command's own
FAILS_ON_BAD = ("sh", "-c", 'case "$1" in *bad*) exit 1;; esac', b"arg\xfe")


def _sq(env: Env, *args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=120, check=False
    )


def _queue_of_odd_names(env: Env) -> None:
    names = b"files/latin\xe9-1.txt\nfiles/bad\xff.txt\n"  # find prints them as raw bytes
    assert _sq(env, "-q", "odd", "enqueue", stdin=names).returncode == 0
    ran = _sq(env, "-q", "odd", "run", "--", *FAILS_ON_BAD)
    assert ran.returncode == 1, ran.stderr  # bad\xff failed; nothing else went wrong
    assert b"Traceback" not in ran.stderr
    assert b"items: 1 ok, 1 failed" in ran.stderr


def test_run_with_a_command_argument_that_is_not_utf8(sq_env: Env) -> None:
    _queue_of_odd_names(sq_env)
    assert _sq(sq_env, "-q", "odd", "retry", "--failed").returncode == 0
    again = _sq(sq_env, "-q", "odd", "run", "--", *FAILS_ON_BAD)
    assert again.returncode == 1, again.stderr
    assert b"different command" not in again.stderr  # the same command: no warning
    stats = _sq(sq_env, "-q", "odd", "stats")
    assert stats.returncode == 0, stats.stderr
    assert "arg\ufffd" in stats.stdout.decode("utf-8")  # the runner's command, as kept


def test_a_report_names_items_and_commands_that_are_not_utf8(sq_env: Env, tmp_path: Path) -> None:
    _queue_of_odd_names(sq_env)
    out = tmp_path / "odd.html"
    made = _sq(sq_env, "-q", "odd", "report", "-o", str(out))
    assert made.returncode == 0, made.stderr
    assert made.stderr == b""
    page = out.read_bytes().decode("utf-8")  # valid UTF-8, as its meta charset says
    assert "files/bad\\xff.txt" in page  # the failure's example item
    assert "files/latin\\xe9-1.txt" in page  # among the slowest
    assert "arg\ufffd" in page  # the runner's command
    streamed = _sq(sq_env, "-q", "odd", "report", "-o", "-")
    assert streamed.returncode == 0, streamed.stderr
    assert "files/bad\\xff.txt" in streamed.stdout.decode("utf-8")
