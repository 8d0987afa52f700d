"""Ctrl-C ends `events --follow` and `status --watch` as it ends every other
command (`statequeue help commands`): exit 130, as `logs --follow` did
already. Both exited 0, so a script could not tell a stop by the user from a
normal end. A real SIGINT, once the first output is out."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE
from tests.waiting import until

Env = dict[str, str]


@pytest.mark.parametrize(
    "args",
    [
        ["events", "--follow"],
        ["events", "--follow", "--json"],
        ["status", "--watch", "--interval", "0.1"],
        ["status", "--watch", "--interval", "0.1", "--json"],
    ],
)
def test_ctrl_c_ends_a_follow_with_130(sq_env: Env, tmp_path: Path, args: list[str]) -> None:
    enq = subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=False)
    assert enq.returncode == 0
    shown = tmp_path / "out"
    with open(shown, "wb") as out:
        proc = subprocess.Popen([STATEQUEUE, *args], env=sq_env, stdout=out, stderr=subprocess.PIPE)
    try:
        until(lambda: shown.stat().st_size > 0, "the first output")  # past start-up: in its loop
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED_INT, err
    # At most one line: `statequeue: interrupted` (cli/root.py turns typer's
    # silent Exit(130) into it, as the fast path says it).
    assert b"Traceback" not in err and err.count(b"\n") <= 1, err


def _reading_stdin(pid: int) -> bool:
    """Whether ``pid`` sits in read(0, ...) (x86-64's syscall 0): past start-up."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] == "0" and int(fields[1], 16) == 0


@pytest.mark.skipif(not Path("/proc/self/syscall").exists(), reason="needs /proc/PID/syscall")
def test_ctrl_c_in_a_typer_command_says_interrupted(sq_env: Env) -> None:
    # typer turns KeyboardInterrupt into a silent exit 130 (cli/root.py):
    # every command says `statequeue: interrupted`, as the docs promise.
    proc = subprocess.Popen(
        [STATEQUEUE, "import", "-q", "y", "-"],
        env=sq_env,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        until(lambda: _reading_stdin(proc.pid), "the import reading its input")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED_INT, err
    assert err == b"statequeue: interrupted\n"
