"""A --verify hook's leftover is reaped while the run goes on, on both stores.

In the PostgreSQL store's process shape the runner is a child subreaper
(run/orphans.py), so a process a --verify hook leaves behind in the
background is reparented to it. When that process exited, nothing waited for
it: it stayed a zombie of the run until the run ended (one per check, over a
long run). The runner now reaps such leftovers, by pid, never its keeper. (In
the journal store's shape the runner reaps every child it has already.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.conftest import STATEQUEUE
from tests.waiting import gone, until

DEADLINE = 60.0  # generous: the machine is shared

# The hook says "not done" at once, leaving a process behind that writes its
# pid and ends a moment later.
VERIFY = 'sh -c \'sleep 0.2; echo $$ > "$LEFT.tmp"; mv "$LEFT.tmp" "$LEFT"\' & exit 1'
# The item: long enough for the leftover to end while the run goes on.
ITEM = ': > "$STARTED"; exec sleep 60'


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            found += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def _zombies(pid: int) -> list[int]:
    """The children of ``pid`` that have ended and wait to be reaped."""
    return [child for child in _children(pid) if os.path.exists(f"/proc/{child}") and gone(child)]


def test_a_verify_hooks_leftover_is_no_zombie_of_the_run(
    tmp_path: Path, sq_env: dict[str, str], store_url: str
) -> None:
    left, started = tmp_path / "left.pid", tmp_path / "started"
    env = dict(sq_env, LEFT=str(left), STARTED=str(started))
    if store_url:
        env["STATEQUEUE_STORE"] = store_url
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=env, check=True, timeout=DEADLINE)
    argv = ["run", "--no-live", "--verify-first", "--verify", VERIFY, "--", "sh", "-c", ITEM]
    run = subprocess.Popen(
        [STATEQUEUE, *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        until(lambda: left.exists() and started.exists(), "the check's leftover and the item")
        leftover = int(left.read_text())
        until(lambda: gone(leftover), "the leftover to end")
        # Reaped (its pid gone from /proc) while the item still runs.
        until(lambda: not os.path.exists(f"/proc/{leftover}"), "the leftover to be reaped", 20)
        assert run.poll() is None, run.stderr.read() if run.stderr else ""
        assert not _zombies(run.pid)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=DEADLINE)
        assert run.returncode == 143, err
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(DEADLINE)
