"""Promise 4 at a run's end: the guard holds the claims handed over to it
until the leftovers of their items are gone, even before the runner exits.

The guard used to look for those leftovers among its own children at once,
while the runner had not exited yet (they were still the runner's children,
not the guard's): it found none and let the claims go. A leftover that had
closed its fds (it held no claim itself) then ran on beside the next run's
attempt of the same item.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from statequeue import Queue
from tests.leftovers import CHECK, COMMAND, leftover_pid, sq
from tests.waiting import gone, until


def test_a_leftover_without_the_claim_fd_still_keeps_its_item(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    first = sq(sq_env, "run", "--", "sh", "-c", COMMAND, str(pids_dir), "{}")
    assert first.returncode == 1, first.stderr
    pid = int(until(lambda: leftover_pid(pids_dir / "a"), "the leftover's pid"))
    try:
        assert sq(sq_env, "retry", "--failed").returncode == 0
        second = sq(sq_env, "run", "--max-time", "2", "--", "sh", "-c", CHECK, str(pids_dir))
        assert not gone(pid)
        with Queue(home=sq_home, create=False) as q:
            (view,) = q.store.items()
        # Not run again while the leftover lives (it would have failed, exit 9).
        assert (view.state.value, view.attempts) == ("pending", 1), second.stderr
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
