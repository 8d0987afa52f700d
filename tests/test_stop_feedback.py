"""The first stop signal is answered at once, and the summary says the run
was stopped (outside tester: Ctrl-C during a long --grace printed nothing,
the bar kept its ETA, and the summary left out the items never started).
Real runs, real signals to the run's pid; stderr read from a pipe (or a pty
for the progress bar). Processes are stopped by pid."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

CHILD = 'trap "" INT TERM HUP; : > "$MARKS/$1"; sleep 3'  # ignores the stop: waits out its time


def _enqueue(env: dict[str, str], n: int) -> None:
    items = [str(i) for i in range(1, n + 1)]
    subprocess.run([STATEQUEUE, "enqueue", *items], env=env, check=True, capture_output=True)


def _wait_for_starts(marks: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while len(list(marks.iterdir())) < n:
        assert proc.poll() is None and time.monotonic() < deadline, "the children never started"
        time.sleep(0.05)


def _read_until(fd: int, proc: subprocess.Popen[bytes], want: bytes, limit: float) -> bytes:
    """What ``fd`` gives until ``want`` shows up, ``limit`` seconds pass, or it ends."""
    got = b""
    deadline = time.monotonic() + limit
    poller = select.poll()  # not select(): an fd past 1023 (a busy test process) is refused
    poller.register(fd, select.POLLIN)
    while want not in got and time.monotonic() < deadline:
        if poller.poll(50):
            try:
                data = os.read(fd, 65536)
            except OSError:  # a pty's end
                break
            if not data:
                break
            got += data
    return got


def _start(env: dict[str, str], tmp_path: Path, *opts: str, **kw: object) -> tuple:
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**env, "MARKS": str(marks)}
    _enqueue(env, 6)
    cmd = [STATEQUEUE, "run", "-j2", "--grace", "30s", *opts, "--", "sh", "-c", CHILD, "sh", "{}"]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    return proc, marks


@pytest.mark.parametrize(
    ("sig", "again", "code"),
    [(signal.SIGINT, "Ctrl-C again", 130), (signal.SIGTERM, "SIGTERM again", 143)],
)
def test_the_first_signal_is_answered_at_once_and_summed_up(
    sq_env: dict[str, str], tmp_path: Path, sig: signal.Signals, again: str, code: int
) -> None:
    proc, marks = _start(sq_env, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_starts(marks, 2, proc)
        os.kill(proc.pid, sig)
        sent = time.monotonic()
        line = (
            "statequeue: stopping: no new items start; waiting for 2 running "
            f"(up to --grace 30s); {again} to stop them now\n"
        ).encode()
        early = _read_until(proc.stderr.fileno(), proc, line, 2.5)  # the children sleep 3 s
        assert line in early, early
        assert time.monotonic() - sent < 2.5
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == code
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    err = (early + rest).decode()
    assert err.count("statequeue: stopping:") == 1, err  # said once
    assert err.splitlines()[-1] == (
        f"statequeue: stopped by {sig.name}: items: 2 ok, 0 failed, "
        "4 left pending (not started); 2 attempts started"
    ), err


def test_quiet_says_nothing_on_the_stop(sq_env: dict[str, str], tmp_path: Path) -> None:
    proc, marks = _start(
        sq_env, tmp_path, "--quiet", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _wait_for_starts(marks, 2, proc)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    assert err == b"", err


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CLOCK = re.compile(r"\d+:\d\d:\d\d|-:--:--")


def test_the_progress_bar_drops_its_eta_once_stopping(
    sq_env: dict[str, str], tmp_path: Path
) -> None:
    master, slave = pty.openpty()
    try:
        proc, marks = _start(
            {**sq_env, "COLUMNS": "120", "TERM": "xterm"},
            tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=slave,
        )
    finally:
        os.close(slave)
    try:
        _wait_for_starts(marks, 2, proc)
        os.kill(proc.pid, signal.SIGINT)
        raw = _read_until(master, proc, b"attempts", 30)
        raw += _read_until(master, proc, b"\0", 1)  # what follows, until it ends
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    text = ANSI.sub("", raw.decode(errors="replace"))
    assert "statequeue: stopping: no new items start" in text, text
    frames = [f for f in re.split(r"[\r\n]", text) if f.startswith("stopping ")]
    assert frames, text  # the bar says it is stopping
    for frame in frames:
        assert len(CLOCK.findall(frame)) == 1, frame  # the time elapsed; no ETA
