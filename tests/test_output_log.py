"""An attempt's log keeps the start and the end of its output (run/output_log.py).

A command's last lines are most often why it failed: a log that kept only the
first --log-limit bytes lost them. Now the file holds the start, a line saying
how many bytes were left out, and the end, never more than the limit and that
line; memory per attempt is bounded (TAIL_MAX)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from statequeue.run.output_log import MARK, TAIL_MAX, OutputLog
from tests.conftest import STATEQUEUE

Env = dict[str, str]


def _log(tmp_path: Path, limit: int) -> tuple[OutputLog, Path]:
    path = tmp_path / "1.1.log"
    return OutputLog(limit, lambda: os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)), path


def test_within_the_limit_everything_is_kept(tmp_path: Path) -> None:
    out, path = _log(tmp_path, 100)
    for chunk in (b"a" * 40, b"b" * 40, b"c" * 20):
        out.add(chunk)
    out.close()
    assert path.read_bytes() == b"a" * 40 + b"b" * 40 + b"c" * 20


def test_past_the_limit_the_start_and_the_end_are_kept(tmp_path: Path) -> None:
    out, path = _log(tmp_path, 100)  # 75 bytes of start, 25 of end
    for n in range(10):
        out.add(str(n).encode() * 30)
    out.close()
    start = b"0" * 30 + b"1" * 30 + b"2" * 15
    assert path.read_bytes() == start + MARK % 200 + b"9" * 25


def test_the_end_held_in_memory_is_bounded(tmp_path: Path) -> None:
    out, path = _log(tmp_path, 1 << 30)  # a limit of 1 GiB: its tail is TAIL_MAX, not 256 MiB
    start = (1 << 30) - TAIL_MAX
    out.add(b"s" * 1000)
    out._written = start  # as if the start had been written (not 1 GiB on disk)
    for _ in range(10):
        out.add(b"x" * TAIL_MAX)
    assert len(out._tail) == TAIL_MAX
    out.close()
    data = path.read_bytes()
    assert data.startswith(b"s" * 1000) and data.endswith(b"x" * TAIL_MAX)
    assert MARK % (9 * TAIL_MAX) in data


def test_no_output_no_file(tmp_path: Path) -> None:
    out, path = _log(tmp_path, 100)
    out.close()
    assert not out.opened and not path.exists()


def test_a_failing_commands_last_lines_are_in_its_log(sq_env: Env, sq_home: Path) -> None:
    enq = subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=False)
    assert enq.returncode == 0
    script = (
        "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo 'the error: disk on fire' >&2; exit 3"
    )
    ran = subprocess.run(
        [STATEQUEUE, "run", "--log-limit", "100000", "--", "sh", "-c", script],
        env=sq_env,
        capture_output=True,
        check=False,
    )
    assert ran.returncode == 1, ran.stderr
    log = (sq_home / "default" / "logs" / "1.1.log").read_bytes()
    assert log.endswith(b"the error: disk on fire\n")
    assert log.startswith(b"x" * 75000)
    assert b"log limit reached" in log and len(log) <= 100000 + len(MARK) + 10
    shown = subprocess.run([STATEQUEUE, "logs", "1"], env=sq_env, capture_output=True, check=False)
    assert shown.stdout.rstrip().endswith(b"the error: disk on fire")
