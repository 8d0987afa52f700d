"""A stopped or timed-out attempt leaves nothing running behind it.

An item's command that starts a process in a session of its own (``setsid``)
which ignores SIGTERM escapes the signal sent to the item's process group.
When the run was stopped (SIGTERM) or the attempt timed out, the run said
"handed back" or "timed out" and ended, while that process ran on (its claim
held by the keeper, so nothing ran twice, but the next run waited for it and
a stop did not stop it). Now, once the attempt's own child has ended, every
process left of its item is killed -- as after a kill -9 of the run -- and
the claim is let go only when none is left: the run ends with none of them
alive. Both process shapes: the guarded one (the runner starts the children)
and the keeper process's (STATEQUEUE_NO_GUARD=1, as a PostgreSQL run uses).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE
from tests.waiting import until

# The leader starts an escapee (new session, TERM ignored, a marker in its
# argv), then waits; the escapee writes its pid and sleeps far longer than
# any test waits.
_COMMAND = 'setsid sh -c \'trap "" TERM; echo $$ > "$0"; sleep 300; : sq-escapee-mark\' "$0" & wait'


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still the escapee (not a reused pid), unreaped or running."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return b"sq-escapee-mark" in cmdline and state != b"Z"


def _kill(pid: int) -> None:
    """The escapee leads its own session, so its group has its pid: its sleep too."""
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "keeper-process"])
@pytest.mark.parametrize("how", ["sigterm", "timeout"])
def test_the_escaped_leftover_of_a_stopped_attempt_is_killed(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path, guard: bool, how: str
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    pid_file = tmp_path / "escapee.pid"
    env = dict(sq_env)
    if not guard:
        env["STATEQUEUE_NO_GUARD"] = "1"
    flags = ["--timeout", "1"] if how == "timeout" else []
    argv = [STATEQUEUE, "run", "--grace", "1", *flags, "--", "sh", "-c", _COMMAND, str(pid_file)]
    err_path = tmp_path / "err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    pid = 0
    try:
        until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", "the escapee")
        pid = int(pid_file.read_text())
        assert _alive(pid)
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # the escapee sleeps 300 s: it must not hold the run
        # The run's end waits for it to be killed: gone as the run exits.
        assert not _alive(pid), err_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid:
            _kill(pid)
    expected = ExitCode.INTERRUPTED_TERM if how == "sigterm" else ExitCode.FAILED
    assert proc.returncode == expected, err_path.read_text()
    with Queue(home=sq_home, create=False) as q:
        (view,) = q.store.items()
        assert view.state.value == ("pending" if how == "sigterm" else "failed")


_WORKER = """#!/bin/sh
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed 's/.*"id": *\\([0-9]*\\).*/\\1/')
  case "$line" in
    *'"daemon"'*) setsid sh -c 'echo $$ > "$0"; sleep 300; : sq-escapee-mark' "$PIDFILE" \\
        </dev/null >/dev/null 2>&1 & ;;
    *'"hang"'*) sleep 300 ;;
  esac
  echo "{\\"id\\": $id, \\"ok\\": true}" >&$STATEQUEUE_REPLY_FD
done
"""


def test_a_persistent_run_stopped_leaves_an_earlier_item_s_detached_process(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """A worker's leftovers carry no item's mark: stopping the item in flight
    must not kill what a finished item started (as per-item runs leave it)."""
    with Queue(home=sq_home) as q:
        q.enqueue(["daemon", "hang"])
    worker = tmp_path / "worker.sh"
    worker.write_text(_WORKER)
    worker.chmod(0o755)
    pid_file = tmp_path / "daemon.pid"
    env = dict(sq_env, PIDFILE=str(pid_file))
    proc = subprocess.Popen(
        [STATEQUEUE, "run", "--persistent", "--grace", "1", "--", str(worker)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pid = 0
    try:
        until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", "the daemon")
        pid = int(pid_file.read_text())
        with Queue(home=sq_home, create=False) as q:
            until(lambda: q.status().counts["done"] == 1, "the first item to be recorded")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert _alive(pid), "the finished item's detached process was killed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid:
            _kill(pid)
    assert proc.returncode == ExitCode.INTERRUPTED_TERM
