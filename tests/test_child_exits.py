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
    state = _State("q", _Owner())  # type: ignore[arg-type]
    # The runner's keeper reaps every child it has: this one is no item's.
    while state.reap() == [] and not state.childless:
        os.sched_yield()
    assert compaction.child.poll() == 0  # subprocess saw ECHILD
    notice = compaction._reap()
    assert notice is not None and "exit 4" in notice


def test_codes_are_taken_once() -> None:
    child_exits.record(12345, 3)
    assert child_exits.take(12345) == 3
    assert child_exits.take(12345) is None
