"""A child reaped by the runner's own keeper keeps its exit code for its owner.

In the guarded shape (run/guard.py) the runner reaps every child it has
(run/local_keeper.py), including one its store started and polls with
``subprocess`` (the background compaction): ``subprocess`` then sees ECHILD
and reports 0, so the real code is kept in core/child_exits.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from statequeue.core import child_exits
from statequeue.run.local_keeper import _State
from statequeue.store.journal.background_compaction import BackgroundCompaction


class _Owner:
    def __init__(self) -> None:
        self.failed: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self.pids: dict[int, int] = {}


def test_a_failed_compaction_child_reaped_by_the_runner_is_still_reported() -> None:
    compaction = BackgroundCompaction()
    compaction.child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])
    child_exits.expect(compaction.child.pid)  # as BackgroundCompaction.start does
    state = _State("q", _Owner())  # type: ignore[arg-type]
    # The runner's keeper reaps every child it has: this one is no item's.
    # Until this child is gone (reaped), not until the process is childless:
    # an earlier test in this process may have left children of its own
    # (multiprocessing's forkserver under make test's workers).
    pid, deadline = compaction.child.pid, time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        state.reap()
        os.sched_yield()
    assert compaction.child.poll() == 0  # subprocess saw ECHILD
    notice = compaction._reap()
    assert notice is not None and "exit 4" in notice


def test_codes_are_taken_once_and_kept_only_for_registered_children() -> None:
    child_exits.record(12345, 3)  # an orphan's: its pid may be reused, so not kept
    assert child_exits.take(12345) is None
    child_exits.expect(12345)
    child_exits.record(12345, 3)
    assert child_exits.take(12345) == 3
    assert child_exits.take(12345) is None


def test_the_runners_own_child_is_no_items_process() -> None:
    # While a compaction child runs, a finished item's claim is still freed.
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        child_exits.expect(own.pid)
        state = _State("q", _Owner())  # type: ignore[arg-type]
        state.held[7] = []
        assert state.attribute([own.pid]) == {}
    finally:
        own.kill()
        own.wait()
        child_exits.take(own.pid)


def test_an_in_process_call_of_the_cli_never_lets_run_fork() -> None:
    # Only the console command's own process may fork (run/guard.py): a
    # caller that runs the CLI in its process (a test) must not be forked.
    import pytest

    from statequeue.cli import process
    from statequeue.cli.main import main

    with pytest.raises(SystemExit):
        main(["help"])
    assert process.OWNS_PROCESS is False
